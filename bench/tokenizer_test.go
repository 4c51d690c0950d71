package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// TestIndexLearnsTheTokenizer runs one llm-d-sim server (32,768 KV tokens)
// whose tokenizer reads 3 or 7 bytes a token, where the balancer assumes 4
// until usage teaches it. Twelve documents come back in turn, one request
// at a time:
//
//   - at 7 bytes a token they fill three quarters of the server's cache,
//     which keeps them all, and 1.3 times the 131 KB an index at 4 bytes a
//     token would remember, which would forget each before it came back;
//   - at 3 bytes a token they are 1.2 times the server's cache, which
//     keeps none of them until it comes back (cyclic access defeats an
//     LRU), and 0.9 of that same index, which would predict each a hit.
//
// The learned rate must be the tokenizer's, and from the second round on
// the balancer's estimate of each request's uncached tokens must be what
// the server really prefilled, within two index blocks.
func TestIndexLearnsTheTokenizer(t *testing.T) {
	for _, c := range []struct {
		bpt, docTokens int // the document's length in the workload's 4-byte tokens
	}{{7, 3584}, {3, 2432}} {
		t.Run(fmt.Sprintf("%d bytes a token", c.bpt), func(t *testing.T) {
			const docs, rounds = 12, 4
			w := &Workload{}
			for i := range docs * rounds {
				w.Requests = append(w.Requests, Request{At: time.Duration(i) * time.Second, MaxTokens: 10, System: 1,
					Parts: []Part{{ID: uint64(1 + i%docs), Tokens: c.docTokens}, {ID: 1000 + uint64(i), Tokens: 20}}})
			}
			bc := balancer.DefaultConfig()
			res, bal, err := runWith(Cluster{Presets: serverPresets(LLMDSim, 1, 0), EngineModel: LLMDSim, Balancer: &bc, Seed: 1, Trace: true,
				Perturb: Perturb{Tokenizer: float64(c.bpt)}}, w)
			if err != nil {
				t.Fatal(err)
			}
			if got := bal.Snapshot().Backends[0].Ledger.BytesPerToken(); got < float64(c.bpt)*0.99 || got > float64(c.bpt)*1.01 {
				t.Errorf("learned %.2f bytes a token, want %d", got, c.bpt)
			}
			trace := slices.Clone(res.Trace)
			slices.SortFunc(trace, func(a, b TraceRecord) int { return a.Request - b.Request })
			if len(trace) != docs*rounds {
				t.Fatalf("%d of %d requests served", len(trace), docs*rounds)
			}
			slack := 2 * 256 / c.bpt // two index blocks, in the server's tokens
			wrong, cached := 0, 0
			for _, r := range trace[docs:] {
				truth := r.PromptTokens - r.CachedTokens
				cached += r.CachedTokens
				if d := r.UncachedTokens - truth; d > slack || d < -slack {
					wrong++
					if wrong <= 3 {
						t.Logf("request %d: estimated %d uncached tokens, the server prefilled %d", r.Request, r.UncachedTokens, truth)
					}
				}
			}
			t.Logf("%d bytes a token: %d of %d later requests estimated wrong; %d tokens served from cache", c.bpt, wrong, len(trace)-docs, cached)
			if wrong > 0 {
				t.Errorf("%d of %d later requests' uncached tokens estimated more than %d tokens off", wrong, len(trace)-docs, slack)
			}
		})
	}
}
