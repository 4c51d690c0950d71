package balancer

import "fmt"

// Role is the part of a disaggregated prefill/decode (P/D) fleet a backend
// plays: it prefills prompts and hands their KV cache on, decodes prompts
// prefilled elsewhere, or does both, as every server of an aggregated
// fleet does. The zero value is [RoleBoth], so a fleet that declares no
// roles routes as it always did.
type Role int

const (
	// RoleBoth is a backend that prefills and decodes (the default).
	RoleBoth Role = iota
	// RolePrefill is a backend that only prefills (vLLM's kv_producer side
	// of a KV connector, SGLang's --disaggregation-mode prefill): it takes
	// only the prefill leg of a P/D request.
	RolePrefill
	// RoleDecode is a backend that decodes what a prefill server computed
	// (SGLang's --disaggregation-mode decode); it also takes requests too
	// short to be worth a prefill leg, and prefills those itself.
	RoleDecode
)

var roleNames = [...]string{RoleBoth: "both", RolePrefill: "prefill", RoleDecode: "decode"}

// String returns the role's name as config.yaml writes it.
func (r Role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return fmt.Sprintf("role(%d)", int(r))
	}
	return roleNames[r]
}

// MarshalText writes r as its name.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a name MarshalText wrote.
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	*r = v
	return err
}

// ParseRole reads a role's name; "" is [RoleBoth].
func ParseRole(s string) (Role, error) {
	if s == "" {
		return RoleBoth, nil
	}
	for r, n := range roleNames {
		if n == s {
			return Role(r), nil
		}
	}
	return RoleBoth, fmt.Errorf("unknown role %q (known: prefill, decode, both)", s)
}

// takes reports whether a backend of role r may take a pick that asks for
// role want. A prefill pick needs a backend that prefills; any other pick
// (a decode leg, or a whole request answered by one backend) needs one
// that decodes, so a prefill-only server never answers a client itself.
func (r Role) takes(want Role) bool {
	if want == RolePrefill {
		return r != RoleDecode
	}
	return r != RolePrefill
}

// PDConfig is `balancer.pd:`, when a request on a fleet with prefill
// servers is split into a prefill leg and a decode leg.
type PDConfig struct {
	// MinUncachedTokens is the fewest prompt tokens the chosen decode
	// server lacks in its prefix cache for a request to take a prefill
	// leg; shorter or mostly cached prompts are prefilled by the decode
	// server itself, where a KV transfer would cost more than it saves.
	// 0 splits every request. The default, 256, is vLLM router's
	// pd_uncached_token_threshold ([PDDecisions]). (default 256)
	MinUncachedTokens int `mapstructure:"min_uncached_tokens"`
	// MinUncachedRatio, when above 0, also splits a request whose decode
	// server lacks at least this share of its prompt, however few tokens
	// that is: Dynamo's conditional disaggregation, with 2048 tokens and
	// 0.7 ([PDDecisions]). (default 0: off)
	MinUncachedRatio float64 `mapstructure:"min_uncached_ratio"`
}

// Split reports whether a request of prompt tokens, picked onto decode,
// which lacks uncached of them, takes a prefill leg on another server:
// when it lacks at least MinUncachedTokens, or at least MinUncachedRatio
// of the prompt. must reports that it cannot be answered in one leg: an
// SGLang server of role decode refuses a request without a bootstrap
// room ("Disaggregated request received without bootstrap room id",
// sgl-project/sglang as quoted in volcano-sh/kthena #865).
func (c PDConfig) Split(decode *Backend, uncached, prompt int) (split, must bool) {
	must = decode.Engine == "sglang" && decode.Role == RoleDecode
	ratio := c.MinUncachedRatio > 0 && float64(uncached) >= c.MinUncachedRatio*float64(max(prompt, 1))
	return must || uncached >= c.MinUncachedTokens || ratio, must
}

// PDDecision is a peer's rule for when a request takes a prefill leg, as
// the [PDConfig] that runs it here.
type PDDecision struct {
	Name    string
	Config  PDConfig
	Follows string // the peer's code or configuration, at a commit
}

// PDDecisions lists the peers' P/D decisions, which `llmlb bench --prefill`
// compares. Each decides on the decode server picked first, as llmlb
// does, except that SGLang's gateway picks both servers independently and
// splits every request; vLLM router's pd mode splits every request too
// (the threshold is in its docs, not yet in its two-stage path).
func PDDecisions() []PDDecision {
	return []PDDecision{
		{Name: "always", Config: PDConfig{},
			Follows: "sgl-project/sglang sgl-model-gateway/src/routers/http/pd_router/selection.rs @ 03744dbe (a pair for every request); vllm-project/router src/routers/http/vllm_pd_router.rs @ 9da0ea11"},
		{Name: "llm-d", Config: PDConfig{MinUncachedTokens: 16},
			Follows: "llm-d/llm-d-inference-scheduler deploy/config/pd-epp-config.yaml @ 520af478 (nonCachedTokens: 16; the rule in pkg/epp/framework/plugins/scheduling/profilehandler/disagg/prefix_based_pd_decider.go)"},
		{Name: "vllm-router", Config: PDConfig{MinUncachedTokens: 256},
			Follows: "vllm-project/router docs/kv_events_pd_routing.md @ dda6063b (--pd-uncached-token-threshold 256)"},
		{Name: "dynamo", Config: PDConfig{MinUncachedTokens: 2048, MinUncachedRatio: 0.7},
			Follows: "ai-dynamo/dynamo lib/kv-router/src/conditional_disagg.rs @ 48bbf30c (isl_bounding: local when the effective input is under 2048 tokens and under 0.7 of the prompt)"},
	}
}

// Disaggregated reports whether a backend serving model has a declared
// role (prefill or decode): only then may a request take a prefill leg.
// A fleet of [RoleBoth] backends answers every request in one leg, as
// before roles existed.
func (s *Snapshot) Disaggregated(model string) bool {
	for _, be := range s.Backends {
		if be.Role != RoleBoth && be.Serves(model) {
			return true
		}
	}
	return false
}
