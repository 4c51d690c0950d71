package balancer

import (
	"strings"
	"testing"
)

func TestParseRulesNamesOneBitEach(t *testing.T) {
	var all Rules
	for _, name := range RuleNames() {
		r, err := ParseRules(name)
		if err != nil {
			t.Fatalf("ParseRules(%q): %v", name, err)
		}
		if r == 0 || r&(r-1) != 0 || all.has(r) {
			t.Errorf("ParseRules(%q) = %b, want a bit of its own", name, r)
		}
		all |= r
	}
	if r, err := ParseRules("miss+decode"); err != nil || r != ruleMiss|ruleDecode {
		t.Errorf("ParseRules(miss+decode) = %b, %v, want %b", r, err, ruleMiss|ruleDecode)
	}
	for _, bad := range []string{"", "nope", "miss+"} {
		if _, err := ParseRules(bad); err == nil {
			t.Errorf("ParseRules(%q) = nil error, want one", bad)
		}
	}
	if got := DefaultConfig().Without(0); got != DefaultConfig() {
		t.Errorf("Without(0) changed the config: %+v", got)
	}
}

// The miss cost's least term acts only on a prompt longer than a step
// with every candidate queued, which the benchmark's workloads do not
// send; this shows the switch reaches it.
func TestWithoutMissLeastDropsTheTerm(t *testing.T) {
	miss := func(off Rules) float64 {
		t.Helper()
		b := newBal(t, "ttft", func(c *Config, _ *Deps) { *c = c.Without(off) })
		b.Update(busy("a", 2, 4, 0.1), busy("b", 3, 4, 0.1))
		p := []byte(strings.Repeat("x", 4*20000))
		ex := b.Explain(&Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100})
		return ex.Backends[0].MissCost
	}
	on, off := miss(0), miss(ruleMissLeast)
	// (uncached − step) × least = (20000 − 8192) × 2 tokens at 10,000 a second.
	if want := 11808.0 * 2 / 10000; on-off < want*0.99 || on-off > want*1.01 {
		t.Errorf("miss cost %g with the least term, %g without; want them %g apart", on, off, want)
	}
}
