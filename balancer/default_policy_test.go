package balancer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

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

// A backend that has served requests has learned a faster prefill than
// the configured one; the others must borrow its rate rather than look
// three times slower, or distinct requests pile onto it.
func TestFreshFleetSpreadsDistinctRequests(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("a", 0, 0, 0), busy("b", 0, 0, 0), busy("c", 0, 0, 0), busy("d", 0, 0, 0))
	// a has served a tenant: 30,000 tokens/s, 20 ms base.
	learnRate(t, b, "a", 30000)
	spread(t, b, 40, func(i int) *Request { return distinct(i, 2000) })
}

// A backend not yet measured borrows the rate of the measured backends of
// its own hardware class (one engine and KV size), not the engine's mean:
// a fresh A100 beside measured H100s is not taken for one.
func TestFreshBackendBorrowsItsClassRate(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("fast1", 0, 0, 0), busy("fast2", 0, 0, 0), smallKV("slow"), smallKV("fresh-slow"), busy("fresh-fast", 0, 0, 0))
	learnRate(t, b, "fast1", 30000)
	learnRate(t, b, "fast2", 30000)
	learnRate(t, b, "slow", 8000)
	ex := b.Explain(distinct(1, 4000))
	prefill := map[string]float64{}
	for _, be := range ex.Backends {
		if be.Candidate != nil {
			prefill[be.ID] = be.Prefill
		}
	}
	near := func(got, want float64) bool { return got > 0.9*want && got < 1.1*want }
	if !near(prefill["fresh-slow"], prefill["slow"]) {
		t.Errorf("fresh backend of the slow class estimates a 4,000-token prefill at %.3f s, its measured classmate at %.3f s", prefill["fresh-slow"], prefill["slow"])
	}
	if !near(prefill["fresh-fast"], prefill["fast1"]) {
		t.Errorf("fresh backend of the fast class estimates %.3f s, its measured classmates %.3f s", prefill["fresh-fast"], prefill["fast1"])
	}
}

// While every backend of the fast class is behind, a new prompt goes to
// an idle backend of a slower class that is about as fast for it: a
// class's time for a new prompt counts its members' queued work, so the
// fast class's queue does not grow by every new group while the slower
// class waits to take groups later by copies.
func TestNewPromptGoesToAnIdleSlowerClassWhileTheFastOneIsBehind(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("fast1", 0, 0, 0), busy("fast2", 0, 0, 0), busy("fast3", 0, 0, 0), smallKV("slow1"), smallKV("slow2"))
	for _, id := range []string{"fast1", "fast2", "fast3"} {
		learnRate(t, b, id, 30000)
		// 0.3 s of prefill queued, twice what a 4,000-token prompt takes
		// there alone: its first token in about 0.46 s, against 0.52 s on
		// an idle slow backend.
		g := b.NewGuard()
		g.Attach(backend(t, b, id), Work{UncachedTokens: 9000}, time.Now())
		t.Cleanup(g.Release)
	}
	learnRate(t, b, "slow1", 8000)
	learnRate(t, b, "slow2", 8000)
	for i := range 20 {
		if got := b.Explain(distinct(i, 4000)).Chosen[0]; !strings.HasPrefix(got, "slow") {
			t.Errorf("prompt %d: picked %s, want an idle slow backend", i, got)
		}
	}
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

// A burst of requests that share one long prefix, on a fleet that already
// holds it everywhere, must not all go to the hash's favourite: each
// pending request there delays the next.
func TestBurstSharingAPrefixIsNotPiledOnOne(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("a", 0, 0, 0), busy("b", 0, 0, 0), busy("c", 0, 0, 0), busy("d", 0, 0, 0))
	shared := strings.Repeat("s", 4*4000)
	req := func(i int) *Request {
		p := fmt.Appendf([]byte(shared), " question %d %s", i, strings.Repeat("q", 800))
		return &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100}
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		r := req(-1)
		b.pol.index.Insert(backend(t, b, id).slot, b.pol.index.AppendHashes(nil, r.Seed, []byte(shared)))
	}
	spread(t, b, 40, req)
}

