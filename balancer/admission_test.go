package balancer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// admissionBal is one saturated backend ("a", queue 20) and the queue on.
func admissionBal(t *testing.T, maxQueue int, timeout time.Duration) *Balancer {
	b := newBal(t, "ttft", func(c *Config, _ *Deps) {
		c.Admission.MaxQueue = maxQueue
		c.Admission.Timeout = timeout
	})
	b.Update(ready("a", 20, 4, 0.5))
	return b
}

func TestAdmissionQueueDrainsInPriorityOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := admissionBal(t, 10, time.Minute)
		ctx := context.Background()
		hold := make(chan struct{})
		defer close(hold)
		var order []int
		done := make(chan int, 4)
		for i, prio := range []int{0, 5, 0, 1} {
			go func() {
				// The guard is attached inside the pick, as the proxy
				// does: attaching after PickWait returned let the next
				// head, woken as this one left the queue, see the slot
				// still free and overtake in the done channel.
				g := b.NewGuard()
				d, err := b.PickWait(ctx, &Request{Model: "m", Priority: prio, Guard: g}, nil)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
				if d.Waited <= 0 {
					t.Errorf("waiter %d waited %v", i, d.Waited)
				}
				done <- i
				// Hold the slot: the test frees capacity by scrapes.
				<-hold
				g.Release()
			}()
			synctest.Wait()
		}
		if b.QueueLen() != 4 {
			t.Fatalf("queue length %d, want 4", b.QueueLen())
		}
		// Each scrape shows room for exactly one more request.
		for len(order) < 4 {
			time.Sleep(time.Millisecond) // inside the synctest bubble, virtual time: the next scrape has a new reading time
			b.Update(ready("a", 15, 4, 0.5))
			synctest.Wait()
			select {
			case i := <-done:
				order = append(order, i)
			default:
				t.Fatalf("no waiter served after capacity freed (order so far %v)", order)
			}
			b.Update(ready("a", 20, 4, 0.5))
		}
		if fmt.Sprint(order) != "[1 3 0 2]" {
			t.Errorf("served in order %v, want [1 3 0 2] (priority 5, 1, then FIFO among 0)", order)
		}
	})
}

func TestAdmissionRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := admissionBal(t, 1, 5*time.Second)
		errc := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			_, err := b.PickWait(ctx, &Request{Model: "m"}, nil)
			errc <- err
		}()
		synctest.Wait()
		if _, err := b.PickWait(context.Background(), &Request{Model: "m"}, nil); !errors.Is(err, ErrQueueFull) {
			t.Errorf("second waiter: %v, want ErrQueueFull", err)
		}
		if _, err := b.PickWait(context.Background(), &Request{Model: "m", Priority: -1}, nil); !errors.Is(err, ErrShed) {
			t.Errorf("sheddable: %v, want ErrShed", err)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: %v", err)
		}
		if b.QueueLen() != 0 {
			t.Errorf("cancelled waiter still queued: %d", b.QueueLen())
		}
		start := time.Now()
		if _, err := b.PickWait(context.Background(), &Request{Model: "m"}, nil); !errors.Is(err, ErrQueueTimeout) {
			t.Errorf("deadline: %v, want ErrQueueTimeout", err)
		}
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("timed out after %v, want 5s", waited)
		}
		r := b.Refusals()
		if r["queue-full"] != 1 || r["shed"] != 1 || r["cancelled"] != 1 || r["timeout"] != 1 {
			t.Errorf("refusals %v", r)
		}
	})
}

// queued is a request waiting in admissionBal's queue from its own
// goroutine, as the proxy's handlers wait.
type queued struct {
	label string
	req   Request
}

