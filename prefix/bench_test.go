package prefix

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkHashPrompt measures canonicalising and hashing a chat request of
// 4k and 32k tokens (about 4 bytes a token) at the default block size.
func BenchmarkHashPrompt(b *testing.B) {
	for _, tokens := range []int{4 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("%dk", tokens>>10), func(b *testing.B) {
			msgs := json.RawMessage("[" + msgJSON("system", longText("sys", tokens*3)) + "," + msgJSON("user", longText("q", tokens)) + "]")
			x := NewIndex(Config{MaxBlocks: 1 << 20})
			seed := Seed("m", "")
			var buf []byte
			var hs []uint64
			b.SetBytes(int64(tokens * 4))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = AppendChat(buf[:0], msgs, nil); err != nil {
					b.Fatal(err)
				}
				hs = x.AppendHashes(hs[:0], seed, buf)
			}
		})
	}
}

// BenchmarkHashBytes measures the hash chain alone over canonical bytes.
func BenchmarkHashBytes(b *testing.B) {
	for _, tokens := range []int{4 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("%dk", tokens>>10), func(b *testing.B) {
			data := []byte(longText("x", tokens*4))
			var hs []uint64
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				hs = AppendHashes(hs[:0], 1, data, 256, 1<<20)
			}
		})
	}
}

// BenchmarkIndexMatch looks up a 512-block prompt of which 16 backends hold
// the first 256 blocks, in an index holding 16k blocks per backend.
func BenchmarkIndexMatch(b *testing.B) {
	x := NewIndex(Config{BlockBytes: 256, FallbackEntries: 16 << 10})
	hs := make([]uint64, 512)
	for i := range hs {
		hs[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for s := range 16 {
		x.Insert(s, hs[:256])
		filler := make([]uint64, 16<<10-256)
		for i := range filler {
			filler[i] = uint64(s)<<40 | uint64(i)
		}
		x.Insert(s, filler)
	}
	dst := make([]int32, 16)
	b.ReportAllocs()
	for b.Loop() {
		clear(dst)
		if x.Match(hs, dst) != 256 {
			b.Fatal("wrong match")
		}
	}
}

// BenchmarkIndexInsert inserts a fresh 128-block prompt into a full LRU.
func BenchmarkIndexInsert(b *testing.B) {
	x := NewIndex(Config{BlockBytes: 256, FallbackEntries: 16 << 10})
	hs := make([]uint64, 128)
	n := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		for i := range hs {
			n++
			hs[i] = n
		}
		x.Insert(0, hs)
	}
}

// BenchmarkIndexMemory reports the heap bytes one remembered block costs,
// which [EntryBytes] estimates.
func BenchmarkIndexMemory(b *testing.B) {
	const n = 200_000
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		x := NewIndex(Config{BlockBytes: 256, FallbackEntries: n})
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = uint64(i) * 0x9e3779b97f4a7c15
		}
		x.Insert(0, hs)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc-uint64(8*n))/n, "bytes/entry")
		runtime.KeepAlive(x)
	}
}