// Under overload, a request whose prefix one backend holds goes there
// even though that backend is saturated: a miss elsewhere would prefill
// 7,200 tokens on a fleet that has no time for it.
func TestOverloadKeepsAPrefixGroupOnItsHolder(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("holder", 20, 120, 0.93), busy("x", 12, 120, 0.92), busy("y", 14, 120, 0.9), busy("z", 12, 120, 0.91))
	system := strings.Repeat("g", 4*6000)
	b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
	for i := range 20 {
		p := fmt.Appendf([]byte(system), " user question %d %s", i, strings.Repeat("u", 4800))
		req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 200}
		ex := b.Explain(req)
		if ex.Chosen[0] != "holder" {
			t.Fatalf("request %d of the group went to %s (%s), not to the saturated holder: %+v", i, ex.Chosen[0], ex.Reason, ex.Backends)
		}
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

// A copy of a busy holder's prompt is made on a backend that can prefill
// it now, not behind any queue: there it only adds its prefill to what
// everyone waits for (8 servers, shared-prefix at x4: copies onto H100s
// seconds behind while the fleet warmed up).
func TestNoCopyBehindAQueue(t *testing.T) {
	system := strings.Repeat("c", 4*6000)
	p := fmt.Appendf([]byte(system), " question %s", strings.Repeat("q", 4*1200))
	req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100}
	pick := func(xBacklog int) string {
		t.Helper()
		b := newBal(t, "ttft")
		b.Update(busy("holder", 0, 0, 0.1), busy("x", 0, 0, 0.1), busy("y", 0, 0, 0.1), busy("z", 0, 0, 0.1))
		b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		// Prefill work queued, at the configured 10,000 tokens/s: the
		// holder 4 s, y and z 6 s, x as given.
		for id, tokens := range map[string]int{"holder": 40000, "x": xBacklog, "y": 60000, "z": 60000} {
			if tokens > 0 {
				g := b.NewGuard()
				g.Attach(backend(t, b, id), Work{UncachedTokens: tokens}, time.Now())
				t.Cleanup(g.Release)
			}
		}
		ex := b.Explain(req)
		return ex.Chosen[0]
	}
	// x idle: the copy (0.74 s) beats waiting 4 s at the holder.
	if got := pick(0); got != "x" {
		t.Errorf("x idle: picked %s, want x (a copy)", got)
	}
	// x 1 s behind, more than the copy takes: no copy.
	if got := pick(10000); got != "holder" {
		t.Errorf("x 1 s behind: picked %s, want holder", got)
	}
	// x 0.2 s behind, less than the copy takes: still no copy, since its
	// prefill would wait behind that queue and lengthen it.
	if got := pick(2000); got != "holder" {
		t.Errorf("x 0.2 s behind: picked %s, want holder", got)
	}
}

// Two balancers that share nothing, each with its own request in flight
// (so their loads differ by one request), place a new prompt on the same
// backend.
func TestIndependentBalancersAgreeOnNewPrompts(t *testing.T) {
	r1, r2 := newBal(t, "ttft"), newBal(t, "ttft")
	specs := []Spec{busy("a", 2, 8, 0.3), busy("b", 2, 7, 0.3), busy("c", 3, 8, 0.35), busy("d", 2, 9, 0.3)}
	r1.Update(specs...)
	r2.Update(specs...)
	for r, id := range map[*Balancer]string{r1: "a", r2: "d"} {
		g := r.NewGuard()
		g.Attach(backend(t, r, id), Work{UncachedTokens: 1000}, time.Now())
		t.Cleanup(g.Release)
	}
	agree := 0
	for i := range 200 {
		req := distinct(1000+i, 3000)
		if r1.Explain(req).Chosen[0] == r2.Explain(req).Chosen[0] {
			agree++
		}
	}
	if agree < 190 {
		t.Errorf("independent balancers agreed on %d of 200 new prompts, want at least 190", agree)
	}
}

