package balancer

import (
	"fmt"
	"maps"
	"math"
	"net/url"
	"strings"
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

// ready returns a ready backend spec serving "m" with a fresh reading.
func ready(id string, q, running, kv float64) Spec {
	s := spec(id, StateReady, "m")
	s.Metrics = Metrics{Queued: Known(q), Running: Known(running), KVUsage: Known(kv), At: time.Now()}
	return s
}

// pickScores runs scorer over the candidates of b for req and returns
// the scores by backend ID.
func pickScores(t *testing.T, b *Balancer, sc Scorer, req *Request) map[string]float64 {
	t.Helper()
	s := &scratch{}
	snap := b.Snapshot()
	p := &PickInfo{Req: req, snap: snap}
	for _, be := range snap.Backends {
		p.Cands = b.appendCandidate(p.Cands, be, req, time.Now())
	}
	b.hashPrompt(s, p)
	b.applyMatch(s, p)
	out := make([]float64, len(p.Cands))
	sc.Score(p, out)
	got := map[string]float64{}
	for i, c := range p.Cands {
		got[c.Backend.ID] = out[i]
	}
	return got
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// busy returns a ready backend spec with a full view of its load and
// capacity: q waiting, running requests, KV use kv of 100,000 tokens.
func busy(id string, q, running, kv float64) Spec {
	s := ready(id, q, running, kv)
	s.Metrics.BlockSize, s.Metrics.NumBlocks = Known(16), Known(6250)
	return s
}

// smallKV is busy(id, 0, 0, 0) with a smaller KV cache (32,000 tokens):
// another hardware class.
func smallKV(id string) Spec {
	s := busy(id, 0, 0, 0)
	s.Metrics.NumBlocks = Known(2000)
	return s
}

// learnRate teaches b that backend id prefills rate tokens/s after a 20 ms
// base, from 50 first tokens.
func learnRate(t *testing.T, b *Balancer, id string, rate float64) {
	t.Helper()
	for i := range 50 {
		work := float64(1000 + 200*(i%20))
		backend(t, b, id).Ledger.est.observe(work, 0, 0.02+work/rate, 1/b.cfg.TTFT.PrefillRate, 0.02)
	}
}

// distinct returns the i-th of many prompts that share nothing.
func distinct(i, tokens int) *Request {
	p := fmt.Appendf(nil, "tenant request %d ", i)
	p = append(p, strings.Repeat("d", tokens*4-len(p))...)
	return &Request{Model: "m", Prompt: p, PromptTokens: tokens, MaxTokens: 100}
}

// pickHeld picks req with a guard attached and never released, as
// concurrent requests that have not answered yet, and returns the
// primary's ID.
func pickHeld(t *testing.T, b *Balancer, req *Request) string {
	t.Helper()
	req.Guard = b.NewGuard()
	d, err := b.Pick(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(req.Guard.Release)
	return d.Candidates[0].ID
}

// spread picks n requests, each held in flight, on a fleet of four and
// fails if any backend took over 1.5x its fair share.
func spread(t *testing.T, b *Balancer, n int, req func(int) *Request) {
	t.Helper()
	count := map[string]int{}
	for i := range n {
		count[pickHeld(t, b, req(i))]++
	}
	for id, c := range count {
		if c > n*3/8 {
			t.Errorf("%s took %d of %d concurrent requests, over 1.5x its fair share of %d (%v)", id, c, n, n/4, count)
		}
	}
}
