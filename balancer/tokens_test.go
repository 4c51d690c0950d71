package balancer

import (
	"fmt"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// usageBal is a ttft balancer over one backend of 16,000 KV tokens, with
// its prefix index at hand.
func usageBal(t *testing.T) (*Balancer, *prefix.Index) {
	idx := prefix.NewIndex(prefix.DefaultConfig())
	b := newBal(t, "ttft", func(_ *Config, d *Deps) { d.Index = idx })
	s := busy("a", 0, 0, 0)
	s.Metrics.NumBlocks = Known(1000)
	b.Update(s)
	return b, idx
}

// send picks req and reports the answer's usage, the server counting bpt
// bytes a token and serving cached tokens from its cache.
func send(t *testing.T, b *Balancer, req *Request, bpt, cached int) {
	t.Helper()
	req.Guard = b.NewGuard()
	if _, err := b.Pick(req, nil); err != nil {
		t.Fatal(err)
	}
	req.Guard.Usage(Usage{PromptTokens: len(req.Prompt) / bpt, CachedTokens: cached, CachedKnown: true})
	req.Guard.Release()
}

// TestUsageSizesTheIndex: the answers' prompt_tokens teach the backend's
// bytes per token, which sizes its LRU: 16,000 KV tokens hold 48,000
// bytes of prompt at 3 bytes a token (187 blocks of 256) and 112,000 at 7
// (437), where 4 would make 250.
func TestUsageSizesTheIndex(t *testing.T) {
	for _, bpt := range []int{3, 7} {
		t.Run(fmt.Sprint(bpt), func(t *testing.T) {
			b, idx := usageBal(t)
			for i := range 60 { // 15 blocks each, 900 in all
				send(t, b, distinct(i, 1000), bpt, 0)
			}
			want := 16000 * bpt / 256
			if got := b.Snapshot().Backends[0].Ledger.BytesPerToken(); got < float64(bpt) || got > float64(bpt)*1.01 {
				t.Errorf("learned %.2f bytes a token, want %d", got, bpt)
			}
			if n, _ := idx.Stats(); n < want-15 || n > want {
				t.Errorf("the index holds %d blocks, want the %d the backend's cache holds at %d bytes a token", n, want, bpt)
			}
		})
	}
}

// TestCachedTokensCorrectTheIndex: where the backend keeps less than the
// index remembers (it answers with no cached tokens what the index says
// it holds), the index shrinks; where it keeps more (it serves from cache
// prompts the index dropped), the index grows; a hit on a prompt this
// balancer never sent there moves nothing.
func TestCachedTokensCorrectTheIndex(t *testing.T) {
	for _, bpt := range []int{3, 7} {
		full := 16000 * bpt / 256
		tokens := func(req *Request) int { return len(req.Prompt) / bpt }
		t.Run(fmt.Sprintf("%d less", bpt), func(t *testing.T) {
			b, idx := usageBal(t)
			for i := range 16 {
				send(t, b, distinct(i, 1000), bpt, 0)
				send(t, b, distinct(i, 1000), bpt, 0) // the index said held: a miss it predicted
			}
			fit := b.Snapshot().Backends[0].Ledger.IndexFit()
			for i := range 100 {
				send(t, b, distinct(1000+i, 1000), bpt, 0)
			}
			n, _ := idx.Stats()
			t.Logf("fit %.3f, %d blocks of %d", fit, n, full)
			if fit >= 0.95 || float64(n) > fit*float64(full)+1 {
				t.Errorf("after 16 predicted misses: fit %.3f, %d blocks held; want the fit below 0.95 and the index at most %.0f blocks", fit, n, fit*float64(full))
			}
		})
		t.Run(fmt.Sprintf("%d more", bpt), func(t *testing.T) {
			b, idx := usageBal(t)
			for i := range 60 {
				send(t, b, distinct(i, 1000), bpt, 0)
			}
			for i := range 200 { // a hit on what another balancer sent: no verdict
				req := distinct(5000+i, 1000)
				send(t, b, req, bpt, tokens(req))
			}
			if fit := b.Snapshot().Backends[0].Ledger.IndexFit(); fit != 1 {
				t.Errorf("hits on prompts never sent there moved the fit to %.3f", fit)
			}
			// A cycle of prompts 1.3 times what the index holds, each
			// served whole from cache when it comes back, though the index
			// had dropped it.
			cycle := full * 13 / 10 / 15
			for i := range 4 * cycle {
				req := distinct(3000+i%cycle, 1000)
				cached := 0
				if i >= cycle {
					cached = tokens(req)
				}
				send(t, b, req, bpt, cached)
			}
			fit := b.Snapshot().Backends[0].Ledger.IndexFit()
			for i := range 100 {
				send(t, b, distinct(2000+i, 1000), bpt, 0)
			}
			n, _ := idx.Stats()
			t.Logf("fit %.3f, %d blocks of %d", fit, n, full)
			if fit <= 1.05 || float64(n) < fit*float64(full)-15 {
				t.Errorf("after 3 rounds of unpredicted hits: fit %.3f, %d blocks held; want the fit above 1.05 and the index about %.0f blocks", fit, n, fit*float64(full))
			}
		})
	}
}