// Two balancers that share nothing and have learned different prefill
// rates for the same identical servers, as replicas do from their own few
// samples (one replica's estimates of six identical idle H100 servers for
// one prompt ranged 0.21-0.45 s in one pick), place new prompts on the
// same servers.
func TestReplicasWithNoisyEstimatesAgreeOnNewPrompts(t *testing.T) {
	r1, r2 := noisyReplicas(t, 0)
	agree, count := 0, map[string]int{}
	for i := range 200 {
		req := distinct(5000+i, 7000)
		c1 := r1.Explain(req).Chosen[0]
		if c1 == r2.Explain(req).Chosen[0] {
			agree++
		}
		count[c1]++
	}
	if agree < 190 {
		t.Errorf("replicas with different learned rates agreed on %d of 200 new prompts, want at least 190 (%v)", agree, count)
	}
	for id, n := range count {
		if n > 75 {
			t.Errorf("%s took %d of 200 new prompts on four identical idle servers, over 1.5x its share (%v)", id, n, count)
		}
	}
}

// noisyReplicas returns two balancers that share nothing over the same
// four idle identical servers at KV use kv, each having learned its own
// prefill rate for each server, as replicas do from their own few samples.
func noisyReplicas(t *testing.T, kv float64) (r1, r2 *Balancer) {
	r1, r2 = newBal(t, "ttft"), newBal(t, "ttft")
	specs := []Spec{busy("a", 0, 0, kv), busy("b", 0, 0, kv), busy("c", 0, 0, kv), busy("d", 0, 0, kv)}
	r1.Update(specs...)
	r2.Update(specs...)
	// Each replica's learned rate for each server, in tokens a second.
	rates := map[*Balancer][]float64{r1: {30000, 18000, 24000, 14000}, r2: {15000, 29000, 17000, 26000}}
	for r, rs := range rates {
		for i, id := range []string{"a", "b", "c", "d"} {
			for j := range 50 {
				work := float64(1000 + 200*(j%20))
				backend(t, r, id).Ledger.est.observe(work, 0, 0.02+work/rs[i], 1/r.cfg.TTFT.PrefillRate, 0.02)
			}
		}
	}
	return r1, r2
}

// A holder prefilling a request it took a while ago has only what is left
// of that prefill ahead of a new request of the group, not the whole: a
// prefix-group member must not miss on an idle server for it (four
// servers at a quarter of shared-prefix's rate sent 68 of 3,000 requests
// past their holder this way).
func TestHolderPartlyThroughAPrefillKeepsItsGroup(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBal(t, "ttft", func(_ *Config, d *Deps) { d.Now = func() time.Time { return now } })
	b.Update(busy("holder", 0, 3, 0.05), busy("x", 0, 3, 0.05), busy("y", 0, 3, 0.05), busy("z", 0, 3, 0.05))
	for _, id := range []string{"holder", "x", "y", "z"} {
		for i := range 50 { // every server has learned 30,000 tokens/s
			work := float64(1000 + 300*(i%20))
			backend(t, b, id).Ledger.est.observe(work, 0, 0.02+work/30000, 1/b.cfg.TTFT.PrefillRate, 0.02)
		}
	}
	system := strings.Repeat("g", 4*6000)
	b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
	// The holder took another group's 7,200-token prompt, due 240 ms
	// later, as the pick's Work says.
	other := distinct(1, 7200)
	other.Guard = b.NewGuard()
	d, err := b.Pick(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Guard.Release)
	other.Guard.Attach(backend(t, b, "holder"), Work{UncachedTokens: 7200, PrefillSeconds: d.Work[0].PrefillSeconds}, now)
	req := func() *Request {
		p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 4800))
		return &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 200}
	}
	now = now.Add(150 * time.Millisecond)
	if ex := b.Explain(req()); ex.Chosen[0] != "holder" {
		t.Errorf("150 ms into the holder's 240 ms prefill, the group went to %s (%s): %+v", ex.Chosen[0], ex.Reason, ex.Backends)
	}
	// Overdue: a server slower than learned still has all of it ahead.
	now = now.Add(time.Second)
	if a := backend(t, b, "holder").Ledger.aheadTokens(1, 7200, now); a != 7200 {
		t.Errorf("a prefill overdue by 0.9 s counts %v tokens ahead, want all 7200", a)
	}
}

