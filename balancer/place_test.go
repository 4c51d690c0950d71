package balancer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// replicated is a ttft balancer among replicas that share no state
// ([TTFTConfig.Replicated]).
func replicated(t testing.TB) *Balancer {
	return newBal(t, "ttft", func(c *Config, _ *Deps) { c.TTFT.Replicated = true })
}

func TestTiesAgreeAcrossReplicasAndSpread(t *testing.T) {
	r1, r2 := replicated(t), replicated(t)
	specs := []Spec{ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0), ready("d", 0, 0, 0)}
	r1.Update(specs...)
	r2.Update(specs...)
	count := map[string]int{}
	for i := range 400 {
		req := &Request{Model: "m", Prompt: fmt.Appendf(nil, "conversation %d %s", i, strings.Repeat("p", 300)), PromptTokens: 80}
		d1, _ := r1.Explain(req), 0
		d2 := r2.Explain(req)
		if d1.Chosen[0] != d2.Chosen[0] {
			t.Fatalf("replicas disagree on prompt %d: %s vs %s", i, d1.Chosen[0], d2.Chosen[0])
		}
		count[d1.Chosen[0]]++
	}
	for id, n := range count {
		if n < 60 {
			t.Errorf("idle ties spread unevenly: %s got %d of 400 (%v)", id, n, count)
		}
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
	r1, r2 := replicated(t), replicated(t)
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
	r1, r2 = replicated(t), replicated(t)
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

// A prompt one backend holds is not copied to another for a slightly
// faster first token: the copy stays in both caches while the prompt's
// requests keep coming to either (8 servers at shared-prefix x4: a third
// of the prefixes copied, KV full where they landed, 47-105 preemptions).
func TestHolderSlightlySlowerKeepsItsPrompt(t *testing.T) {
	b := newBal(t, "ttft")
	// y, as busy as the holder, keeps it within the load bound.
	b.Update(busy("holder", 0, 70, 0.3), busy("x", 0, 10, 0.3), busy("y", 0, 70, 0.3))
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

// A holder whose batch would slow the request's decode keeps its prompt
// when, but for that slowdown, it would give the first token sooner than
// a copy: the batch drains within seconds, the copy stays in both caches.
// An adapter's request still leaves it for another server running the
// adapter.
func TestHolderWithABigBatchKeepsItsPrompt(t *testing.T) {
	system := strings.Repeat("g", 4*3000)
	p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 2400))
	for _, tc := range []struct {
		model, want string
	}{{"m", "holder"}, {"sql", "x"}} {
		b := newBal(t, "ttft")
		holder, x := busy("holder", 0, 50, 0.3), busy("x", 0, 0, 0.3)
		for _, s := range []*Spec{&holder, &x} {
			s.Adapters = []Adapter{{Name: "sql", Parent: "m"}}
			s.Metrics.LoRA = &LoRAInfo{Max: 2, Running: []string{"sql"}}
		}
		b.Update(holder, x)
		b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		req := &Request{Model: tc.model, Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 1000}
		ex := b.Explain(req)
		slow := map[string]float64{}
		for _, be := range ex.Backends {
			slow[be.ID] = be.Cost - be.DecodeSlowdown
		}
		if slow["holder"] >= slow["x"] {
			t.Fatalf("%s: without the decode slowdown the holder costs %.3f s, x %.3f s; the test wants the holder cheaper: %+v", tc.model, slow["holder"], slow["x"], ex.Backends)
		}
		if ex.Chosen[0] != tc.want {
			t.Errorf("%s: went to %s (%s), want %s: %+v", tc.model, ex.Chosen[0], ex.Reason, tc.want, ex.Backends)
		}
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
	b := replicated(t)
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

// A balancer alone spreads new prompts evenly: each of four identical
// servers takes five of twenty new prompt groups, where a hash of each
// group's first block (what replicas that share no state must agree on)
// gives some servers more groups than their caches may hold.
func TestAloneSpreadsNewPromptsEvenly(t *testing.T) {
	groups := func(b *Balancer) map[string]int {
		b.Update(busy("a", 0, 0, 0.1), busy("b", 0, 0, 0.1), busy("c", 0, 0, 0.1), busy("d", 0, 0, 0.1))
		n := map[string]int{}
		for g := range 20 {
			d, err := b.Pick(distinct(g, 3000), nil)
			if err != nil {
				t.Fatal(err)
			}
			n[d.Candidates[0].ID]++
		}
		return n
	}
	alone := groups(newBal(t, "ttft"))
	for _, id := range []string{"a", "b", "c", "d"} {
		if alone[id] != 5 {
			t.Errorf("alone, 20 new prompt groups went %v, want 5 to each", alone)
			break
		}
	}
	if hashed := groups(replicated(t)); hashed["a"] == 5 && hashed["b"] == 5 && hashed["c"] == 5 {
		t.Errorf("replicated, the groups went %v: the test's prompts do not tell the rules apart", hashed)
	}
}

// A balancer alone sends a conversation's later turn where its earlier
// turns went, by what its index knows, not by a hash of the conversation.
func TestAloneFollowsAConversation(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("a", 0, 0, 0.1), busy("b", 0, 0, 0.1), busy("c", 0, 0, 0.1), busy("d", 0, 0, 0.1))
	sys := strings.Repeat("You are a helpful assistant. ", 200)
	turn := func(c, n int) *Request {
		p := fmt.Appendf([]byte(sys), "user: conversation %d asks %s", c, strings.Repeat("q", 600))
		first := len(p)
		for k := 1; k < n; k++ {
			p = fmt.Appendf(p, " assistant: answer %d %s user: more %d", k, strings.Repeat("a", 800), k)
		}
		return &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100, FirstUser: len(sys), FirstTurn: first}
	}
	for c := range 20 {
		at := ""
		for n := 1; n <= 3; n++ {
			d, err := b.Pick(turn(c, n), nil)
			if err != nil {
				t.Fatal(err)
			}
			if id := d.Candidates[0].ID; at != "" && id != at {
				t.Fatalf("conversation %d: turn %d went to %s, its earlier turns to %s (%s)", c, n, id, at, d.Reason)
			} else {
				at = id
			}
		}
	}
}

