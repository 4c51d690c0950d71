package balancer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSaturatedBackendsAreSkipped(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(ready("busy", 20, 4, 0.5), ready("kvfull", 0, 4, 0.97), ready("ok", 3, 4, 0.5))
	for range 20 {
		if d := mustPick(t, b, &Request{Model: "m"}, nil); d.Candidates[0].ID != "ok" || len(d.Candidates) != 1 {
			t.Fatalf("picked %v, want only ok", ids(d.Candidates))
		}
	}
	// Queue counted with what we sent since the scrape: 13 more make ok
	// saturated too, and with the admission queue on, Pick says so.
	for range 13 {
		g := b.NewGuard()
		g.Attach(backend(t, b, "ok"), Work{}, time.Now())
		defer g.Release()
	}
	if _, err := b.Pick(&Request{Model: "m"}, nil); !errors.Is(err, ErrSaturated) {
		t.Errorf("all saturated: err %v, want ErrSaturated", err)
	}
	off := newBal(t, "ttft", func(c *Config, _ *Deps) { c.Admission.MaxQueue = 0 })
	off.Update(ready("busy", 20, 4, 0.5))
	if d, err := off.Pick(&Request{Model: "m"}, nil); err != nil || d.Reason != "saturated" {
		t.Errorf("queue off, all saturated: %v %v, want busy saturated", d.Reason, err)
	}
	// Stale metrics: passed over while a fresh backend exists, used when
	// none does.
	st := newBal(t, "ttft")
	stale := ready("stale", 0, 0, 0)
	stale.Stale = true
	st.Update(stale, ready("fresh", 10, 0, 0))
	if d, _ := st.Pick(&Request{Model: "m"}, nil); d.Candidates[0].ID != "fresh" || len(d.Candidates) != 1 {
		t.Errorf("stale vs fresh: %v", ids(d.Candidates))
	}
	st.Remove("fresh")
	if d, err := st.Pick(&Request{Model: "m"}, nil); err != nil || d.Reason != "stale-metrics" {
		t.Errorf("only stale: %v %v", d.Reason, err)
	}
}

// A backend without a scraped queue is not saturated by our own pending
// requests alone (they may all be prefilling on a server with room).
func TestUnscrapedQueueDoesNotSaturate(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(spec("nometrics", StateReady, "m"))
	for range 40 {
		g := b.NewGuard()
		g.Attach(backend(t, b, "nometrics"), Work{}, time.Now())
		defer g.Release()
	}
	if d, err := b.Pick(&Request{Model: "m"}, nil); err != nil || d.Reason == "saturated" {
		t.Errorf("40 pending on a backend without metrics: %q %v, want it picked unsaturated", d.Reason, err)
	}
}

// A saturated holder stays a candidate while its queue is within
// HolderQueue times the shortest, however full the fleet; past that it is
// saturated like the others, and with none left the request waits for
// room: kept whatever its queue, the holder was often the only candidate
// and took every request on its prompts (4 servers, burst at x4: 299 of
// one 300-request burst went to the A100 holding its prefix, its queue
// 313 long, the others' near 16).
func TestSaturatedHolderIsBoundedByTheOthersQueues(t *testing.T) {
	system := strings.Repeat("g", 4*4000)
	p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 800))
	req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100}
	candidates := func(b *Balancer, holderQ, zQ float64) []string {
		t.Helper()
		b.Update(busy("holder", holderQ, 120, 0.6), busy("x", 20, 120, 0.6), busy("y", 18, 120, 0.6), busy("z", zQ, 120, 0.6))
		b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		var ids []string
		for _, be := range b.Explain(req).Backends {
			if be.Excluded == "" {
				ids = append(ids, be.ID)
			}
		}
		return ids
	}
	b := newBal(t, "ttft")
	// The fleet saturated as a whole: the holder, 40 waiting, keeps its prompt.
	if got := candidates(b, 40, 17); !slices.Equal(got, []string{"holder"}) {
		t.Errorf("holder 40 waiting, every other saturated: candidates %v, want holder", got)
	}
	// 80 waiting, past 4 x 17: saturated like the others.
	candidates(b, 80, 17)
	if d, err := b.Pick(req, nil); !errors.Is(err, ErrSaturated) {
		t.Errorf("holder 80 waiting, every other saturated: picked %v (%s, %v), want ErrSaturated", ids(d.Candidates), d.Reason, err)
	}
	// 80 waiting, z with room: z alone.
	if got := candidates(b, 80, 3); !slices.Equal(got, []string{"z"}) {
		t.Errorf("holder 80 waiting, z 3: candidates %v, want z", got)
	}
	// No bound: the holder whatever its queue.
	nb := newBal(t, "ttft", func(c *Config, _ *Deps) { c.Saturation.HolderQueue = 0 })
	if got := candidates(nb, 300, 17); !slices.Equal(got, []string{"holder"}) {
		t.Errorf("holder_queue 0, holder 300 waiting: candidates %v, want holder", got)
	}
}

