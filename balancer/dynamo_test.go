package balancer

import (
	"strings"
	"testing"
	"time"
)

// decoding attaches a request of tokens uncached prompt tokens to backend
// id and marks its first byte: it is past prefill, its blocks in use.
func decoding(t *testing.T, b *Balancer, id string, tokens int) {
	t.Helper()
	if tokens == 0 {
		return
	}
	g := NewGuard()
	g.Attach(backend(t, b, id), Work{UncachedTokens: tokens}, time.Now())
	g.FirstByte(time.Now())
	t.Cleanup(g.Release)
}

// TestDynamoLowestCostWins: Dynamo's default cost is the prompt tokens a
// worker still has to prefill (its requests with no first token plus this
// prompt's uncached part) plus the blocks of its requests in flight and of
// this prompt, and the lowest wins. With a 4,000-token prompt that warm
// holds whole, warm costs 4,000 + 2 × its pending tokens + its decoding
// ones, cold 8,000 + its own load: the cache hit wins until warm carries
// about 2,000 pending or 4,000 decoding tokens more than cold, then loses
// to the less loaded worker.
func TestDynamoLowestCostWins(t *testing.T) {
	prompt := []byte(strings.Repeat("0123456789abcdef", 1000)) // 16,000 bytes: 250 blocks of 16 tokens
	tests := []struct {
		name                   string
		warmPending, warmDecod int
		coldPending, coldDecod int
		want                   string
	}{
		{"idle: the cache hit", 0, 0, 0, 0, "warm"},
		{"warm decoding 3,000", 0, 3000, 0, 0, "warm"},
		{"warm decoding 5,000", 0, 5000, 0, 0, "cold"},
		{"warm prefilling 1,900", 1900, 0, 0, 0, "warm"},
		{"warm prefilling 2,100: the hit loses", 2100, 0, 0, 0, "cold"},
		{"both loaded, cold much less", 20000, 0, 10000, 0, "cold"},
		{"both loaded, cold a little less", 11000, 0, 10000, 0, "warm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBal(t, "dynamo-kv", presetIndex("dynamo-kv"))
			b.Update(ready("cold", 0, 0, 0), ready("warm", 0, 0, 0))
			b.pol.index.Insert(backend(t, b, "warm").slot, b.pol.index.AppendHashes(nil, 0, prompt))
			pending(t, b, "warm", tt.warmPending)
			decoding(t, b, "warm", tt.warmDecod)
			pending(t, b, "cold", tt.coldPending)
			decoding(t, b, "cold", tt.coldDecod)
			d, err := b.Pick(&Request{Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Candidates[0].ID; got != tt.want {
				t.Errorf("Pick = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestDynamoTiesAndTTL: equal costs go to the worker whose index holds
// the fewest blocks; a prompt is forgotten 120 s after it was last sent.
func TestDynamoTiesAndTTL(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func(c *Config, d *Deps) { d.Now = func() time.Time { return now } }
	b := newBal(t, "dynamo-kv", clock, presetIndex("dynamo-kv"))
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	other := []byte(strings.Repeat("x", 64*10))
	b.pol.index.Insert(backend(t, b, "a").slot, b.pol.index.AppendHashes(nil, 0, other))
	b.pol.index.Insert(backend(t, b, "c").slot, b.pol.index.AppendHashes(nil, 0, other[:64*5]))
	prompt := []byte(strings.Repeat("y", 64*20))
	req := &Request{Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4}
	d, err := b.Pick(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Candidates[0].ID; got != "b" {
		t.Fatalf("cold tie: Pick = %s, want b (holds no blocks)", got)
	}
	matched := func() int {
		for _, be := range b.Explain(req).Backends {
			if be.ID == "b" {
				return be.MatchedBlocks
			}
		}
		return -1
	}
	now = now.Add(119 * time.Second)
	if got := matched(); got != 20 {
		t.Errorf("b's match 119 s later = %d blocks, want 20", got)
	}
	now = now.Add(2 * time.Second)
	if got := matched(); got != 0 {
		t.Errorf("b's match 121 s later = %d blocks, want 0", got)
	}
}
