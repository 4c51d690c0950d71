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
	p := &Pick{Req: req, snap: snap}
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

func TestQueueScorer(t *testing.T) {
	tests := []struct {
		name  string
		specs []Spec
		want  map[string]float64
	}{
		{"spread", []Spec{ready("a", 0, 0, 0), ready("b", 5, 0, 0), ready("c", 10, 0, 0)}, map[string]float64{"a": 1, "b": 0.5, "c": 0}},
		{"all equal", []Spec{ready("a", 3, 0, 0), ready("b", 3, 0, 0)}, map[string]float64{"a": 1, "b": 1}},
		{"one backend", []Spec{ready("a", 7, 0, 0)}, map[string]float64{"a": 1}},
		{"no metrics yet counts 0", []Spec{spec("a", StateReady, "m"), ready("b", 4, 0, 0)}, map[string]float64{"a": 1, "b": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBal(t, "epp")
			b.Update(tt.specs...)
			got := pickScores(t, b, QueueScorer{}, &Request{Model: "m"})
			for id, w := range tt.want {
				if !near(got[id], w) {
					t.Errorf("QueueScorer(%s) = %v, want %v", id, got[id], w)
				}
			}
		})
	}
}

func TestKVAndPrefixScorers(t *testing.T) {
	b := newBal(t, "epp")
	b.Update(ready("a", 0, 0, 0.25), ready("b", 0, 0, 1), spec("c", StateReady, "m"))
	got := pickScores(t, b, KVScorer{}, &Request{Model: "m"})
	if !near(got["a"], 0.75) || !near(got["b"], 0) || !near(got["c"], 1) {
		t.Errorf("KVScorer = %v, want a 0.75, b 0 (full), c 1 (unknown)", got)
	}
	prompt := []byte(strings.Repeat("x", 256*10))
	req := &Request{Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4}
	if got := pickScores(t, b, PrefixScorer{}, req); got["a"] != 0 {
		t.Errorf("PrefixScorer before any insert = %v, want 0", got)
	}
	hs := b.pol.index.AppendHashes(nil, 0, prompt)
	b.pol.index.Insert(backend(t, b, "a").slot, hs[:4])
	got = pickScores(t, b, PrefixScorer{}, req)
	if !near(got["a"], 4.0/float64(len(hs))) || got["b"] != 0 {
		t.Errorf("PrefixScorer = %v, want a %v, b 0", got, 4.0/float64(len(hs)))
	}
	short := &Request{Model: "m", Prompt: []byte("hi"), PromptTokens: 1}
	if got := pickScores(t, b, PrefixScorer{}, short); got["a"] != 0 {
		t.Errorf("PrefixScorer(no full block) = %v, want 0", got)
	}
}

