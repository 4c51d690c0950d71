package balancer

import (
	"fmt"
	"testing"
	"time"
)

func TestConsistentHashIsStickyAndBounded(t *testing.T) {
	b := newBal(t, "consistent-hash")
	var specs []Spec
	for _, id := range []string{"a", "b", "c", "d"} {
		specs = append(specs, ready(id, 0, 0, 0))
	}
	b.Update(specs...)
	home := map[int]string{}
	for i := range 100 {
		d := mustPick(t, b, &Request{Model: "m", Prompt: fmt.Appendf(nil, "prompt %d", i)}, nil)
		home[i] = d.Candidates[0].ID
	}
	// Removing one backend moves only its keys.
	b.Remove("d")
	moved := 0
	for i := range 100 {
		d := mustPick(t, b, &Request{Model: "m", Prompt: fmt.Appendf(nil, "prompt %d", i)}, nil)
		if home[i] != "d" && d.Candidates[0].ID != home[i] {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d keys not on the removed backend moved", moved)
	}
	// Bounded load: with 3 in flight on the key's home (bound 1.25 × 4 / 3
	// = 1.67), the key walks on.
	req := &Request{Model: "m", Prompt: []byte("prompt 1")}
	d := mustPick(t, b, req, nil)
	h := d.Candidates[0]
	for range 3 {
		g := NewGuard()
		g.Attach(h, Work{}, time.Now())
		defer g.Release()
	}
	if d := mustPick(t, b, req, nil); d.Candidates[0] == h {
		t.Errorf("overloaded home %s still chosen", h.ID)
	}
}
