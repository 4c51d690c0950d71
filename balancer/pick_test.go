package balancer

import (
	"errors"
	"net/url"
	"slices"
	"testing"
	"time"
)

func TestSessionAffinityUnlessSaturated(t *testing.T) {
	b := newBal(t, "round-robin", func(c *Config, _ *Deps) { c.Session.Header = "X-Session" })
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	req := &Request{Model: "m", Session: "s1"}
	d := mustPick(t, b, req, nil)
	home := d.Candidates[0].ID
	for range 5 {
		if d := mustPick(t, b, req, nil); d.Candidates[0].ID != home || d.Reason != "affinity" {
			t.Fatalf("session moved to %s (%s), want %s affinity", d.Candidates[0].ID, d.Reason, home)
		}
	}
	b.Update(ready(home, 50, 0, 0)) // saturated
	if d := mustPick(t, b, req, nil); d.Candidates[0].ID == home {
		t.Errorf("session stayed on saturated %s", home)
	}
}

// The fleet's home for a session, found by the caller, goes before this
// balancer's own table; a saturated home is left as a local one is.
func TestSessionHomeOfTheFleetGoesFirst(t *testing.T) {
	b := newBal(t, "round-robin", func(c *Config, _ *Deps) { c.Session.Header = "X-Session" })
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	local := mustPick(t, b, &Request{Model: "m", Session: "s1"}, nil).Candidates[0].ID
	home := "a"
	if local == "a" {
		home = "b"
	}
	for range 3 {
		if d := mustPick(t, b, &Request{Model: "m", Session: "s1", SessionHome: home}, nil); d.Candidates[0].ID != home || d.Reason != "affinity" {
			t.Fatalf("fleet's home %s: went to %s (%s)", home, d.Candidates[0].ID, d.Reason)
		}
	}
	b.Update(ready(home, 50, 0, 0))
	if d := mustPick(t, b, &Request{Model: "m", Session: "s1", SessionHome: home}, nil); d.Reason == "affinity" {
		t.Errorf("session kept to saturated home %s: went to %s (%s)", home, d.Candidates[0].ID, d.Reason)
	}
}

// TestFallbacksFollowTheScores: a pick's candidates are the primary, then
// the rest by total score, highest first, ties in snapshot order, none
// twice; with one candidate fewer than MaxCandidates, all of them.
func TestFallbacksFollowTheScores(t *testing.T) {
	four := func(c *Config, _ *Deps) { c.MaxCandidates = 4 }
	// Round-robin does not score: every total ties, so the fallbacks are
	// the others in snapshot order.
	rr := newBal(t, "round-robin", four)
	rr.Update(ready("b0", 0, 0, 0), ready("b1", 0, 0, 0), ready("b2", 0, 0, 0), ready("b3", 0, 0, 0), ready("b4", 0, 0, 0))
	for range 3 {
		ex := rr.Explain(&Request{Model: "m"})
		if _, err := rr.Pick(&Request{Model: "m"}, nil); err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, id := range []string{"b0", "b1", "b2", "b3", "b4"} {
			if id != ex.Chosen[0] && len(want) < 3 {
				want = append(want, id)
			}
		}
		if !slices.Equal(ex.Chosen[1:], want) {
			t.Errorf("round-robin: candidates %v, want %s then %v", ex.Chosen, ex.Chosen[0], want)
		}
	}
	// The default scores by queue: the fallbacks go by score.
	def := newBal(t, DefaultConfig().Policy, four)
	def.Update(ready("b0", 6, 2, 0.3), ready("b1", 1, 2, 0.3), ready("b2", 9, 2, 0.3), ready("b3", 3, 2, 0.3), ready("b4", 3, 2, 0.3))
	ex := def.Explain(&Request{Model: "m", PromptTokens: 500})
	score := map[string]float64{}
	for _, bd := range ex.Backends {
		score[bd.ID] = bd.Score
	}
	if len(ex.Chosen) != 4 {
		t.Fatalf("candidates %v, want 4", ex.Chosen)
	}
	seen := map[string]bool{}
	for i, id := range ex.Chosen {
		if seen[id] {
			t.Fatalf("%s twice in %v", id, ex.Chosen)
		}
		seen[id] = true
		if i > 1 && score[id] > score[ex.Chosen[i-1]] {
			t.Errorf("candidates %v out of score order: %v", ex.Chosen, score)
		}
	}
	if ex.Chosen[1] != "b3" || ex.Chosen[2] != "b4" {
		t.Errorf("candidates %v: after the primary b1, want the equal queues b3 then b4 (snapshot order); scores %v", ex.Chosen, score)
	}
	// Fewer candidates than MaxCandidates: all of them.
	two := newBal(t, "round-robin", four)
	two.Update(ready("b0", 0, 0, 0), ready("b1", 0, 0, 0))
	if ex := two.Explain(&Request{Model: "m"}); len(ex.Chosen) != 2 || ex.Chosen[0] == ex.Chosen[1] {
		t.Errorf("two backends: candidates %v", ex.Chosen)
	}
}

