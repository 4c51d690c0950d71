package balancer

import (
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

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
	d := mustPick(t, b, &Request{Model: "m", Prompt: prompt, PromptTokens: 320}, nil)
	if d.Candidates[0].ID != "b" || d.Reason != "prefix-hit" {
		t.Errorf("with b holding the prompt: %v %q, want b prefix-hit", ids(d.Candidates), d.Reason)
	}
}

// TestNoHitLRUSpreadsColdRequests: with nothing cached anywhere, llm-d's
// no-hit-lru scorer sends each new prompt to the backend that took a cold
// request longest ago, so four distinct prompts land on four backends.
func TestNoHitLRUSpreadsColdRequests(t *testing.T) {
	b := newBal(t, "llm-d-load")
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0), ready("d", 0, 0, 0))
	seen := map[string]bool{}
	for i := range 4 {
		p := []byte(strings.Repeat(string(rune('p'+i)), 600))
		d, err := b.Pick(&Request{Model: "m", Prompt: p, PromptTokens: 150}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[d.Candidates[0].ID] = true
	}
	if len(seen) != 4 {
		t.Errorf("4 cold prompts went to %d backends, want 4", len(seen))
	}
}

// presetIndex gives a test balancer the prefix index of preset name, cut
// and sized as serve cuts it.
func presetIndex(name string) func(*Config, *Deps) {
	return func(_ *Config, d *Deps) {
		pr, _ := LookupPreset(name)
		s := pr.Index
		d.Index = prefix.NewIndex(prefix.Config{BlockBytes: s.BlockBytes, MaxBlocks: s.MaxBlocks, FallbackEntries: s.Entries,
			Partial: s.Partial, EntriesPerEngineBlock: s.EntriesPerEngineBlock, HeadFirst: s.HeadFirst, TTL: s.TTL, Now: d.Now})
	}
}

// pending attaches a request of tokens uncached prompt tokens, with no
// first byte yet, to backend id.
func pending(t *testing.T, b *Balancer, id string, tokens int) {
	t.Helper()
	if tokens == 0 {
		return
	}
	g := NewGuard()
	g.Attach(backend(t, b, id), Work{UncachedTokens: tokens}, time.Now())
	t.Cleanup(g.Release)
}

// TestLLMDOptimizedStickyUntilSaturated: llm-d's prefix-cache-affinity
// filter keeps the request on the backend holding its prompt while that
// backend's in-flight uncached tokens, at 15,928 tokens/s, put it less
// than 18 s behind the best other backend (about 286,700 tokens), though
// the token-load scorer alone would prefer an idle backend; past that the
// filter opens and the least token load wins. A backend holding under 0.8
// of the prompt is not sticky.
func TestLLMDOptimizedStickyUntilSaturated(t *testing.T) {
	prompt := []byte(strings.Repeat("a system prompt shared by a conversation ", 400))
	tests := []struct {
		name     string
		share    float64 // of the prompt's blocks warm holds
		load     map[string]int
		wantWarm bool
	}{
		{"warm idle", 1, nil, true},
		{"warm 17.6 s behind", 1, map[string]int{"warm": 280000}, true},
		{"warm 18.2 s behind", 1, map[string]int{"warm": 290000}, false},
		{"penalty against the best cold one", 1, map[string]int{"warm": 290000, "cold1": 20000, "cold2": 30000}, true},
		{"under the affinity threshold", 0.7, map[string]int{"warm": 5000}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBal(t, "llm-d-optimized", presetIndex("llm-d-optimized"))
			b.Update(ready("cold1", 0, 0, 0), ready("warm", 0, 0, 0), ready("cold2", 0, 0, 0))
			hs := b.pol.index.AppendHashes(nil, 0, prompt)
			b.pol.index.Insert(backend(t, b, "warm").slot, hs[:int(tt.share*float64(len(hs)))])
			for id, tokens := range tt.load {
				pending(t, b, id, tokens)
			}
			for range 20 {
				d, err := b.Pick(&Request{Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := d.Candidates[0].ID == "warm"; got != tt.wantWarm {
					t.Fatalf("Pick = %s, warm chosen %v, want %v", d.Candidates[0].ID, got, tt.wantWarm)
				}
			}
		})
	}
}

// TestTokenLoadScorer: 1 − (in-flight uncached prompt tokens + this
// request's uncached tokens) / 4,194,304, floored at 0.
func TestTokenLoadScorer(t *testing.T) {
	b := newBal(t, "llm-d-optimized")
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	pending(t, b, "b", 1048576-1000)
	pending(t, b, "c", 5000000)
	got := pickScores(t, b, TokenLoadScorer{}, &Request{Model: "m", Prompt: []byte("hi"), PromptTokens: 1000})
	if !near(got["a"], 1-1000.0/4194304) || !near(got["b"], 0.75) || got["c"] != 0 {
		t.Errorf("TokenLoadScorer = %v, want a %v, b 0.75, c 0", got, 1-1000.0/4194304)
	}
}
