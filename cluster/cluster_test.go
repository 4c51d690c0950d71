package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/redistest"
)

// replica starts a Cluster on the Redis at addr in front of bal (nil: no
// load shared) and waits until it is up.
func replica(t *testing.T, addr string, bal *balancer.Balancer, mod ...func(*Config)) *Cluster {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Redis.Address = addr
	cfg.Redis.Timeout = 200 * time.Millisecond // a loaded CI machine
	cfg.ShareLoad = bal != nil
	for _, m := range mod {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := New(cfg, Files{}, bal, prometheus.NewRegistry(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "replica up", c.Up)
	return c
}

// waitUntil polls cond, which a live Redis and real time settle, for at
// most 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// Three replicas admit what one limit allows, whichever replica each
// request reaches: 60 requests at 30 a minute, 30 admitted (31 if a
// second's refill lands meanwhile), each refusal saying how long to wait.
func TestRequestLimitIsTheFleets(t *testing.T) {
	r := redistest.Start(t)
	reps := []*Cluster{replica(t, r.Addr, nil), replica(t, r.Addr, nil), replica(t, r.Addr, nil)}
	admitted := 0
	for i := range 60 {
		v, _, err := reps[i%3].Admit(t.Context(), "alpha", Limits{Requests: 30}, 10, "")
		if err != nil {
			t.Fatal(err)
		}
		switch v.Refused {
		case "":
			admitted++
		case "requests":
			if v.Wait <= 0 || v.Wait > 2*time.Second {
				t.Errorf("refused with a wait of %s, want up to the 2s a request takes to come back", v.Wait)
			}
		default:
			t.Fatalf("refused for %q", v.Refused)
		}
	}
	if admitted < 30 || admitted > 31 {
		t.Errorf("admitted %d of 60 at 30 a minute over three replicas, want 30 or 31", admitted)
	}
	// Another key has its own allowance.
	if v, _, _ := reps[0].Admit(t.Context(), "bravo", Limits{Requests: 30}, 10, ""); v.Refused != "" {
		t.Errorf("another key refused: %+v", v)
	}
}

// Tokens: each request's estimate is taken at admission, and the charge
// that settles it with the usage reported gives back what was not used.
func TestTokenLimitSettlesWithUsage(t *testing.T) {
	r := redistest.Start(t)
	a, b := replica(t, r.Addr, nil), replica(t, r.Addr, nil)
	lim := Limits{Tokens: 1000}
	for i := range 10 {
		if v, _, err := []*Cluster{a, b}[i%2].Admit(t.Context(), "alpha", lim, 100, ""); err != nil || v.Refused != "" {
			t.Fatalf("request %d of 100 tokens under 1,000: %+v, %v", i, v, err)
		}
	}
	v, _, err := a.Admit(t.Context(), "alpha", lim, 100, "")
	if err != nil || v.Refused != "tokens" {
		t.Fatalf("the eleventh 100 tokens: %+v, %v; want refused for tokens", v, err)
	}
	// The answers used 50 tokens each: 500 come back.
	for range 10 {
		b.Charge("alpha", lim, -50)
	}
	waitUntil(t, "charges written", func() bool {
		v, _, err := a.Admit(t.Context(), "alpha", Limits{Tokens: 1000}, 400, "")
		return err == nil && v.Refused == ""
	})
}

// A session's home set through one replica is found through another.
func TestSessionHomeIsTheFleets(t *testing.T) {
	r := redistest.Start(t)
	a, b := replica(t, r.Addr, nil), replica(t, r.Addr, nil)
	if _, home, err := b.Admit(t.Context(), "", Limits{}, 0, "s-1"); err != nil || home != "" {
		t.Fatalf("unknown session: %q, %v", home, err)
	}
	a.SetHome("s-1", "gpu-3")
	waitUntil(t, "home written", func() bool {
		_, home, err := b.Admit(t.Context(), "", Limits{}, 0, "s-1")
		return err == nil && home == "gpu-3"
	})
	ttl, err := r.Do("PTTL", a.sessionKey("s-1"))
	if err != nil || !strings.HasPrefix(ttl, ":") || ttl == ":-1" || ttl == ":-2" {
		t.Errorf("session key's TTL: %q, %v; want one set", ttl, err)
	}
}

// Redis killed: calls fail within the timeout, then at once, each replica
// says it is alone (llmlb_cluster_up 0), and nothing waits; restarted
// (empty), the replicas rejoin by themselves and the limit is the fleet's
// again.
func TestRedisDownAndBack(t *testing.T) {
	r := redistest.Start(t)
	a, b := replica(t, r.Addr, nil), replica(t, r.Addr, nil)
	r.Kill()
	if _, _, err := a.Admit(t.Context(), "alpha", Limits{Requests: 30}, 1, ""); !errors.Is(err, ErrDown) {
		t.Fatalf("Admit with Redis killed: %v, want ErrDown", err)
	}
	// The call failed, or a ping took the state down just before it.
	failedCalls := func() float64 {
		n := 0.0
		for _, op := range []string{opLimit, opSession, opPing} {
			n += testutil.ToFloat64(a.m.errors.WithLabelValues(op))
		}
		return n
	}
	if a.Up() || testutil.ToFloat64(a.m.up) != 0 || failedCalls() < 1 {
		t.Errorf("after Redis was killed: up %v, llmlb_cluster_up %v, failed calls %v", a.Up(), testutil.ToFloat64(a.m.up), failedCalls())
	}
	// While down, a call does not try Redis: it returns at once, and no
	// failure is counted for it.
	requestPath := func() float64 {
		return testutil.ToFloat64(a.m.errors.WithLabelValues(opLimit)) + testutil.ToFloat64(a.m.errors.WithLabelValues(opSession))
	}
	before := requestPath()
	if _, _, err := a.Admit(t.Context(), "", Limits{}, 0, "s-1"); !errors.Is(err, ErrDown) {
		t.Errorf("Admit of a session while down: %v, want ErrDown", err)
	}
	if _, _, err := a.Admit(t.Context(), "alpha", Limits{Requests: 30}, 1, ""); !errors.Is(err, ErrDown) {
		t.Errorf("Admit while down: %v, want ErrDown", err)
	}
	if after := requestPath(); after != before {
		t.Errorf("calls made while down were counted as failed (%v before, %v after): they should try nothing", before, after)
	}
	if a.SetHome("s-1", "gpu-1") || testutil.ToFloat64(a.m.dropped.WithLabelValues(opSetSession)) != 1 {
		t.Errorf("a write while down is not dropped and counted")
	}
	waitUntil(t, "b sees Redis down", func() bool { return !b.Up() })

	r.Restart()
	waitUntil(t, "a rejoins", a.Up)
	waitUntil(t, "b rejoins", b.Up)
	admitted := 0
	for i := range 4 {
		v, _, err := []*Cluster{a, b}[i%2].Admit(t.Context(), "alpha", Limits{Requests: 2}, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		if v.Refused == "" {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("after the restart, 4 requests at 2 a minute over two replicas: %d admitted, want 2", admitted)
	}
	if testutil.ToFloat64(a.m.up) != 1 {
		t.Errorf("llmlb_cluster_up %v after rejoining, want 1", testutil.ToFloat64(a.m.up))
	}
}

// Each replica's work in flight reaches the others' ledgers within a
// publish interval or so, and stops counting when the replica stops.
func TestLoadIsShared(t *testing.T) {
	r := redistest.Start(t)
	newBal := func() *balancer.Balancer {
		b, err := balancer.New(balancer.DefaultConfig(), balancer.Deps{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := balancer.Spec{ID: "gpu-1", State: balancer.StateReady, Models: []string{"m"}}
		b.Update(s)
		return b
	}
	balA, balB := newBal(), newBal()
	ctxA, stopA := context.WithCancel(context.Background())
	cfg := DefaultConfig()
	cfg.Redis.Address, cfg.Redis.Timeout, cfg.ShareLoad = r.Addr, 200*time.Millisecond, true
	a := New(cfg, Files{}, balA, prometheus.NewRegistry(), nil)
	doneA := make(chan struct{})
	go func() { defer close(doneA); a.Run(ctxA) }()
	t.Cleanup(func() { stopA(); <-doneA })
	b := replica(t, r.Addr, balB)

	be := balA.Snapshot().Backends[0]
	g := balA.NewGuard()
	g.Attach(be, balancer.Work{UncachedTokens: 500, DecodeTokens: 100}, time.Now())
	peer := balB.Snapshot().Backends[0].Ledger
	waitUntil(t, "a's request counted at b", func() bool {
		p := peer.Peers()
		return p.InFlight == 1 && p.OpenTokens == 600
	})
	waitUntil(t, "two replicas heard", func() bool { return testutil.ToFloat64(b.m.replicas) == 2 })
	if own := balA.Snapshot().Backends[0].Ledger.Peers(); own != (balancer.Load{}) {
		t.Errorf("a counts its own work as a peer's: %+v", own)
	}
	stopA()
	<-doneA
	waitUntil(t, "a's work forgotten once it stopped", func() bool { return peer.Peers() == (balancer.Load{}) })
	g.Release()
}

func TestParseLoad(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want balancer.Load
		ok   bool
	}{
		{"3 2000", balancer.Load{InFlight: 3, OpenTokens: 2000}, true},
		{formatLoad(balancer.Load{InFlight: 7, OpenTokens: 9}), balancer.Load{InFlight: 7, OpenTokens: 9}, true},
		{"-1 0", balancer.Load{}, false},            // negative
		{"1", balancer.Load{}, false},               // short
		{"1 0 0", balancer.Load{}, false},           // long
		{"1 x", balancer.Load{}, false},             // not a number
		{"9999999999999 0", balancer.Load{}, false}, // past the bound
	} {
		got, ok := parseLoad(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseLoad(%q) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseLoad: whatever another writer left in Redis, a load read
// from it is within bounds and writes back as it was read.
func FuzzParseLoad(f *testing.F) {
	f.Add("3 2000")
	f.Add("0 0")
	f.Add(" 1\t0 ")
	f.Fuzz(func(t *testing.T, s string) {
		l, ok := parseLoad(s)
		if !ok {
			return
		}
		if l.InFlight < 0 || l.InFlight > maxLoad || l.OpenTokens < 0 || l.OpenTokens > maxLoad {
			t.Fatalf("parseLoad(%q) = %+v: out of bounds", s, l)
		}
		if again, ok := parseLoad(formatLoad(l)); !ok || again != l {
			t.Fatalf("parseLoad(formatLoad(%+v)) = %+v, %v", l, again, ok)
		}
	})
}