func TestEPPWeightsAndRandomTies(t *testing.T) {
	b := newBal(t, "epp")
	// Queue scores a 1, b 0.5, c 0; KV scores a 0.5, b 1, c 1. Queue and
	// KV weigh the same (2 each): a and b tie at 3/7, and the picker's
	// coin decides.
	b.Update(ready("a", 0, 0, 0.5), ready("b", 5, 0, 0), ready("c", 10, 0, 0))
	seen := map[string]int{}
	for range 200 {
		d, err := b.Pick(&Request{Model: "m"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[d.Candidates[0].ID]++
	}
	if seen["a"] < 60 || seen["b"] < 60 || seen["c"] != 0 {
		t.Errorf("tied backends chosen %v times, want both often", seen)
	}
	// A prefix match (weight 3) breaks the tie.
	prompt := []byte(strings.Repeat("y", 64*20))
	hs := b.pol.index.AppendHashes(nil, 0, prompt)
	b.pol.index.Insert(backend(t, b, "b").slot, hs)
	d, _ := b.Pick(&Request{Model: "m", Prompt: prompt, PromptTokens: 320}, nil)
	if d.Candidates[0].ID != "b" || d.Reason != "prefix-hit" {
		t.Errorf("with b holding the prompt: %v %q, want b prefix-hit", ids(d.Candidates), d.Reason)
	}
}

func TestTTFTPrefersCachedUntilItsQueueCostsMore(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(ready("a", 0, 0, 0.1), ready("b", 0, 0, 0.1))
	prompt := []byte(strings.Repeat("z", 4*4000))
	req := &Request{Model: "m", Prompt: prompt, PromptTokens: 4000}
	d, _ := b.Pick(req, nil)
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

func TestTiesAgreeAcrossReplicasAndSpread(t *testing.T) {
	r1, r2 := newBal(t, "ttft"), newBal(t, "ttft")
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

func TestSimplePresets(t *testing.T) {
	t.Run("round-robin", func(t *testing.T) {
		b := newBal(t, "round-robin")
		b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
		var got []string
		for range 6 {
			d, _ := b.Pick(&Request{Model: "m"}, nil)
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
		if d, _ := b.Pick(&Request{Model: "m"}, nil); d.Candidates[0].ID != "b" {
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
			d, _ := b.Pick(&Request{Model: "m"}, nil)
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

func TestConsistentHashIsStickyAndBounded(t *testing.T) {
	b := newBal(t, "consistent-hash")
	var specs []Spec
	for _, id := range []string{"a", "b", "c", "d"} {
		specs = append(specs, ready(id, 0, 0, 0))
	}
	b.Update(specs...)
	home := map[int]string{}
	for i := range 100 {
		d, _ := b.Pick(&Request{Model: "m", Prompt: fmt.Appendf(nil, "prompt %d", i)}, nil)
		home[i] = d.Candidates[0].ID
	}
	// Removing one backend moves only its keys.
	b.Remove("d")
	moved := 0
	for i := range 100 {
		d, _ := b.Pick(&Request{Model: "m", Prompt: fmt.Appendf(nil, "prompt %d", i)}, nil)
		if home[i] != "d" && d.Candidates[0].ID != home[i] {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d keys not on the removed backend moved", moved)
	}
	// Bounded load: with 3 in flight on the key's home (bound 1.25 × 4 / 3
	// = 1.67), the key walks on.
	req := &Request{Model: "m", Prompt: []byte("prompt 1")}
	d, _ := b.Pick(req, nil)
	h := d.Candidates[0]
	for range 3 {
		g := NewGuard()
		g.Attach(h, Work{}, time.Now())
		defer g.Release()
	}
	if d, _ := b.Pick(req, nil); d.Candidates[0] == h {
		t.Errorf("overloaded home %s still chosen", h.ID)
	}
}

func TestSGLangCacheAware(t *testing.T) {
	b := newBal(t, "sglang-cache-aware", func(c *Config, _ *Deps) { c.SGLang.BalanceAbsThreshold = 2 })
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	long := strings.Repeat("shared system prompt ", 50)
	d, _ := b.Pick(&Request{Model: "m", Prompt: []byte(long + "q1")}, nil)
	home := d.Candidates[0]
	if d.Reason != "least-load" {
		t.Errorf("first prompt reason %q, want least-load (nothing matched)", d.Reason)
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte(long + "q2")}, nil)
	if d.Candidates[0] != home || d.Reason != "prefix-hit" {
		t.Errorf("shared prompt went to %s (%s), want %s prefix-hit", d.Candidates[0].ID, d.Reason, home.ID)
	}
	// A miss goes to the least loaded backend, not to the smallest tree
	// (sglang PR #14650).
	g := NewGuard()
	g.Attach(home, Work{}, time.Now())
	defer g.Release()
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte("something else entirely")}, nil)
	if d.Candidates[0] == home || d.Reason != "least-load" {
		t.Errorf("unrelated prompt went to %s (%s), want a least-loaded backend", d.Candidates[0].ID, d.Reason)
	}
	// A holder over 1.5× the mean load and over the mean + 2 spills to the
	// least loaded backend.
	for range 4 {
		g := NewGuard()
		g.Attach(home, Work{}, time.Now())
		defer g.Release()
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte(long + "q3")}, nil)
	if d.Candidates[0] == home || d.Reason != "least-load" {
		t.Errorf("overloaded holder: %s (%s), want a least-loaded backend", d.Candidates[0].ID, d.Reason)
	}
}

func TestSGLangV04CacheAware(t *testing.T) {
	b := newBal(t, "sglang-v04-cache-aware")
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	long := strings.Repeat("shared system prompt ", 50)
	d, _ := b.Pick(&Request{Model: "m", Prompt: []byte(long + "q1")}, nil)
	home := d.Candidates[0]
	if d.Reason != "cache-space" {
		t.Errorf("first prompt reason %q, want cache-space (nothing matched: smallest tree)", d.Reason)
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte(long + "q2")}, nil)
	if d.Candidates[0] != home || d.Reason != "prefix-hit" {
		t.Errorf("shared prompt went to %s (%s), want %s prefix-hit", d.Candidates[0].ID, d.Reason, home.ID)
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte("something else entirely")}, nil)
	if d.Candidates[0] == home || d.Reason != "cache-space" {
		t.Errorf("unrelated prompt went to %s (%s), want a backend with an empty tree", d.Candidates[0].ID, d.Reason)
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
	d, _ := b.Pick(req, nil)
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
	if d, _ := b.Pick(req, nil); d.Candidates[0].ID != "free" {
		t.Errorf("no backend running the adapter: picked %s, want free", d.Candidates[0].ID)
	}
	// An adapter in flight from us counts as running, whatever the scrape.
	g := NewGuard()
	g.Attach(backend(t, b, "waiting"), Work{Adapter: "sql"}, time.Now())
	defer g.Release()
	if d, _ := b.Pick(req, nil); d.Candidates[0].ID != "waiting" {
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

// A first byte that may include a wait for a LoRA slot does not teach
// the backend's prefill estimate: on the emulated 4-server fleet, rare
// adapters waited seconds for a slot behind popular ones, and those times
// taught the estimate a slow server.
func TestSlotWaitDoesNotTeachTheEstimate(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(loraSpec("a", &LoRAInfo{Max: 1, Running: []string{"other"}}))
	be := backend(t, b, "a")
	req := &Request{Model: "sql", Prompt: []byte("hello"), PromptTokens: 2}
	send := func() *Guard {
		t.Helper()
		g := b.NewGuard()
		req.Guard = g
		if _, err := b.Pick(req, nil); err != nil {
			t.Fatal(err)
		}
		return g
	}
	// Every slot held by another adapter.
	g := send()
	g.FirstByte(time.Now().Add(5 * time.Second))
	g.Release()
	if n := be.Ledger.Estimate().Samples; n != 0 {
		t.Errorf("first byte after waiting for a full server's slot: %d samples, want 0", n)
	}
	// Running only by our own request, which has not started.
	first := send()
	defer first.Release()
	g = send()
	g.FirstByte(time.Now().Add(5 * time.Second))
	g.Release()
	if n := be.Ledger.Estimate().Samples; n != 0 {
		t.Errorf("first byte behind our own unstarted request: %d samples, want 0", n)
	}
	// Once one of ours has started (its own wait taught nothing), the
	// adapter runs there.
	first.FirstByte(time.Now().Add(5 * time.Second))
	g = send()
	g.FirstByte(time.Now().Add(50 * time.Millisecond))
	g.Release()
	if n := be.Ledger.Estimate().Samples; n != 1 {
		t.Errorf("first byte with the adapter running: %d samples, want 1", n)
	}
}

func TestSaturatedBackendsAreSkipped(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(ready("busy", 20, 4, 0.5), ready("kvfull", 0, 4, 0.97), ready("ok", 3, 4, 0.5))
	for range 20 {
		if d, _ := b.Pick(&Request{Model: "m"}, nil); d.Candidates[0].ID != "ok" || len(d.Candidates) != 1 {
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

func TestSessionAffinityUnlessSaturated(t *testing.T) {
	b := newBal(t, "round-robin", func(c *Config, _ *Deps) { c.Session.Header = "X-Session" })
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	req := &Request{Model: "m", Session: "s1"}
	d, _ := b.Pick(req, nil)
	home := d.Candidates[0].ID
	for range 5 {
		if d, _ := b.Pick(req, nil); d.Candidates[0].ID != home || d.Reason != "affinity" {
			t.Fatalf("session moved to %s (%s), want %s affinity", d.Candidates[0].ID, d.Reason, home)
		}
	}
	b.Update(ready(home, 50, 0, 0)) // saturated
	if d, _ := b.Pick(req, nil); d.Candidates[0].ID == home {
		t.Errorf("session stayed on saturated %s", home)
	}
}

func TestModelSplitWeights(t *testing.T) {
	b := newBal(t, "ttft")
	b.SetModels([]ModelRoute{{Name: "chat", Targets: []ModelTarget{{Model: "v1", Weight: 90}, {Model: "v2", Weight: 10}}, Priority: 2}})
	n := map[string]int{}
	for range 10000 {
		m, prio := b.Route("chat")
		n[m]++
		if prio != 2 {
			t.Fatalf("priority %d, want 2", prio)
		}
	}
	if share := float64(n["v1"]) / 100; share < 88 || share > 92 {
		t.Errorf("v1 got %.1f%% of 10000 picks, want 90±2", share)
	}
	if m, _ := b.Route("plain"); m != "plain" {
		t.Errorf("unrouted model resolved to %q", m)
	}
}

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
			time.Sleep(time.Millisecond) // a new reading time
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
