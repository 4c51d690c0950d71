package proxy

import (
	"testing"

	"github.com/llmlb/llmlb/proxy/stream"
)

// TestPickLogEstimates: the status page's est/obs and est/rep are the sums
// of the picks' estimates over the sums of what came, per backend; "-"
// before anything came.
func TestPickLogEstimates(t *testing.T) {
	p := newPickLog()
	if ttft, cached := p.estimates("a"); ttft != "-" || cached != "-" {
		t.Errorf("nothing yet: %q, %q", ttft, cached)
	}
	add := func(backend string, est estimates) { p.add(pickEntry{Backend: backend}, stream.Usage{}, est) }
	add("a", estimates{ttft: true, sums: [4]float64{0.1, 0.2}})
	add("a", estimates{ttft: true, sums: [4]float64{0.2, 0.2}})
	add("a", estimates{cached: true, sums: [4]float64{2: 900, 3: 1000}})
	add("b", estimates{cached: true, sums: [4]float64{2: 10, 3: 0}})
	if ttft, cached := p.estimates("a"); ttft != "0.75" || cached != "0.90" {
		t.Errorf("a: %q, %q; want 0.75 and 0.90", ttft, cached)
	}
	if ttft, cached := p.estimates("b"); ttft != "-" || cached != "-" {
		t.Errorf("b (nothing reported cached): %q, %q", ttft, cached)
	}
}