// admitInTurn runs the waiters of reqs against b, whose one backend "a" is
// saturated, each entering the queue in the order given, then frees room
// for exactly one request per scrape until every waiter is served. It
// returns the labels in the order served. next, when set, is called as
// each request is served and may return a request its client sends at once
// (a closed loop); it runs on the test's goroutine.
func admitInTurn(t *testing.T, b *Balancer, reqs []queued, next func(served string) *queued) []string {
	t.Helper()
	ctx := context.Background()
	hold := make(chan struct{})
	defer close(hold)
	done := make(chan string, len(reqs)+1)
	start := func(q queued) {
		go func() {
			g := b.NewGuard()
			q.req.Guard = g
			if _, err := b.PickWait(ctx, &q.req, nil); err != nil {
				t.Errorf("waiter %s: %v", q.label, err)
			}
			done <- q.label
			<-hold // the slot stays taken: the test frees capacity by scrapes
			g.Release()
		}()
		synctest.Wait()
	}
	for _, q := range reqs {
		start(q)
	}
	var order []string
	for b.QueueLen() > 0 {
		time.Sleep(time.Millisecond) // virtual time: the next scrape has a new reading time
		b.Update(ready("a", 15, 4, 0.5))
		synctest.Wait()
		select {
		case l := <-done:
			order = append(order, l)
			if len(done) > 0 {
				t.Fatalf("two waiters served by one free slot (order so far %v)", order)
			}
			if next != nil {
				if q := next(l); q != nil {
					start(*q)
				}
			}
		default:
			t.Fatalf("no waiter served after capacity freed (order so far %v)", order)
		}
		b.Update(ready("a", 20, 4, 0.5))
	}
	return order
}

// TestAdmissionTenantsTakeTurns: at saturation, tenant A's burst of 200
// does not hold back tenant B's 10 sent just after: round-robin serves B
// every other admission, its k-th request by the 2k-th admission (FIFO
// served it after all 200), and a B that sends one request at a time has
// each served within 2 admissions of its arrival. A's requests are served
// in the order A sent them.
func TestAdmissionTenantsTakeTurns(t *testing.T) {
	tests := []struct {
		name     string
		fairness string
		oneByOne bool // B sends its next request when the last is served
		// wantWorst bounds B's worst wait, in admissions from the
		// request's arrival; wantFair, when set, bounds B's k-th
		// (1-based) request of the burst to 2k admissions.
		wantWorst int
		wantFair  bool
	}{
		{name: "round-robin burst", fairness: FairRoundRobin, wantWorst: 20, wantFair: true},
		{name: "round-robin one by one", fairness: FairRoundRobin, oneByOne: true, wantWorst: 2},
		{name: "off burst", fairness: FairOff, wantWorst: 210},
		{name: "off one by one", fairness: FairOff, oneByOne: true, wantWorst: 201},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBal(t, "ttft", func(c *Config, _ *Deps) {
					c.Admission.MaxQueue = 300
					c.Admission.Timeout = time.Hour
					c.Admission.Fairness = tt.fairness
				})
				b.Update(ready("a", 20, 4, 0.5))
				var reqs []queued
				for i := range 200 {
					reqs = append(reqs, queued{fmt.Sprintf("A%d", i), Request{Model: "m", Tenant: "A"}})
				}
				nB := 10
				if tt.oneByOne {
					nB = 1
				}
				for i := range nB {
					reqs = append(reqs, queued{fmt.Sprintf("B%d", i), Request{Model: "m", Tenant: "B"}})
				}
				sentB := nB
				var next func(string) *queued
				if tt.oneByOne {
					next = func(served string) *queued {
						if served[0] != 'B' || sentB == 10 {
							return nil
						}
						sentB++
						return &queued{fmt.Sprintf("B%d", sentB-1), Request{Model: "m", Tenant: "B"}}
					}
				}
				order := admitInTurn(t, b, reqs, next)
				if len(order) != 210 {
					t.Fatalf("served %d requests, want 210", len(order))
				}
				worst, arrived, nextA, k := 0, 0, 0, 0
				for i, l := range order {
					n := i + 1 // admissions so far
					if l[0] == 'A' {
						if want := fmt.Sprintf("A%d", nextA); l != want {
							t.Fatalf("admission %d served %s, want %s: A's requests out of order", n, l, want)
						}
						nextA++
						continue
					}
					k++
					worst = max(worst, n-arrived)
					if tt.wantFair && n > 2*k {
						t.Errorf("B's request %d served at admission %d, want by %d (every other admission)", k, n, 2*k)
					}
					if tt.oneByOne {
						arrived = n // B's next request arrives as this one is served
					}
				}
				t.Logf("%s: B's worst wait %d admissions", tt.fairness, worst)
				if worst > tt.wantWorst || !tt.wantFair && worst < tt.wantWorst {
					t.Errorf("B's worst wait %d admissions, want %d", worst, tt.wantWorst)
				}
			})
		})
	}
}

