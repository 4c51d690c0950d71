package scrape

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzExtract feeds arbitrary pages to every built-in engine row: no panic,
// and a reading never holds a KV fraction or count that is NaN or infinite.
func FuzzExtract(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.txt")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("vllm:num_requests_waiting{engine=\"0\"} 1e400\n"))
	set := engineSet(f, nil)
	f.Fuzz(func(t *testing.T, page []byte) {
		for _, name := range set.Names() {
			r, err := set[name].Extract(page, time.Time{})
			if err != nil {
				continue
			}
			for _, x := range []float64{r.Metrics.Queued.V, r.Metrics.Running.V, r.Metrics.KVUsage.V, r.Metrics.BlockSize.V, r.Metrics.NumBlocks.V} {
				if math.IsNaN(x) || math.IsInf(x, 0) {
					t.Fatalf("%s: non-finite value in %+v", name, r.Metrics)
				}
			}
		}
	})
}
