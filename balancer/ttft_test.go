package balancer

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func TestTTFTPrefersCachedUntilItsQueueCostsMore(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(ready("a", 0, 0, 0.1), ready("b", 0, 0, 0.1))
	prompt := []byte(strings.Repeat("z", 4*4000))
	req := &Request{Model: "m", Prompt: prompt, PromptTokens: 4000}
	d := mustPick(t, b, req, nil)
	first := d.Candidates[0]
	other := "a"
	if first.ID == "a" {
		other = "b"
	}
	d, _ = b.Pick(req, nil)
	if d.Candidates[0] != first || d.Reason != "prefix-hit" {
		t.Fatalf("second identical prompt went to %s (%s), want %s prefix-hit", d.Candidates[0].ID, d.Reason, first.ID)
	}
	// Work ahead on the cached backend: 8000 uncached tokens pending there
	// cost more than prefilling the whole prompt elsewhere.
	g := b.NewGuard()
	g.Attach(first, Work{UncachedTokens: 8000}, time.Now())
	defer g.Release()
	d, _ = b.Pick(req, nil)
	if d.Candidates[0].ID != other {
		t.Errorf("with 8000 tokens queued on the cached backend, picked %s, want %s", d.Candidates[0].ID, other)
	}
}

func TestTTFTEstimateParts(t *testing.T) {
	b := newBal(t, "ttft")
	full := ready("full", 0, 0, 0.9)
	full.Metrics.BlockSize, full.Metrics.NumBlocks = Known(16), Known(100) // 1600 tokens
	zero := ready("zero", 0, 0, 0)
	zero.Metrics.BlockSize, zero.Metrics.NumBlocks = Known(16), Known(0) // capacity unknown: no fit check
	b.Update(full, zero, spec("nometrics", StateReady, "m"))
	ex := b.Explain(&Request{Model: "m", Prompt: []byte(strings.Repeat("q", 4000)), PromptTokens: 1000})
	by := map[string]*Candidate{}
	for _, bd := range ex.Backends {
		by[bd.ID] = bd.Candidate
	}
	cfg := DefaultConfig().TTFT
	wantPrefill := cfg.BaseLatency.Seconds() + 1000/cfg.PrefillRate
	for id, c := range by {
		if !near(c.Prefill, wantPrefill) {
			t.Errorf("%s prefill = %v, want %v", id, c.Prefill, wantPrefill)
		}
	}
	// KV 0.9 is 0.8 of the way from kv_soft 0.5 to full: 0.8 of the
	// penalty, plus one more because 1000+256 tokens do not fit in 160 free.
	if want := 1.8 * cfg.KVPenalty.Seconds(); !near(by["full"].KVPenalty, want) {
		t.Errorf("full KVPenalty = %v, want %v", by["full"].KVPenalty, want)
	}
	if by["zero"].KVPenalty != 0 || by["nometrics"].KVPenalty != 0 {
		t.Errorf("zero capacity / no metrics KVPenalty = %v / %v, want 0", by["zero"].KVPenalty, by["nometrics"].KVPenalty)
	}
	if ex.Chosen[0] == "full" {
		t.Errorf("chose the full backend")
	}
}

func TestTTFTLearnsRate(t *testing.T) {
	var e estimator
	// A backend doing 5000 tokens/s with 50ms fixed latency.
	for i := range 50 {
		work := float64(500 + 100*(i%20))
		e.observe(work, 0, 0.05+work/5000, 1e-4, 0.02)
	}
	got := e.load()
	if math.Abs(got.Rate-5000) > 50 || math.Abs(got.Base-0.05) > 0.005 {
		t.Errorf("learned rate %v base %v, want 5000 and 0.05", got.Rate, got.Base)
	}
	// Queued samples teach the wait per queued request.
	for range 30 {
		e.observe(1000, 4, 0.05+1000.0/5000+4*0.1, 1e-4, 0.02)
	}
	if got := e.load(); math.Abs(got.QueueWait-0.1) > 0.01 {
		t.Errorf("learned queue wait %v, want 0.1", got.QueueWait)
	}
}