// TestAdmissionPriorityBeforeTenants: priority bands still order the
// queue across tenants: a later request of higher priority goes first,
// the tenants of one band take turns, and a sheddable request, let in
// while the queue was empty, goes last.
func TestAdmissionPriorityBeforeTenants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := admissionBal(t, 10, time.Hour)
		reqs := []queued{
			{"S", Request{Model: "m", Tenant: "S", Priority: -1}},
			{"A1", Request{Model: "m", Tenant: "A"}},
			{"A2", Request{Model: "m", Tenant: "A"}},
			{"A3", Request{Model: "m", Tenant: "A"}},
			{"B1", Request{Model: "m", Tenant: "B"}},
			{"B2", Request{Model: "m", Tenant: "B"}},
			{"C1", Request{Model: "m", Tenant: "C", Priority: 5}},
		}
		order := admitInTurn(t, b, reqs, nil)
		if got, want := fmt.Sprint(order), "[C1 A1 B1 A2 B2 A3 S]"; got != want {
			t.Errorf("served in order %s, want %s", got, want)
		}
	})
}

// drain serves a's queue head after head, as capacity would, and returns
// the label of each waiter served; serve, when set, is told each label
// and may enter more waiters.
func drain(a *admission, labels map[*waiter]string, serve func(label string)) string {
	var out strings.Builder
	for a.head != nil {
		w := a.head
		a.leave(w, true)
		out.WriteString(labels[w])
		if serve != nil {
			serve(labels[w])
		}
	}
	return out.String()
}

// testAdmission is a queue of maxQueue under rule fairness, for tests
// without sheddable requests (it has no random source).
func testAdmission(t *testing.T, fairness string, maxQueue int) *admission {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Admission.Fairness = fairness
	cfg.Admission.MaxQueue = maxQueue
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return newAdmission(cfg, nil)
}

