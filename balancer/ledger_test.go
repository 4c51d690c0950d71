package balancer

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

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

// A peer replica's requests count as running work and KV use: whole on
// a backend that reports neither, and as their change since the last
// scrape on one that does, since the scrape counted what they had sent
// before it. They never count as queued prefill ahead of a request.
func TestPeersWorkCountsAsRunning(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(spec("a", StateReady, "m"), spec("b", StateReady, "m"))
	peers := Load{InFlight: 5, OpenTokens: 4000}
	backend(t, b, "a").Ledger.SetPeers(peers)
	var a Candidate
	b.fill(&a, backend(t, b, "a"), distinct(1, 100), time.Now())
	if a.InFlight != 5 || a.Running != 5 || a.Queued != 0 || a.PendingTokens != 0 || a.AheadTokens != 0 {
		t.Errorf("no scrape: peers' 5 in flight read as %+v", a)
	}

	// A scrape taken now counts the peers' requests; two more in flight
	// since then, and their 2,000 KV tokens, are what the pick adds.
	b.Update(busy("a", 3, 5, 0.04), busy("b", 0, 0, 0))
	peers = Load{InFlight: 7, OpenTokens: 6000}
	backend(t, b, "a").Ledger.SetPeers(peers)
	a = Candidate{}
	b.fill(&a, backend(t, b, "a"), distinct(3, 100), time.Now())
	if a.Queued != 3 || a.Running != 7 || !near(a.KVUsage.V, 0.04+2000.0/100000) {
		t.Errorf("after a scrape: queued %v running %v kv %v, want 3, 7 and 0.06", a.Queued, a.Running, a.KVUsage.V)
	}
	backend(t, b, "a").Ledger.SetPeers(Load{})
	if got := backend(t, b, "a").Ledger.Peers(); got != (Load{}) {
		t.Errorf("peers cleared: %+v", got)
	}
}

// A model's saturation is the mean of its ready backends' fill toward the
// thresholds, each capped at 1; a backend that is down does not count,
// and what the balancer sent since the scrape does.
func TestModelSaturation(t *testing.T) {
	b := newBal(t, "ttft")
	q := float64(b.cfg.Saturation.Queue)
	down := ready("c", 0, 0, 0)
	down.State = StateDown
	b.Update(ready("a", q/2, 1, 0.1), ready("b", 2*q, 1, 0.1), down)
	got := b.Saturation()
	if len(got) != 1 || got[0].Model != "m" || !near(got[0].Level, 0.75) {
		t.Fatalf("saturation %+v, want m at 0.75 (a half full, b past full, c down)", got)
	}
	for range int(q / 2) {
		g := b.NewGuard()
		g.Attach(backend(t, b, "a"), Work{UncachedTokens: 100}, time.Now())
	}
	if got := b.Saturation(); !near(got[0].Level, 1) {
		t.Errorf("a filled by what was sent since its scrape: %+v, want 1", got)
	}
	b.cfg.Saturation.Queue, b.cfg.Saturation.KV = 0, 0
	if got := b.Saturation(); got != nil {
		t.Errorf("no thresholds: %+v, want none", got)
	}
}