// Of many requests pending on a backend at most one is part prefilled:
// however early the drain time says they will be done, the others count
// whole (an overloaded server discounted for all of them looked emptier
// than it was: mooncake-conversation at x3, 2,003 -> 1,678 tokens/s).
func TestManyPendingCountWholeButOne(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var l Ledger
	for i := range 50 {
		work := float64(1000 + 300*(i%20))
		l.est.observe(work, 0, 0.02+work/30000, 1e-4, 0.02)
	}
	for range 10 {
		l.extendDrain(0.001, now) // a drain time far too early
	}
	now = now.Add(time.Millisecond)
	if a := l.aheadTokens(10, 10000, now); a < 9000 {
		t.Errorf("10 pending requests of 1,000 tokens count %v tokens ahead, want at least 9,000", a)
	}
	if a := l.aheadTokens(1, 1000, now); a >= 1000 {
		t.Errorf("one pending request its drain time says is part done counts %v tokens ahead, want less than 1,000", a)
	}
}

// A prompt one backend holds is not copied to another for a slightly
// faster first token: the copy stays in both caches while the prompt's
// requests keep coming to either (8 servers at shared-prefix x4: a third
// of the prefixes copied, KV full where they landed, 47-105 preemptions).
func TestHolderSlightlySlowerKeepsItsPrompt(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("holder", 0, 70, 0.3), busy("x", 0, 10, 0.3))
	system := strings.Repeat("g", 4*3000)
	b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
	p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 2000))
	req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 200}
	ex := b.Explain(req)
	cost := map[string]float64{}
	for _, be := range ex.Backends {
		cost[be.ID] = be.Cost
	}
	if r := cost["holder"] / cost["x"]; r < 1.1 || r > 1.4 {
		t.Fatalf("the holder's cost is %.2fx x's; the test wants it 10-40%% dearer: %+v", r, ex.Backends)
	}
	if ex.Chosen[0] != "holder" {
		t.Errorf("the prompt was copied to %s (%s) for a first token %.0f%% faster: %+v", ex.Chosen[0], ex.Reason, 100*(1-cost["x"]/cost["holder"]), ex.Backends)
	}
}

// New prompts go where the cache has room: a backend with a third of the
// others' KV cache takes none of 100 distinct new prompts while the
// others' costs tie with it (four servers with an A100 beside three
// H100s).
func TestNewPromptsGoWhereTheCacheHasRoom(t *testing.T) {
	b := newBal(t, "ttft")
	small := busy("small", 0, 0, 0)
	small.Metrics.NumBlocks = Known(2000)
	b.Update(busy("a", 0, 0, 0), busy("b", 0, 0, 0), busy("c", 0, 0, 0), small)
	count := map[string]int{}
	for i := range 100 {
		count[b.Explain(distinct(i, 2000)).Chosen[0]]++
	}
	if count["small"] > 0 || len(count) != 3 {
		t.Errorf("100 new prompts went %v, want all to a, b and c", count)
	}
}

