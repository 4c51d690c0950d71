package balancer

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkPick measures one pick on a warm snapshot of n ready backends
// with fresh metrics that all serve the model, for each policy; "prompt"
// adds a 1k-token prompt to hash and match against the prefix index.
func BenchmarkPick(b *testing.B) {
	prompt := []byte(strings.Repeat("benchmark prompt text ", 4096/22*4))
	for _, pol := range []string{"ttft", "epp", "least-request"} {
		for _, n := range []int{8, 64, 512} {
			for _, withPrompt := range []bool{false, true} {
				name := fmt.Sprintf("%s/%d", pol, n)
				if withPrompt {
					name += "/prompt"
				}
				b.Run(name, func(b *testing.B) {
					bal := newBal(b, pol)
					specs := make([]Spec, n)
					for i := range specs {
						specs[i] = ready(fmt.Sprintf("b%03d", i), float64(i%5), 3, 0.3)
						specs[i].Metrics.At = time.Now()
					}
					bal.Update(specs...)
					dst := make([]*Backend, 0, 8)
					req := &Request{Model: "m"}
					if withPrompt {
						req.Prompt, req.PromptTokens = prompt, len(prompt)/4
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
