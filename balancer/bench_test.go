package balancer

import (
	"fmt"
	"testing"
)

// BenchmarkPick measures one pick on a warm snapshot of n ready backends
// that all serve the model.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			bal := newBal(b, "ttft")
			specs := make([]Spec, n)
			for i := range specs {
				specs[i] = spec(fmt.Sprintf("b%03d", i), StateReady, "m")
			}
			bal.Update(specs...)
			dst := make([]*Backend, 0, n)
			req := &Request{Model: "m"}
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
