package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// Perturb is a change to the emulated engines the balancer is not told
// of. Each factor multiplies; 0 means 1.
type Perturb struct {
	// Prefill scales the prefill costs (per token and attention): a
	// miss dearer or cheaper than the balancer learned at first.
	Prefill float64
	// Request scales the per-request intake (parsing, tokenising,
	// scheduling) a cache hit does not remove.
	Request float64
	// Decode scales the costs every step pays, a decoded token's: the
	// step's own, each sequence's and each context token's.
	Decode float64
	// Tokens scales the prompt tokens the balancer is told, as a tokenizer
	// other than the engine's would count them.
	Tokens float64
	// Tokenizer is the bytes of prompt text one token of the engines'
	// tokenizer reads (0: 4, the workloads' own rate, or llm-d-sim's
	// [LLMDSimTokenizer]). The engines count and cache prompts at that
	// rate while the balancer is told the proxy's estimate, 4 bytes a
	// token, and learns the rate from the answers' usage.
	Tokenizer float64
}

// tokenizer returns the engines' bytes per token.
func (p Perturb) tokenizer() float64 {
	if p.Tokenizer <= 0 {
		return sim.BytesPerToken
	}
	return p.Tokenizer
}

// engineTokens is what the engines' tokenizer counts in a prompt the
// workload sized at n tokens of 4 bytes.
func (p Perturb) engineTokens(n int) int {
	return max(1, int(float64(n*sim.BytesPerToken)/p.tokenizer()))
}

func factor(f float64) float64 {
	if f <= 0 {
		return 1
	}
	return f
}

func scale(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * factor(f)) }

func (p Perturb) apply(c sim.Cost) sim.Cost {
	c.PrefillToken = scale(c.PrefillToken, p.Prefill)
	c.Attention = scale(c.Attention, p.Prefill)
	c.Request = scale(c.Request, p.Request)
	c.RequestToken = scale(c.RequestToken, p.Request)
	c.Step = scale(c.Step, p.Decode)
	c.Sequence = scale(c.Sequence, p.Decode)
	c.ContextToken = scale(c.ContextToken, p.Decode)
	return c
}

// applyLLMD perturbs an llm-d-sim engine's costs: Prefill scales its
// prefill time a token, Request its prefill overhead, the part of a
// request's work a cache hit does not remove, Decode its time between
// tokens.
func (p Perturb) applyLLMD(c sim.LLMDSimConfig) sim.LLMDSimConfig {
	c.PrefillTimePerToken = scale(c.PrefillTimePerToken, p.Prefill)
	c.PrefillOverhead = scale(c.PrefillOverhead, p.Request)
	c.InterTokenLatency = scale(c.InterTokenLatency, p.Decode)
	return c
}

func (p Perturb) tokens(n int) int { return max(1, int(math.Round(float64(n)*factor(p.Tokens)))) }

// String names the perturbation as --perturb takes it; "" when none.
func (p Perturb) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		v    float64
	}{{"prefill", p.Prefill}, {"request", p.Request}, {"decode", p.Decode}, {"tokens", p.Tokens}, {"tokenizer", p.Tokenizer}} {
		if f.name == "tokenizer" && f.v > 0 && f.v != sim.BytesPerToken || f.name != "tokenizer" && factor(f.v) != 1 {
			parts = append(parts, fmt.Sprintf("%s=%g", f.name, f.v))
		}
	}
	return strings.Join(parts, ",")
}

// ParsePerturb reads "prefill=2,request=0.5,tokens=0.6,tokenizer=7".
func ParsePerturb(s string) (Perturb, error) {
	var p Perturb
	if s == "" {
		return p, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || !(f > 0) || math.IsInf(f, 0) { // NaN too
			return p, fmt.Errorf("bench: --perturb %q: want name=factor with a positive factor, as prefill=2", kv)
		}
		switch k {
		case "prefill":
			p.Prefill = f
		case "request":
			p.Request = f
		case "decode":
			p.Decode = f
		case "tokens":
			p.Tokens = f
		case "tokenizer":
			if f < 1 || f > 16 {
				return p, fmt.Errorf("bench: --perturb %q: the tokenizer's bytes a token is from 1 to 16", kv)
			}
			p.Tokenizer = f
		default:
			return p, fmt.Errorf("bench: --perturb: unknown cost %q (have prefill, request, decode, tokens, tokenizer)", k)
		}
	}
	return p, nil
}
