package proxy

import "testing"

// TestPickLogEstimates: the status page's est/obs and est/rep are the sums
// of the picks' estimates over the sums of what came, per backend; "-"
// before anything came.
func TestPickLogEstimates(t *testing.T) {
	p := newPickLog()
	if ttft, cached := p.estimates("a"); ttft != "-" || cached != "-" {
		t.Errorf("nothing yet: %q, %q", ttft, cached)
	}
	p.estimated("a", 0, 0.1, 0.2)
	p.estimated("a", 0, 0.2, 0.2)
	p.estimated("a", 2, 900, 1000)
	p.estimated("b", 2, 10, 0)
	if ttft, cached := p.estimates("a"); ttft != "0.75" || cached != "0.90" {
		t.Errorf("a: %q, %q; want 0.75 and 0.90", ttft, cached)
	}
	if ttft, cached := p.estimates("b"); ttft != "-" || cached != "-" {
		t.Errorf("b (nothing reported cached): %q, %q", ttft, cached)
	}
}
