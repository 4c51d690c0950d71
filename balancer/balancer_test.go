package balancer

import (
	"errors"
	"maps"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

func spec(id string, state State, models ...string) Spec {
	u, _ := url.Parse("http://" + id)
	return Spec{ID: id, URL: u, Engine: "vllm", Models: models, State: state}
}

func ids(bs []*Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.ID
	}
	return out
}

func backend(t *testing.T, b *Balancer, id string) *Backend {
	t.Helper()
	for _, be := range b.Snapshot().Backends {
		if be.ID == id {
			return be
		}
	}
	t.Fatalf("backend %s not in snapshot", id)
	return nil
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
		d, _ := b.Pick(req, dst)
		dst = d.Candidates
	})
	if allocs != 0 && !raceEnabled {
		t.Errorf("Pick allocates %.0f times per call", allocs)
	}
}

func TestLedgerSurvivesUpdateAndStateSinceIsKept(t *testing.T) {
	b := newBal(t, "least-request")
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	b.Update(spec("a", StateReady, "m"))
	g := NewGuard()
	g.Attach(backend(t, b, "a"), Work{}, now)

	now = now.Add(time.Minute)
	b.Update(spec("a", StateReady, "m", "n")) // models change, state does not
	a := backend(t, b, "a")
	if a.Ledger.InFlight() != 1 {
		t.Errorf("in flight after rebuild = %d, want 1", a.Ledger.InFlight())
	}
	if !a.Since.Equal(time.Unix(1000, 0)) {
		t.Errorf("since = %v, want unchanged", a.Since)
	}
	b.Update(spec("a", StateDown, "m"))
	if a := backend(t, b, "a"); !a.Since.Equal(now) {
		t.Errorf("since after state change = %v, want %v", a.Since, now)
	}
	g.Release()
	if n := backend(t, b, "a").Ledger.InFlight(); n != 0 {
		t.Errorf("in flight after release = %d", n)
	}
}

func TestRemoveKeepsInFlightGuardsSafe(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(spec("a", StateReady, "m"))
	a := backend(t, b, "a")
	g := NewGuard()
	g.Attach(a, Work{}, time.Now())
	b.Remove("a")
	if len(b.Snapshot().Backends) != 0 {
		t.Fatal("a still in snapshot")
	}
	g.Release()
	if a.Ledger.InFlight() != 0 {
		t.Errorf("in flight = %d", a.Ledger.InFlight())
	}
	// A backend that comes back starts a fresh ledger.
	b.Update(spec("a", StateReady, "m"))
	if backend(t, b, "a").Ledger == a.Ledger {
		t.Error("re-added backend reuses the removed ledger")
	}
}

func TestGuardMovesAndReleasesOnce(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(spec("a", StateReady, "m"), spec("b", StateReady, "m"))
	a, bb := backend(t, b, "a"), backend(t, b, "b")
	g := NewGuard()
	g.Attach(a, Work{}, time.Now())
	g.Attach(bb, Work{}, time.Now()) // a retry moves the request
	if a.Ledger.InFlight() != 0 || bb.Ledger.InFlight() != 1 {
		t.Fatalf("after move: a=%d b=%d", a.Ledger.InFlight(), bb.Ledger.InFlight())
	}
	if a.Ledger.Total() != 1 || bb.Ledger.Total() != 1 {
		t.Errorf("totals a=%d b=%d, want 1 each", a.Ledger.Total(), bb.Ledger.Total())
	}
	if g.Backend() != bb {
		t.Error("guard not on b")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(g.Release)
	}
	wg.Wait()
	if bb.Ledger.InFlight() != 0 {
		t.Errorf("in flight after concurrent releases = %d, want 0", bb.Ledger.InFlight())
	}
	if d := g.FirstByte(time.Now()); d != 0 {
		t.Errorf("FirstByte on a released guard = %v", d)
	}
}

func TestTTFBMovingAverage(t *testing.T) {
	var l Ledger
	if l.TTFB() != 0 {
		t.Fatal("TTFB before samples")
	}
	l.ObserveTTFB(time.Second)
	if l.TTFB() != time.Second {
		t.Errorf("first sample: %v", l.TTFB())
	}
	l.ObserveTTFB(2 * time.Second)
	if got, want := l.TTFB(), 1200*time.Millisecond; got != want {
		t.Errorf("after 1s, 2s: %v, want %v", got, want)
	}
}

func TestConcurrentPickUpdateAttach(t *testing.T) {
	b := newBal(t, "least-request")
	b.Update(spec("a", StateReady, "m"), spec("b", StateReady, "m"))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			var dst []*Backend
			for range 500 {
				d, err := b.Pick(&Request{Model: "m"}, dst)
				if err != nil {
					continue // a writer may have marked both down for a moment
				}
				dst = d.Candidates
				g := NewGuard()
				g.Attach(d.Candidates[0], Work{}, time.Now())
				g.FirstByte(time.Now())
				g.Release()
			}
		})
		wg.Go(func() {
			for j := range 200 {
				st := StateReady
				if (i+j)%3 == 0 {
					st = StateDown
				}
				b.Update(spec("a", st, "m"))
			}
		})
	}
	wg.Wait()
	for _, be := range b.Snapshot().Backends {
		if be.Ledger.InFlight() != 0 {
			t.Errorf("%s in flight = %d", be.ID, be.Ledger.InFlight())
		}
	}
	if got := backend(t, b, "a").Ledger.Total() + backend(t, b, "b").Ledger.Total(); got == 0 {
		t.Error("no requests counted")
	}
}

func TestStateText(t *testing.T) {
	for s, want := range map[State]string{StateUnknown: "unknown", StateReady: "ready", StateDown: "down", StateDraining: "draining"} {
		if b, _ := s.MarshalText(); string(b) != want {
			t.Errorf("%d: %q, want %q", s, b, want)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// newBal returns a balancer running policy with a real prefix index
// stand-in-free setup: deterministic randomness, the default config.
func newBal(t testing.TB, policy string, mod ...func(*Config, *Deps)) *Balancer {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Policy = policy
	var n atomic.Uint64
	d := Deps{Rand: func() uint64 { return mix(n.Add(1)) }}
	for _, m := range mod {
		m(&cfg, &d)
	}
	if d.Index == nil {
		d.Index = prefix.NewIndex(prefix.DefaultConfig())
	}
	if d.Tree == nil {
		d.Tree = prefix.NewTree(1 << 20)
	}
	b, err := New(cfg, d, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBackendNames: a backend's Name is its configured name, or b1, b2,
// ... in the order backends first appear; a backend that leaves and comes
// back gets its name again, and no other backend ever takes it.
func TestBackendNames(t *testing.T) {
	b := newBal(t, "round-robin")
	named := spec("10.0.0.9:8000", StateReady, "m")
	named.Name = "gpu-a"
	b.Update(spec("10.0.0.1:8000", StateReady, "m"), named, spec("10.0.0.2:8000", StateReady, "m"))
	b.Remove("10.0.0.1:8000")
	b.Update(spec("10.0.0.3:8000", StateReady, "m"))
	b.Update(spec("10.0.0.1:8000", StateReady, "m"))
	want := map[string]string{
		"10.0.0.1:8000": "b1",
		"10.0.0.2:8000": "b2",
		"10.0.0.3:8000": "b3",
		"10.0.0.9:8000": "gpu-a",
	}
	got := map[string]string{}
	for _, be := range b.Snapshot().Backends {
		got[be.ID] = be.Name
	}
	if !maps.Equal(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
}