func TestPickOrdersByInFlightThenTotal(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(spec("a", StateReady, "m"), spec("b", StateReady, "m"), spec("c", StateReady, "m"))
	ga, gb := NewGuard(), NewGuard()
	ga.Attach(backend(t, b, "a"), Work{}, time.Now())
	gb.Attach(backend(t, b, "b"), Work{}, time.Now())
	gb.Release() // b: 0 in flight, 1 served; c: 0 in flight, 0 served

	d, err := b.Pick(&Request{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(d.Candidates), []string{"c", "b", "a"}; !equal(got, want) {
		t.Errorf("candidates = %v, want %v", got, want)
	}
	if d.Reason != "least-load" {
		t.Errorf("reason = %q", d.Reason)
	}
	ga.Release()
}

func TestPickSkipsBackendsThatCannotServe(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(
		spec("down", StateDown, "m"),
		spec("draining", StateDraining, "m"),
		spec("other", StateReady, "n"),
		spec("up", StateReady, "m"),
		spec("unknown", StateUnknown, "m"),
	)
	d, err := b.Pick(&Request{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(d.Candidates); !equal(got, []string{"up"}) {
		t.Errorf("candidates = %v, want [up]", got)
	}

	// With no ready backend, those whose health is not known yet are tried.
	b.Update(spec("up", StateDown, "m"))
	d, err = b.Pick(&Request{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(d.Candidates); !equal(got, []string{"unknown"}) || d.Reason != "fallback" {
		t.Errorf("candidates = %v reason %q, want [unknown] fallback", got, d.Reason)
	}

	b.Update(spec("unknown", StateDown, "m"))
	if _, err := b.Pick(&Request{Model: "m"}, nil); !errors.Is(err, ErrNoBackend) {
		t.Errorf("all down: err = %v, want ErrNoBackend", err)
	}
}

func TestPickUnknownModel(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(spec("a", StateReady, "m"))
	if _, err := b.Pick(&Request{Model: "nope"}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("err = %v, want ErrUnknownModel", err)
	}
	// While some backend's model list is not known yet, the model may exist.
	b.Update(Spec{ID: "b", URL: &url.URL{Scheme: "http", Host: "b"}, State: StateReady})
	if _, err := b.Pick(&Request{Model: "nope"}, nil); !errors.Is(err, ErrNoBackend) {
		t.Errorf("err = %v, want ErrNoBackend while b's models are unknown", err)
	}
	// Down with its models never learned, b may still be the model's only
	// server: a 404 would be a guess that clients take as final.
	b.Update(Spec{ID: "b", URL: &url.URL{Scheme: "http", Host: "b"}, State: StateDown})
	if _, err := b.Pick(&Request{Model: "nope"}, nil); !errors.Is(err, ErrNoBackend) {
		t.Errorf("err = %v, want ErrNoBackend while b is down with its models unknown", err)
	}
	// Draining, b is on its way out and says nothing of the model.
	b.Update(Spec{ID: "b", URL: &url.URL{Scheme: "http", Host: "b"}, State: StateDraining})
	if _, err := b.Pick(&Request{Model: "nope"}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("err = %v, want ErrUnknownModel when b is draining", err)
	}
}

// TestPickModelOnceOfferedIs503: a model whose only backend is gone (DNS
// dropped it, a reload removed it) or no longer lists it answers
// ErrNoBackend, not ErrUnknownModel; a name never offered stays unknown.
func TestPickModelOnceOfferedIs503(t *testing.T) {
	b := newBal(t, "least-request")
	lora := spec("a", StateReady, "m")
	lora.Adapters = []Adapter{{Name: "sql-lora", Parent: "m"}}
	b.Update(lora, spec("b", StateReady, "n"))
	b.Remove("a")
	b.Update(spec("b", StateReady, "n", "o"))
	tests := []struct {
		model string
		want  error
	}{
		{"m", ErrNoBackend},
		{"sql-lora", ErrNoBackend},
		{"nope", ErrUnknownModel},
	}
	for _, tc := range tests {
		if _, err := b.Pick(&Request{Model: tc.model}, nil); !errors.Is(err, tc.want) {
			t.Errorf("Pick(%q) err = %v, want %v", tc.model, err, tc.want)
		}
	}
	if _, err := b.Pick(&Request{Model: "o"}, nil); err != nil {
		t.Errorf("Pick(o) err = %v, want a pick", err)
	}
	// With no backend at all, nothing is known either way.
	b.Remove("b")
	if _, err := b.Pick(&Request{Model: "nope"}, nil); !errors.Is(err, ErrNoBackend) {
		t.Errorf("no backends: err = %v, want ErrNoBackend", err)
	}
}

func TestPickServesAdapters(t *testing.T) {
	b := newBal(t, "least-request")
	s := spec("a", StateReady, "base")
	s.Adapters = []Adapter{{Name: "sql-lora", Parent: "base"}}
	b.Update(s)
	d, err := b.Pick(&Request{Model: "sql-lora"}, nil)
	if err != nil || len(d.Candidates) != 1 {
		t.Fatalf("pick adapter: %v %v", ids(d.Candidates), err)
	}
}

func TestPickReusesDst(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(spec("a", StateReady, "m"), spec("b", StateReady, "m"))
	dst := make([]*Backend, 0, 8)
	req := &Request{Model: "m"}
	allocs := testing.AllocsPerRun(100, func() {
		d := mustPick(t, b, req, dst)
		dst = d.Candidates
	})
	if allocs != 0 && !raceEnabled {
		t.Errorf("Pick allocates %.0f times per call", allocs)
	}
}

// mustPick is b.Pick for a test that expects a decision: an error fails
// the test with it, rather than a panic on an empty decision.
func mustPick(t testing.TB, b *Balancer, req *Request, dst []*Backend) Decision {
	t.Helper()
	d, err := b.Pick(req, dst)
	if err != nil {
		t.Fatalf("Pick(%q) = %v", req.Model, err)
	}
	return d
}
