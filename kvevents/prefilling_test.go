package kvevents

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/sim"
)

// A server's events show the prefills in progress at each step: a
// sequence's run of stored blocks, counted from its first uncached block,
// while it grows by 2 blocks or more a step; a decode's block a step, or
// a run the next step does not extend, is none.
func TestStorePrefillInProgress(t *testing.T) {
	const bs = 4
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewStore()
	s.Now = func() time.Time { return now }
	be := &balancer.Backend{ID: "a"}
	want := func(step string, seqs, tokens int) {
		t.Helper()
		p, ok := s.Prefilling(be)
		if !ok || p.Done != tokens || p.Sequences != seqs || !p.At.Equal(now) {
			t.Errorf("%s: prefilling %+v (%v), want %d sequences, %d tokens at %v", step, p, ok, seqs, tokens, now)
		}
	}
	if _, ok := s.Prefilling(be); ok {
		t.Error("prefilling known before any event")
	}
	a, _ := chain(1, 12, bs, "")
	apply(t, s, "a", a[:4], bs)
	want("first chunk", 1, 4*bs)
	now = now.Add(50 * time.Millisecond)
	apply(t, s, "a", a[4:10], bs)
	want("second chunk", 1, 10*bs)
	// A prompt whose first blocks are cached: its run starts at its first
	// stored block, beside the first sequence's last chunk.
	b, _ := chain(2, 8, bs, "")
	b[0].Parent, b[0].HasParent = a[1].Hash, true
	apply(t, s, "a", b[:5], bs)
	now = now.Add(50 * time.Millisecond)
	apply(t, s, "a", append(a[10:11:11], b[5:8]...), bs)
	want("a decode block beside the second prompt's last chunk", 1, 8*bs)
	now = now.Add(50 * time.Millisecond)
	apply(t, s, "a", a[11:12], bs)
	want("decode blocks alone", 0, 0)
	// A batch of removals alone changes nothing.
	apply(t, s, "a", []sim.KVEvent{{Hash: a[0].Hash}}, bs)
	want("after a removal", 0, 0)
}

// A server prefilling what another balancer sent it is not idle: the
// prefill its events show in progress counts ahead of a new prompt there,
// so distinct new prompts go to the server that is idle (without it, the
// two looked alike and the rendezvous hash sent about half of them to the
// busy one).
func TestPrefillInProgressCountsAhead(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := NewStore()
	s.Now = clock
	bal, err := balancer.New(balancer.DefaultConfig(), balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig()), Events: s, Now: clock}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := func(id string) balancer.Spec {
		u, _ := url.Parse("http://" + id)
		return balancer.Spec{ID: id, URL: u, Engine: "vllm", Models: []string{"m"}, State: balancer.StateReady,
			Metrics: balancer.Metrics{Queued: balancer.Known(0), Running: balancer.Known(1), KVUsage: balancer.Known(0.05),
				BlockSize: balancer.Known(16), NumBlocks: balancer.Known(6250), At: now}}
	}
	bal.Update(spec("busy"), spec("idle"))
	// Two steps of another balancer's prompt, 4,096 tokens each.
	evs, _ := chain(3, 512, 16, "")
	apply(t, s, "busy", evs[:256], 16)
	apply(t, s, "busy", evs[256:], 16)
	for i := range 20 {
		p := fmt.Appendf(nil, "distinct prompt %d ", i)
		p = append(p, strings.Repeat("x", 8000-len(p))...)
		ex := bal.Explain(&balancer.Request{Model: "m", Prompt: p, PromptTokens: 2000, MaxTokens: 100})
		if ex.Chosen[0] != "idle" {
			t.Fatalf("prompt %d went to %s (%s) while it prefills 8,192 tokens: %+v", i, ex.Chosen[0], ex.Reason, ex.Backends)
		}
		for _, b := range ex.Backends {
			if b.ID == "busy" && b.AheadTokens != 8192 {
				t.Errorf("busy: %v tokens ahead, want the 8,192 its events show", b.AheadTokens)
			}
		}
	}
	// Had this balancer sent that prompt, the prefill its events show
	// would be its own pending one, counted once.
	g := bal.NewGuard()
	g.Attach(bal.Snapshot().Backends[0], balancer.Work{UncachedTokens: 16384}, now)
	defer g.Release()
	for _, b := range bal.Explain(&balancer.Request{Model: "m", Prompt: []byte(strings.Repeat("y", 8000)), PromptTokens: 2000}).Backends {
		if b.ID == "busy" && b.AheadTokens != 16384 {
			t.Errorf("busy, prefilling our own request: %v tokens ahead, want its 16,384", b.AheadTokens)
		}
	}
}