func loraSpec(id string, info *LoRAInfo) Spec {
	s := ready(id, 0, 0, 0.1)
	s.Adapters = []Adapter{{Name: "sql", Parent: "m"}}
	s.Metrics.LoRA = info
	return s
}

func TestLoRAAffinity(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(
		loraSpec("full", &LoRAInfo{Max: 1, Running: []string{"other"}}),
		loraSpec("running", &LoRAInfo{Max: 2, Running: []string{"sql"}}),
		loraSpec("free", &LoRAInfo{Max: 2, Running: []string{"other"}}),
		loraSpec("waiting", &LoRAInfo{Max: 1, Running: []string{"other"}, Waiting: []string{"sql"}}),
	)
	req := &Request{Model: "sql", Prompt: []byte("hello"), PromptTokens: 2}
	d := mustPick(t, b, req, nil)
	if d.Candidates[0].ID != "running" || d.Reason != "lora" {
		t.Errorf("adapter request went to %s (%s), want running lora", d.Candidates[0].ID, d.Reason)
	}
	ex := b.Explain(req)
	states := map[string]LoRAState{}
	for _, bd := range ex.Backends {
		states[bd.ID] = bd.LoRA
	}
	want := map[string]LoRAState{"full": LoRAFull, "running": LoRARunning, "free": LoRAFree, "waiting": LoRAWaiting}
	for id, w := range want {
		if states[id] != w {
			t.Errorf("%s LoRA state %v, want %v", id, states[id], w)
		}
	}
	// With no backend running it, the free slot wins.
	b.Remove("running")
	if d := mustPick(t, b, req, nil); d.Candidates[0].ID != "free" {
		t.Errorf("no backend running the adapter: picked %s, want free", d.Candidates[0].ID)
	}
	// An adapter in flight from us counts as running, whatever the scrape.
	g := NewGuard()
	g.Attach(backend(t, b, "waiting"), Work{Adapter: "sql"}, time.Now())
	defer g.Release()
	if d := mustPick(t, b, req, nil); d.Candidates[0].ID != "waiting" {
		t.Errorf("adapter in flight on waiting: picked %s, want waiting", d.Candidates[0].ID)
	}
}

// A popular adapter stays on the server running it, a little busier than
// a server with a free slot, while most servers' slots are full: a copy
// takes a slot the next adapter that runs nowhere would wait for. With
// slots to spare, the free server takes it.
func TestLoRACopyCostsASlotWhenSlotsAreScarce(t *testing.T) {
	lora := func(id string, queued float64, running ...string) Spec {
		s := loraSpec(id, &LoRAInfo{Max: 2, Running: running})
		s.Metrics.Queued = Known(queued)
		return s
	}
	instructions := strings.Repeat("You translate questions into SQL. ", 60)
	ask := func(b *Balancer, q string) string {
		t.Helper()
		d, err := b.Pick(&Request{Model: "sql", Prompt: []byte(instructions + q), PromptTokens: 1000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d.Candidates[0].ID
	}
	for _, tc := range []struct {
		name  string
		fleet []Spec
		want  func(string) bool
	}{
		{"three servers of four full", []Spec{
			lora("holder", 2, "sql", "a"), lora("full1", 0, "b", "c"), lora("full2", 0, "d", "e"), lora("free", 0, "f"),
		}, func(id string) bool { return id == "holder" }},
		{"no server full", []Spec{
			lora("holder", 2, "sql"), lora("full1", 0, "b"), lora("full2", 0, "d"), lora("free", 0, "f"),
		}, func(id string) bool { return id != "holder" }},
	} {
		b := newBal(t, "ttft")
		b.Update(tc.fleet[0])
		if id := ask(b, "How many users?"); id != "holder" {
			t.Fatalf("%s: first request went to %s", tc.name, id)
		}
		b.Update(tc.fleet...)
		if id := ask(b, "Which users joined today?"); !tc.want(id) {
			t.Errorf("%s: the adapter's next request went to %s", tc.name, id)
		}
	}
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
