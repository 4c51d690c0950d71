package balancer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// BenchmarkPick measures one pick on a warm snapshot of n ready backends
// with fresh metrics that all serve the model, for each policy; "prompt"
// adds a 1k-token prompt to hash and match against the prefix index, and
// "prompt-32k" (ttft at 64 backends) a 32k-token one, issue 19's long
// prompt: 128 KB of canonical bytes, the 512 blocks the index looks at.
func BenchmarkPick(b *testing.B) {
	prompt := []byte(strings.Repeat("benchmark prompt text ", 4096/22*4))
	long := []byte(strings.Repeat("benchmark prompt text ", 32<<10*4/22))
	type promptCase struct {
		name   string
		prompt []byte
		parts  PromptParts
		turn   bool // a chat's later turn: the conversation's key is read too
	}
	for _, pol := range []string{"ttft", "epp", "least-request"} {
		for _, n := range []int{8, 64, 512} {
			prompts := []promptCase{{"", nil, nil, false}, {"/prompt", prompt, nil, false}}
			if pol == "ttft" && n == 64 {
				// The proxy's form of a long prompt: its text where it lies
				// in the request body (prefix.Parts), hashed in the pick.
				parts := &prefix.Parts{Refs: []prefix.Ref{{At: 0, Text: long}}}
				prompts = append(prompts, promptCase{"/prompt-32k", long, nil, false}, promptCase{"/prompt-32k-parts", nil, parts, false},
					promptCase{"/chat-turn-32k-parts", nil, parts, true})
			}
			for _, pr := range prompts {
				b.Run(fmt.Sprintf("%s/%d%s", pol, n, pr.name), func(b *testing.B) {
					bal := newBal(b, pol)
					specs := make([]Spec, n)
					for i := range specs {
						specs[i] = ready(fmt.Sprintf("b%03d", i), float64(i%5), 3, 0.3)
						specs[i].Metrics.At = time.Now()
					}
					bal.Update(specs...)
					dst := make([]*Backend, 0, 8)
					req := &Request{Model: "m", Prompt: pr.prompt, Parts: pr.parts, PromptTokens: len(pr.prompt) / 4}
					if pr.parts != nil {
						req.PromptTokens = pr.parts.Len() / 4
					}
					if pr.turn { // a first turn ending 100 bytes into a block
						req.FirstUser, req.FirstTurn = 20000, 24100
					}
					b.ReportAllocs()
					for b.Loop() {
						d, err := bal.Pick(req, dst)
						if err != nil {
							b.Fatal(err)
						}
						dst = d.Candidates
					}
				})
			}
		}
	}
}

// BenchmarkPickLongPromptParallel picks for a 32k-token prompt among 64
// ready backends on the default policy as the proxy does, a guard attached
// in the pick and released after, on every core at once: time spent under
// a lock that every pick shares shows as time per pick.
func BenchmarkPickLongPromptParallel(b *testing.B) {
	prompt := []byte(strings.Repeat("benchmark prompt text ", 32<<10*4/22))
	bal := newBal(b, DefaultConfig().Policy)
	specs := make([]Spec, 64)
	for i := range specs {
		specs[i] = ready(fmt.Sprintf("b%03d", i), float64(i%5), 3, 0.3)
	}
	bal.Update(specs...)
	b.SetBytes(int64(len(prompt)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]*Backend, 0, 8)
		for pb.Next() {
			g := bal.NewGuard()
			d, err := bal.Pick(&Request{Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4, Guard: g}, dst)
			if err != nil {
				b.Fatal(err)
			}
			g.Release()
			dst = d.Candidates
		}
	})
}
