package balancer

import "testing"

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