// TestAdmissionTokenFairness: under the tokens rule a tenant whose
// requests cost ten times another's gets one admission for the other's
// ten (round-robin: one each); a tenant that starts waiting late starts
// at the others' count rather than at 0, and one that leaves the queue
// and comes back keeps its count.
func TestAdmissionTokenFairness(t *testing.T) {
	enter := func(t *testing.T, a *admission, labels map[*waiter]string, label string, n int, req Request) {
		t.Helper()
		for range n {
			w, err := a.enter(&req, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			labels[w] = label
		}
	}
	// A costs 1000 + 2×500 = 2000 tokens a request, B 100 + 2×50 = 200.
	big := Request{Tenant: "A", PromptTokens: 1000, MaxTokens: 500}
	small := Request{Tenant: "B", PromptTokens: 100, MaxTokens: 50}
	for _, tt := range []struct {
		fairness, want string
	}{
		{FairTokens, "A" + strings.Repeat("B", 10) + "A" + strings.Repeat("B", 10) + strings.Repeat("A", 18)},
		{FairRoundRobin, strings.Repeat("AB", 20)},
		{FairOff, strings.Repeat("A", 20) + strings.Repeat("B", 20)},
	} {
		t.Run("costs "+tt.fairness, func(t *testing.T) {
			a := testAdmission(t, tt.fairness, 100)
			labels := map[*waiter]string{}
			enter(t, a, labels, "A", 20, big)
			enter(t, a, labels, "B", 20, small)
			if got := drain(a, labels, nil); got != tt.want {
				t.Errorf("served %s, want %s", got, tt.want)
			}
		})
	}
	t.Run("late tenant starts at the floor", func(t *testing.T) {
		a := testAdmission(t, FairTokens, 100)
		labels := map[*waiter]string{}
		// MaxTokens unset: ttft.default_max_tokens (256) is assumed, so
		// A's and B's requests cost alike.
		enter(t, a, labels, "A", 10, Request{Tenant: "A", PromptTokens: 200})
		for range 5 {
			a.leave(a.head, true)
		}
		enter(t, a, labels, "B", 5, Request{Tenant: "B", PromptTokens: 200})
		if got, want := drain(a, labels, nil), "ABABABABAB"; got != want {
			t.Errorf("served %s, want %s (B banked no credit while absent)", got, want)
		}
	})
	t.Run("returning tenant keeps its count", func(t *testing.T) {
		a := testAdmission(t, FairTokens, 100)
		labels := map[*waiter]string{}
		cheap := Request{Tenant: "A", PromptTokens: 200, MaxTokens: 1}
		enter(t, a, labels, "A", 40, cheap)                                                 // 202 tokens each
		enter(t, a, labels, "B", 1, Request{Tenant: "B", PromptTokens: 2018, MaxTokens: 1}) // 2020: ten of A's
		// B sends one request at a time: the next as the last is served.
		got := drain(a, labels, func(l string) {
			if l == "B" && a.head != nil {
				enter(t, a, labels, "B", 1, Request{Tenant: "B", PromptTokens: 2018, MaxTokens: 1})
			}
		})
		// A's first goes before B's first (a tie at 0, A's turn); then A
		// gets B's cost in admissions between B's: nine the first time,
		// since one of A's was served already, then ten, until A's 40
		// are served.
		want := "AB" + strings.Repeat("A", 9) + "B" + strings.Repeat(strings.Repeat("A", 10)+"B", 3)
		if got != want {
			t.Errorf("served %s, want %s (B's count kept while it had no request waiting)", got, want)
		}
	})
	t.Run("kept counts are bounded", func(t *testing.T) {
		const maxQueue = 4
		a := testAdmission(t, FairTokens, maxQueue)
		labels := map[*waiter]string{}
		enter(t, a, labels, "A", 2, Request{Tenant: "A", PromptTokens: 200, MaxTokens: 1})
		// A stream of tenants each sends one request dearer than A's and
		// goes away once served, leaving its count above the floor.
		next := 0
		newcomer := func() {
			enter(t, a, labels, "T", 1, Request{Tenant: fmt.Sprint("T", next), PromptTokens: 2018, MaxTokens: 1})
			next++
		}
		newcomer()
		for range 500 {
			w := a.head
			a.leave(w, true)
			if labels[w] == "A" {
				enter(t, a, labels, "A", 1, Request{Tenant: "A", PromptTokens: 200, MaxTokens: 1})
			} else {
				newcomer()
			}
			if n := len(a.bands[0].spent); n > maxQueue {
				t.Fatalf("%d counts kept after %d tenants, want at most max_queue (%d)", n, next, maxQueue)
			}
		}
		if next < 10 {
			t.Errorf("only %d tenants came and went", next)
		}
	})
}

// TestAdmissionShedsAsQueueFills: a sheddable request is let in with
// probability 1 - n/L for n waiting and L = shed_at × max_queue (here
// 0.5 × 20 = 10), refused always from n = L, and at once when shed_at is
// 0. The random draw is injected: 0 refuses from n = 1, half of the
// range from n = 6 (5/10 < n/L), the top of the range only from n = L.
func TestAdmissionShedsAsQueueFills(t *testing.T) {
	tests := []struct {
		name     string
		shedAt   float64
		draw     uint64
		wantUpTo int // let in while n ≤ wantUpTo; -1: never
	}{
		{name: "draw 0", shedAt: 0.5, draw: 0, wantUpTo: 0},
		{name: "draw half", shedAt: 0.5, draw: 1 << 63, wantUpTo: 5},
		{name: "draw top", shedAt: 0.5, draw: math.MaxUint64, wantUpTo: 9},
		{name: "shed_at 0", shedAt: 0, draw: math.MaxUint64, wantUpTo: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Admission.MaxQueue = 20
			cfg.Admission.ShedAt = tt.shedAt
			a := newAdmission(cfg, func() uint64 { return tt.draw })
			for n := range 20 {
				w, err := a.enter(&Request{Priority: -1}, time.Time{})
				switch {
				case n <= tt.wantUpTo && err != nil:
					t.Errorf("n = %d: sheddable refused (%v), want let in", n, err)
				case n > tt.wantUpTo && !errors.Is(err, ErrShed):
					t.Errorf("n = %d: sheddable got %v, want ErrShed", n, err)
				}
				if w != nil {
					a.leave(w, false)
				}
				if _, err := a.enter(&Request{}, time.Time{}); err != nil {
					t.Fatalf("n = %d: priority 0 refused: %v", n, err)
				}
			}
			if _, err := a.enter(&Request{}, time.Time{}); !errors.Is(err, ErrQueueFull) {
				t.Errorf("full queue: %v, want ErrQueueFull", err)
			}
		})
	}
}

