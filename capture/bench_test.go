package capture

import (
	"bytes"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// BenchmarkRequest is what capture costs one request on its own
// goroutine: hashing its prompt into ids and queueing its line. The
// writer's goroutine encodes and writes the lines beside it.
func BenchmarkRequest(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"1KB", 1 << 10}, {"128KB", 128 << 10}} {
		b.Run(size.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Path = b.TempDir() + "/c"
			w, err := Open(cfg, []byte(testSalt), Options{Metrics: NewMetrics(nil)})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			p := prefix.Parts{Glue: bytes.Repeat([]byte("x"), size.bytes)}
			now := time.Now()
			b.SetBytes(int64(size.bytes))
			b.ReportAllocs()
			for b.Loop() {
				var l Line
				w.Hash(&l, &p, 1)
				l.Arrived, l.InputLength, l.Model, l.API, l.Status = now, size.bytes/4, "llama-3.1-8b", "chat", 200
				w.Add(l)
			}
		})
	}
}

// BenchmarkEncode is the writer goroutine's encoding of one line of a
// 1 KB prompt.
func BenchmarkEncode(b *testing.B) {
	w := &Writer{start: time.Now()}
	l := Line{Arrived: w.start.Add(time.Second), InputLength: 256, OutputLength: 100, HashIDs: []uint64{1 << 52}, Model: "llama-3.1-8b", API: "chat",
		Usage: true, PromptTokens: 256, Backend: "http://10.0.0.5:8000", Status: 200, TTFT: 40 * time.Millisecond, Duration: time.Second}
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = w.appendLine(dst[:0], &l)
	}
}