// A prompt the balancer routed before that no backend holds any more was
// evicted: placed again, it may go to a slower class's cache, which new
// prompts leave empty, rather than evict another prompt among the fast
// ones. Before, an evicted prompt was placed as a new one, and the small
// cache got none of them (4 servers, shared-prefix at x0.25: TTFT p90 281
// -> 182 ms, the median of 24 seeds).
func TestEvictedPromptsMayGoToAnotherClass(t *testing.T) {
	b := newBal(t, "ttft")
	small := busy("small", 0, 0, 0)
	small.Metrics.NumBlocks = Known(2000)
	b.Update(busy("a", 0, 0, 0), busy("b", 0, 0, 0), busy("c", 0, 0, 0), small)
	route := func(req *Request) string {
		req.Guard = b.NewGuard()
		d, err := b.Pick(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Guard.Release()
		return d.Candidates[0].ID
	}
	first := map[string]int{}
	for i := range 100 {
		first[route(distinct(i, 2000))]++
	}
	// 600,000 tokens of other prompts: more than a, b and c hold.
	for i := range 300 {
		route(distinct(1000+i, 2000))
	}
	again := map[string]int{}
	for i := range 100 {
		ex := b.Explain(distinct(i, 2000))
		for _, be := range ex.Backends {
			if be.Candidate != nil && be.Candidate.MatchedBlocks > 0 {
				t.Fatalf("prompt %d still held by %s", i, be.ID)
			}
		}
		again[route(distinct(i, 2000))]++
	}
	if first["small"] > 0 {
		t.Errorf("new prompts went %v, want none to small", first)
	}
	t.Logf("first %v, again %v", first, again)
	if again["small"] < 10 || again["small"] > 45 {
		t.Errorf("evicted prompts went %v, want about a quarter to small", again)
	}
}

// Two balancers that share nothing send a conversation's later turn to the
// same server, though only one of them routed its first turn (and has the
// last few in flight): a turn is
// placed by its conversation (the system prompt and first user message),
// not by what each replica's index happens to hold. Without it, of 1,020
// turns that reached a replica new to their conversation, 520 went
// elsewhere than the conversation's server (llmlb bench --replicas 8
// --workload multi-turn: 0.81 of one replica's hit rate kept).
func TestReplicasFollowAConversation(t *testing.T) {
	r1, r2 := noisyReplicas(t, 0.1)
	sys := strings.Repeat("You are a helpful assistant. ", 200)
	turn := func(c, n int) *Request {
		p := []byte(sys)
		p = fmt.Appendf(p, "user: conversation %d asks %s", c, strings.Repeat("q", 600))
		first := len(p)
		for k := 1; k < n; k++ {
			p = fmt.Appendf(p, " assistant: answer %d %s user: more %d", k, strings.Repeat("a", 800), k)
		}
		return &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100,
			FirstUser: len(sys), FirstTurn: first}
	}
	agree, count := 0, map[string]int{}
	var inFlight []*Guard
	t.Cleanup(func() {
		for _, g := range inFlight {
			g.Release()
		}
	})
	for c := range 40 {
		// r1 routes the first turn; the last four are still in flight.
		req := turn(c, 1)
		req.Guard = r1.NewGuard()
		if _, err := r1.Pick(req, nil); err != nil {
			t.Fatal(err)
		}
		inFlight = append(inFlight, req.Guard)
		if len(inFlight) > 4 {
			inFlight[0].Release()
			inFlight = inFlight[1:]
		}
		for n := 2; n <= 3; n++ {
			req := turn(c, n)
			got := r1.Explain(req).Chosen[0]
			if got == r2.Explain(req).Chosen[0] {
				agree++
			}
			count[got]++
		}
	}
	if agree < 76 {
		t.Errorf("replicas agreed on %d of 80 later turns, want at least 76 (%v)", agree, count)
	}
	for id, n := range count {
		if n > 30 {
			t.Errorf("%s took %d of 80 later turns of 40 conversations on four identical idle servers, over 1.5x its share (%v)", id, n, count)
		}
	}
}