// The readings propose a backend's slots: the most requests a reading
// showed running, once two readings in a row showed that many with
// requests waiting and KV to spare; a reading with requests waiting below
// the most ever run, or with the cache nearly full, says the plateau was
// not the slots (a KV or token budget), and a higher count starts again.
func TestSlotsProposedByAPlateau(t *testing.T) {
	var l slotLearner
	steps := []struct {
		running, waiting, kv float64
		want                 int64
	}{
		{10, 0, 0.5, 0}, {64, 3, 0.5, 0}, {64, 5, 0.5, 64}, {64, 0, 0.5, 64}, {30, 0, 0.5, 64},
		{40, 2, 0.5, 0}, // waiting below the top: not the slots
		{64, 1, 0.5, 0}, {64, 1, 0.5, 64},
		{70, 0, 0.5, 0}, // more run: the top was not the limit
		{70, 4, 0.5, 0}, {70, 4, 0.5, 70},
		{70, 4, 0.95, 0}, {70, 4, 0.95, 0}, {70, 4, 0.95, 0}, // waiting for KV
	}
	for i, s := range steps {
		l.reading(Known(s.running), Known(s.waiting), Known(s.kv))
		if got := l.proposed(); got != s.want {
			t.Fatalf("step %d (%v running, %v waiting, KV %v): proposed %d, want %d", i, s.running, s.waiting, s.kv, got, s.want)
		}
	}
	var small slotLearner
	for range 3 {
		small.reading(Known(2), Known(1), Value{})
	}
	if got := small.proposed(); got != 0 {
		t.Errorf("plateau at 2 running: proposed %d, want 0 (below %d)", got, minSlots)
	}
	var unknown slotLearner
	for range 3 {
		unknown.reading(Known(8), Value{}, Value{})
	}
	if got := unknown.proposed(); got != 0 {
		t.Errorf("no waiting count: proposed %d, want 0", got)
	}
}

// The first bytes judge the proposal: the slots are confirmed only when
// requests picked with that many running and queued waited far longer
// than estimated, against those picked with fewer; a plateau on an engine
// whose waits do not grow past it (a token budget) is never confirmed; a
// reading with more running, or first bytes that stop waiting, unconfirm.
func TestSlotsConfirmedByFirstBytes(t *testing.T) {
	plateau := func(l *slotLearner, n float64) {
		for range 2 {
			l.reading(Known(n), Known(5), Known(0.3))
		}
	}
	// pairs folds in rounds pairs of first bytes, one picked below the
	// count and one at it, each {running and queued, estimate, took}.
	pairs := func(l *slotLearner, rounds int, below, at [3]float64) {
		for range rounds {
			l.firstByte(below[0], below[1], below[2])
			l.firstByte(at[0], at[1], at[2])
		}
	}
	var l slotLearner
	plateau(&l, 64)
	for range slotSamples {
		l.firstByte(30, 0.05, 0.05) // below: as estimated
		if l.own() != 0 {
			t.Fatal("confirmed before any request picked at the count")
		}
		l.firstByte(70, 0.06, 0.48) // at it: waited for a slot
	}
	if got := l.own(); got != 64 {
		t.Fatalf("stalls at 64: slots %d, want 64", got)
	}
	// Requests at the count no longer wait: not the slots after all.
	for range 40 {
		l.firstByte(70, 0.06, 0.06)
	}
	if got := l.own(); got != 0 {
		t.Errorf("no stalls at 64 any more: slots %d, want 0", got)
	}

	// A budget-bound plateau: waits at the count no longer than below it.
	var budget slotLearner
	plateau(&budget, 12)
	pairs(&budget, 20, [3]float64{5, 0.2, 0.25}, [3]float64{15, 0.4, 0.55})
	if got := budget.own(); got != 0 {
		t.Errorf("waits as estimated past the plateau: slots %d, want 0", got)
	}

	// More running than the slots: unconfirmed at once.
	var more slotLearner
	plateau(&more, 16)
	pairs(&more, slotSamples, [3]float64{4, 0.05, 0.05}, [3]float64{20, 0.05, 0.5})
	if more.own() != 16 {
		t.Fatalf("slots %d, want 16", more.own())
	}
	more.reading(Known(17), Known(0), Known(0.3))
	if got := more.own(); got != 0 {
		t.Errorf("17 running: slots %d, want 0", got)
	}
	// Nothing judged without an estimate (a policy that makes none).
	var none slotLearner
	plateau(&none, 16)
	pairs(&none, 10, [3]float64{4, 0, 0.05}, [3]float64{20, 0, 0.5})
	if got := none.own(); got != 0 {
		t.Errorf("no estimates: slots %d, want 0", got)
	}
}

