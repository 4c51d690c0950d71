package balancer

import (
	"strings"
	"testing"
	"time"
)

func TestSimplePresets(t *testing.T) {
	t.Run("round-robin", func(t *testing.T) {
		b := newBal(t, "round-robin")
		b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
		var got []string
		for range 6 {
			d := mustPick(t, b, &Request{Model: "m"}, nil)
			got = append(got, d.Candidates[0].ID)
		}
		if s := strings.Join(got, ""); s != "abcabc" {
			t.Errorf("round-robin order %s, want abcabc", s)
		}
	})
	t.Run("least-request", func(t *testing.T) {
		b := newBal(t, "least-request")
		b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0))
		g := NewGuard()
		g.Attach(backend(t, b, "a"), Work{}, time.Now())
		defer g.Release()
		if d := mustPick(t, b, &Request{Model: "m"}, nil); d.Candidates[0].ID != "b" {
			t.Errorf("least-request picked %s, want b", d.Candidates[0].ID)
		}
	})
	t.Run("power-of-two", func(t *testing.T) {
		b := newBal(t, "power-of-two")
		b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
		g := NewGuard()
		g.Attach(backend(t, b, "a"), Work{}, time.Now())
		defer g.Release()
		count := map[string]int{}
		for range 300 {
			d := mustPick(t, b, &Request{Model: "m"}, nil)
			count[d.Candidates[0].ID]++
		}
		// a loses every draw it is in: only b and c are chosen.
		if count["a"] != 0 || count["b"] < 100 || count["c"] < 100 {
			t.Errorf("power-of-two choices %v, want a never, b and c about half each", count)
		}
	})
	t.Run("random one backend", func(t *testing.T) {
		b := newBal(t, "random")
		b.Update(ready("a", 0, 0, 0))
		if d, err := b.Pick(&Request{Model: "m"}, nil); err != nil || d.Candidates[0].ID != "a" {
			t.Errorf("random over one: %v %v", d.Candidates, err)
		}
	})
}