// First turns on a system prompt stay with the prompt's holder while its
// requests are one-off questions (shared-prefix: the questions belong with
// their prefix), and go to their conversations' homes once most of its
// requests are later turns, so that a replica that sees only a later turn
// finds its conversation where the first turn went.
func TestFirstTurnsFollowTheirPrefixUntilConversationsReturn(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("a", 0, 0, 0.1), busy("b", 0, 0, 0.1), busy("c", 0, 0, 0.1), busy("d", 0, 0, 0.1))
	sys := strings.Repeat("You answer questions about one long document. ", 100)
	chat := func(c int, later bool) *Request {
		p := fmt.Appendf([]byte(sys), "user: question %d %s", c, strings.Repeat("q", 600))
		first := len(p)
		if later {
			p = fmt.Appendf(p, " assistant: an answer user: and then?")
		}
		return &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100,
			FirstUser: len(sys), FirstTurn: first}
	}
	pick := func(req *Request) string {
		d, err := b.Pick(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d.Candidates[0].ID
	}
	n := map[string]int{}
	for c := range 40 {
		n[pick(chat(c, false))]++
	}
	if len(n) != 1 {
		t.Errorf("40 one-off questions on one system prompt went to %v, want one holder", n)
	}
	// Now the prompt's conversations come back, three later turns each;
	// the first 20 turn its counts. 120 are counted, so that a fair
	// hash's spread stays well inside the bound (1.5x is 3.2 standard
	// deviations of 120 draws among four).
	n = map[string]int{}
	for c := range 140 {
		if id := pick(chat(1000+c, false)); c >= 20 {
			n[id]++
		}
		for range 3 {
			pick(chat(1000+c, true))
		}
	}
	t.Logf("120 first turns: %v", n)
	for id, k := range n {
		if k > 45 {
			t.Errorf("%s took %d of 120 first turns on a system prompt whose conversations return, over 1.5x its share (%v)", id, k, n)
		}
	}
}

func TestConversationsCountsLaterTurnsPerPrefix(t *testing.T) {
	var c conversations
	const key, other = 0x1234_5678_0000_0042, 0x9999_0000_0000_0042 // one slot, two tags
	for range 3 {
		c.note(key, true)
	}
	if c.mostlyLater(key) {
		t.Error("mostly later after 3 requests, want at least 4 first")
	}
	c.note(key, false)
	if !c.mostlyLater(key) {
		t.Error("3 later turns of 4: not mostly later")
	}
	if c.mostlyLater(other) {
		t.Error("another key in the same slot reads the first one's counts")
	}
	for range 200 { // the prompt's requests turn into one-off questions
		c.note(key, false)
	}
	if c.mostlyLater(key) {
		t.Error("still mostly later after 200 first turns")
	}
	for range 40 {
		c.note(key, true)
	}
	if !c.mostlyLater(key) {
		t.Error("40 later turns after 200 first turns: the counts do not forget")
	}
	c.note(other, true)
	if c.mostlyLater(key) || c.mostlyLater(other) {
		t.Error("a new key in the slot keeps the old key's counts")
	}
}

// Conversations whose first user messages are shorter than a block still
// have keys of their own: the last whole block of a first turn may lie
// inside the system prompt, so the key reads the bytes after it too.
func TestShortFirstMessagesKeepConversationsApart(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("a", 0, 0, 0.1), busy("b", 0, 0, 0.1), busy("c", 0, 0, 0.1), busy("d", 0, 0, 0.1))
	sys := strings.Repeat("You are a helpful assistant. ", 200)
	n := map[string]int{}
	for c := range 120 {
		p := fmt.Appendf([]byte(sys), "user: hi %d", c) // 11-13 bytes
		first := len(p)
		p = append(p, " assistant: hello user: what is due?"...)
		req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100, FirstUser: len(sys), FirstTurn: first}
		d, err := b.Pick(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		n[d.Candidates[0].ID]++
	}
	t.Logf("120 conversations' later turns: %v", n)
	for id, k := range n {
		if k > 45 {
			t.Errorf("%s took %d of 120 conversations with short first messages, over 1.5x its share (%v)", id, k, n)
		}
	}
}