// evictionBal is admissionBal with eviction after a second, and a second
// saturated backend "x" that serves another model.
func evictionBal(t *testing.T) *Balancer {
	b := newBal(t, "ttft", func(c *Config, _ *Deps) {
		c.Admission.MaxQueue = 10
		c.Admission.Timeout = time.Minute
		c.Admission.EvictAfter = time.Second
	})
	other := ready("x", 20, 4, 0.5)
	other.Models = []string{"other"}
	b.Update(ready("a", 20, 4, 0.5), other)
	return b
}

// inFlight is a request picked onto be and registered for eviction; its
// evict records label on evicted and ends it, as the proxy's does.
type inFlight struct {
	guard *Guard
	done  func()
}

func startInFlight(b *Balancer, be *Backend, label string, prio int, evicted chan<- string) *inFlight {
	f := &inFlight{guard: b.NewGuard()}
	f.guard.Attach(be, Work{UncachedTokens: 100, DecodeTokens: 10}, time.Now())
	f.done = b.Evictable(&Request{Model: "m", Priority: prio, Guard: f.guard}, func() {
		evicted <- label
		f.end()
	})
	return f
}

func (f *inFlight) end() {
	f.done()
	f.guard.Release()
}

// TestAdmissionEvictsNewestSheddable: a request of priority 0 that waits
// past evict_after ends one sheddable request in flight per period, the
// lowest priority first and the newest first among equals; never one of
// priority 0, one that ended, or one on a backend that does not serve its
// model. When capacity frees it is served, and every ledger is back to 0.
func TestAdmissionEvictsNewestSheddable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := evictionBal(t)
		a, x := backend(t, b, "a"), backend(t, b, "x")
		evicted := make(chan string, 10)
		all := []*inFlight{
			startInFlight(b, a, "oldest, -2", -2, evicted),
			startInFlight(b, a, "older, -1", -1, evicted),
			startInFlight(b, a, "priority 0", 0, evicted),
			startInFlight(b, a, "newer, -1", -1, evicted),
			startInFlight(b, x, "other model, -3", -3, evicted),
		}
		// Deregistered, but still on a: deregistration alone keeps it.
		ended := startInFlight(b, a, "ended, -1", -1, evicted)
		ended.done()

		type result struct {
			dec Decision
			err error
		}
		res := make(chan result, 1)
		g := b.NewGuard()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // a failed test leaves no waiter behind
		go func() {
			d, err := b.PickWait(ctx, &Request{Model: "m", Guard: g}, nil)
			res <- result{d, err}
		}()
		next := func() string {
			synctest.Wait()
			select {
			case l := <-evicted:
				return l
			default:
				return ""
			}
		}
		time.Sleep(999 * time.Millisecond)
		if got := next(); got != "" {
			t.Fatalf("evicted %q before evict_after", got)
		}
		var order []string
		for range 4 {
			time.Sleep(time.Millisecond)
			order = append(order, next())
			time.Sleep(time.Second - time.Millisecond)
			if got := next(); got != "" {
				t.Fatalf("evicted %q within a period of the last", got)
			}
		}
		if want := []string{"oldest, -2", "newer, -1", "older, -1", ""}; !slices.Equal(order, want) {
			t.Errorf("evicted %q, want %q", order, want)
		}
		if b.QueueLen() != 1 {
			t.Fatalf("queue length %d, want the urgent request still waiting", b.QueueLen())
		}
		b.Update(ready("a", 0, 2, 0.1))
		synctest.Wait()
		r := <-res
		if r.err != nil || r.dec.Candidates[0].ID != "a" {
			t.Errorf("urgent request: %v, %v; want it served by a", r.err, ids(r.dec.Candidates))
		}
		g.Release()
		for _, f := range all {
			f.end()
		}
		ended.guard.Release()
		for _, be := range []*Backend{a, x} {
			if n := be.Ledger.InFlight(); n != 0 {
				t.Errorf("%s: %d in flight, want 0", be.ID, n)
			}
		}
	})
}