// A holder whose slots are all taken is passed over for a backend with one
// free, which copies the prompt, though it has work queued;
// with every slot in the fleet taken the holder keeps it. Slots learned on
// one backend are lent to its class, not to another.
func TestSlotsFullHolderIsPassedOver(t *testing.T) {
	system := strings.Repeat("g", 4*2000)
	p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 400))
	req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100}
	// fleet returns a balancer whose h, holding the prompt, was seen
	// full twice (8 running, 1 waiting), beside x and y of its class with
	// othersRunning running and one waiting, and a backend of another
	// class with one waiting: none may take a copy but for the rule.
	fleet := func(othersRunning float64, opts ...func(*Config, *Deps)) *Balancer {
		b := newBal(t, "ttft", opts...)
		other := smallKV("other")
		other.Metrics.Queued = Known(1)
		b.Update(busy("h", 1, 8, 0.2), busy("x", 1, othersRunning, 0.2), busy("y", 1, othersRunning, 0.2), other)
		b.Update(busy("h", 1, 8, 0.2))
		for range slotSamples {
			sl := &backend(t, b, "h").Ledger.slots
			sl.firstByte(3, 0.05, 0.05)
			sl.firstByte(9, 0.05, 0.4)
		}
		b.Update(busy("h", 1, 8, 0.2)) // lends the slots to the class
		b.pol.index.Insert(backend(t, b, "h").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		return b
	}
	b := fleet(2)
	if got := backend(t, b, "h").Ledger.Slots(); got != 8 {
		t.Fatalf("h's slots %d, want 8", got)
	}
	for _, id := range []string{"x", "y"} {
		if got := backend(t, b, id).Ledger.Slots(); got != 8 {
			t.Errorf("%s's slots %d, want 8 lent by h", id, got)
		}
	}
	if got := backend(t, b, "other").Ledger.Slots(); got != 0 {
		t.Errorf("other class's slots %d, want 0", got)
	}
	if d := mustPick(t, b, req, nil); slices.Contains(ids(d.Candidates), "h") {
		t.Errorf("holder full: picked %v, want h left out", ids(d.Candidates))
	}
	// Every slot of the class taken, and other's too: h keeps it.
	all := fleet(8)
	for range 2 {
		other := smallKV("other")
		other.Metrics.Queued, other.Metrics.Running = Known(9), Known(64)
		all.Update(other)
	}
	for range slotSamples {
		sl := &backend(t, all, "other").Ledger.slots
		sl.firstByte(3, 0.05, 0.05)
		sl.firstByte(70, 0.05, 0.4)
	}
	if d := mustPick(t, all, req, nil); d.Candidates[0].ID != "h" {
		t.Errorf("every slot taken: picked %v, want h first", ids(d.Candidates))
	}
	// Off in an ablation: the holder keeps it while full.
	off := fleet(2, func(c *Config, _ *Deps) { *c = c.Without(ruleSlots) })
	if d := mustPick(t, off, req, nil); d.Candidates[0].ID != "h" {
		t.Errorf("slots rule off: picked %v, want h first", ids(d.Candidates))
	}
}

// A holder with more requests in flight than twice the candidates' mean
// plus 8 is passed over for one within the bound, so that a burst on one
// prompt does not pile onto its holder while its slots are not known;
// within the bound, or with the bound off, the holder keeps its prompt.
func TestLoadBoundPassesOverAPiledHolder(t *testing.T) {
	system := strings.Repeat("g", 4*2000)
	p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 400))
	req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100}
	// Our own requests in flight on the holder (pending: no first byte),
	// one queued on each other backend so that no copy is made for speed.
	fleet := func(onHolder int, opts ...func(*Config, *Deps)) *Balancer {
		b := newBal(t, "ttft", opts...)
		b.Update(busy("h", 0, 0, 0.2), busy("x", 1, 0, 0.2), busy("y", 1, 0, 0.2), busy("z", 1, 0, 0.2))
		b.pol.index.Insert(backend(t, b, "h").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		for range onHolder {
			g := b.NewGuard()
			g.Attach(backend(t, b, "h"), Work{UncachedTokens: 100}, time.Now())
			t.Cleanup(g.Release)
		}
		return b
	}
	// Mean (n+3)/4: the bound is passed at n = 20 (2 x 23/4 + 8 = 19.5).
	for _, c := range []struct {
		n    int
		want bool // the holder is picked
	}{{5, true}, {19, true}, {20, false}, {40, false}} {
		d := mustPick(t, fleet(c.n), req, nil)
		if got := d.Candidates[0].ID == "h"; got != c.want {
			t.Errorf("%d in flight on the holder: picked %v, want the holder %v", c.n, ids(d.Candidates), c.want)
		}
	}
	off := fleet(40, func(c *Config, _ *Deps) { *c = c.Without(ruleLoadBound) })
	if d := mustPick(t, off, req, nil); d.Candidates[0].ID != "h" {
		t.Errorf("bound off, 40 in flight on the holder: picked %v, want h first", ids(d.Candidates))
	}
}