// Requests queued on a server that another balancer sent are guessed to
// be the size of what this one sends there, not this prompt's: a holder
// whose queue is of hits keeps a long prompt it holds (8 replicas,
// mooncake-synthetic: each of a holder's two or three queued requests
// counted at the whole 15,000-30,000-token prompt sent requests off their
// holders, and the replicas kept 0.84-0.92 of one's hit rate).
func TestQueuedRequestsOfOtherBalancersAreGuessedAtWhatWeSendThere(t *testing.T) {
	system := strings.Repeat("s", 4*16000)
	req := &Request{Model: "m", Prompt: []byte(system), PromptTokens: 16000, MaxTokens: 100}
	pick := func(sent int) Explanation {
		t.Helper()
		b := newBal(t, "ttft")
		// The holder's server reports two requests waiting, none of them ours.
		b.Update(busy("holder", 2, 4, 0.1), busy("x", 0, 4, 0.1))
		learnRate(t, b, "holder", 30000)
		learnRate(t, b, "x", 30000)
		b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		for range sent {
			// What we sent the holder lately: hits, 300 tokens to prefill.
			g := b.NewGuard()
			g.Attach(backend(t, b, "holder"), Work{UncachedTokens: 300}, time.Now())
			g.FirstByte(time.Now())
			g.Release()
		}
		return b.Explain(req)
	}
	ex := pick(20)
	if ex.Chosen[0] != "holder" {
		t.Errorf("two queued at the holder, where we send 300-token hits: went to %s (%s), want holder: %+v", ex.Chosen[0], ex.Reason, ex.Backends)
	}
	for _, be := range ex.Backends {
		if be.ID == "holder" && (be.AheadTokens < 500 || be.AheadTokens > 700) {
			t.Errorf("holder's two queued requests count %v tokens ahead, want about 600", be.AheadTokens)
		}
	}
	// Before we sent anything there, they are guessed at this prompt's size.
	for _, be := range pick(0).Backends {
		if be.ID == "holder" && be.AheadTokens != 32000 {
			t.Errorf("nothing sent yet: holder's two queued requests count %v tokens ahead, want 32,000", be.AheadTokens)
		}
	}
}

// Requests queued on a backend are ahead of a new prompt, and the
// scheduler gives its chunked prefill at most one step of what they
// share, so a long prompt's miss charges each of them one step, not its
// whole prefill: a server with three short requests queued beats one
// with 70,000 tokens of prefill ahead. Charged the whole prefill each
// (StepTokens past the prompt's length, as before), the queue outweighed
// the 7 s of prefill (mooncake-conversation, one replica: 468 requests
// kept behind 44,000 tokens of prefill while another server had none).
func TestQueuedRequestsWaitOneStepOfAMiss(t *testing.T) {
	start := strings.Repeat("s", 4*512)
	p := fmt.Appendf([]byte(start), " new conversation %s", strings.Repeat("c", 4*26000))
	pick := func(step int) Explanation {
		t.Helper()
		b := newBal(t, "ttft", func(c *Config, _ *Deps) { c.TTFT.StepTokens = step })
		b.Update(busy("short", 0, 4, 0.1), busy("long", 0, 4, 0.1))
		// Ours, prefilling or queued when the servers were last scraped:
		// three short requests at one, a long prefill at the other.
		attach := func(id string, tokens int) {
			g := b.NewGuard()
			g.Attach(backend(t, b, id), Work{UncachedTokens: tokens}, time.Now())
			t.Cleanup(g.Release)
		}
		for range 3 {
			attach("short", 1000)
		}
		attach("long", 70000)
		b.Update(busy("short", 3, 4, 0.1), busy("long", 0, 4, 0.1))
		for _, id := range []string{"short", "long"} {
			b.pol.index.Insert(backend(t, b, id).slot, b.pol.index.AppendHashes(nil, 0, []byte(start)))
		}
		return b.Explain(&Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100})
	}
	if ex := pick(8192); ex.Chosen[0] != "short" {
		t.Errorf("steps of 8,192 tokens: went to %s (%s), want short: %+v", ex.Chosen[0], ex.Reason, ex.Backends)
	}
	if ex := pick(1 << 20); ex.Chosen[0] != "long" {
		t.Errorf("one step for the whole prompt (each queued request charged all of it): went to %s (%s), want long: %+v", ex.Chosen[0], ex.Reason, ex.Backends)
	}
}