// Alone, new prompts spread by their tokens: groups of 1,000 and 6,000
// tokens, one after another, leave no server with twice another's share,
// where taking turns would give two servers every long group.
func TestAloneSpreadsNewPromptTokens(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(busy("a", 0, 0, 0.1), busy("b", 0, 0, 0.1), busy("c", 0, 0, 0.1), busy("d", 0, 0, 0.1))
	tokens := map[string]int{}
	for g := range 24 {
		n := 1000
		if g%2 == 1 {
			n = 6000
		}
		d, err := b.Pick(distinct(g, n), nil)
		if err != nil {
			t.Fatal(err)
		}
		tokens[d.Candidates[0].ID] += n
	}
	least, most := math.MaxInt, 0
	for _, id := range []string{"a", "b", "c", "d"} {
		least, most = min(least, tokens[id]), max(most, tokens[id])
	}
	if most > 2*least {
		t.Errorf("new prompt tokens by server: %v, want none with twice another's", tokens)
	}
}

// Alone, an adapter's new prompts go by the rendezvous hash as among
// replicas, not spread by tokens: spread, they went to servers that must
// load the adapter (lora, 4 vllm-v1 servers at x2: TTFT p90 7.63 s against
// 476 ms).
func TestAloneAdapterPromptsGoByHash(t *testing.T) {
	place := func(b *Balancer) []string {
		b.Update(loraSpec("a", &LoRAInfo{Max: 4, Running: []string{"sql"}}), loraSpec("b", &LoRAInfo{Max: 4}),
			loraSpec("c", &LoRAInfo{Max: 4, Running: []string{"sql"}}), loraSpec("d", &LoRAInfo{Max: 4}))
		var out []string
		for g := range 16 {
			req := distinct(g, 2000)
			req.Model = "sql"
			d, err := b.Pick(req, nil)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d.Candidates[0].ID)
		}
		return out
	}
	if alone, hashed := place(newBal(t, "ttft")), place(replicated(t)); !slices.Equal(alone, hashed) {
		t.Errorf("an adapter's new prompts went %v alone, %v by the hash", alone, hashed)
	}
}