// TestAdmissionOnlyUrgentWaitersEvict: a sheddable waiter never evicts, nor
// does any with eviction off, where nothing is registered either.
func TestAdmissionOnlyUrgentWaitersEvict(t *testing.T) {
	for _, tc := range []struct {
		name       string
		evictAfter time.Duration
		prio       int
		want       bool
	}{
		{"urgent", time.Second, 0, true},
		{"sheddable", time.Second, -1, false},
		{"off", 0, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBal(t, "ttft", func(c *Config, _ *Deps) { c.Admission.EvictAfter = tc.evictAfter; c.Admission.ShedAt = 1 })
			b.Update(ready("a", 20, 4, 0.5))
			evicted := make(chan string, 1)
			f := startInFlight(b, backend(t, b, "a"), "victim", -2, evicted)
			defer f.end()
			tk, err := b.Enqueue(&Request{Model: "m", Priority: tc.prio})
			if err != nil {
				t.Fatal(err)
			}
			defer tk.Leave("cancelled")
			if got := tk.Evict(); got != tc.want {
				t.Errorf("Evict() = %v, want %v", got, tc.want)
			}
			if got := len(evicted) == 1; got != tc.want {
				t.Errorf("victim evicted: %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAdmissionEvictAfterValidate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		evict    time.Duration
		maxQueue int
		policy   string
		wantErr  string
	}{
		{"off", 0, 0, "round-robin", ""},
		{"on", time.Second, 10, "ttft", ""},
		{"negative", -time.Second, 10, "ttft", "must not be negative"},
		{"past the timeout", time.Minute, 10, "ttft", "must be below admission.timeout"},
		{"queue off", time.Second, 0, "ttft", "needs admission.max_queue"},
		{"a policy with no queue", time.Second, 10, "round-robin", `policy "round-robin" has no admission queue`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Admission.EvictAfter, cfg.Admission.MaxQueue, cfg.Policy = tc.evict, tc.maxQueue, tc.policy
			err := cfg.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), "balancer.admission.evict_after: "+tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
