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

// benchBlocks is issue 19's long prompt: 512 blocks, the default
// MaxBlocks, about 32k tokens at 256-byte blocks.
const benchBlocks = 512

// mix spreads a counter over 64 bits as block hashes are spread.
func mix(n uint64) uint64 {
	n += 0x9e3779b97f4a7c15
	n = (n ^ n>>30) * 0xbf58476d1ce4e5b9
	n = (n ^ n>>27) * 0x94d049bb133111eb
	return n ^ n>>31
}

// fullIndex returns an index of n backends at the default 16384 entries
// each, every LRU full of unrelated blocks, as a busy balancer's is, and
// the counter mix has reached.
func fullIndex(n int) (*Index, uint64) {
	x := NewIndex(Config{BlockBytes: 256})
	var c uint64
	hs := make([]uint64, benchBlocks)
	for s := range n {
		for range DefaultConfig().FallbackEntries / benchBlocks {
			for i := range hs {
				c++
				hs[i] = mix(c)
			}
			x.Insert(s, hs)
		}
	}
	return x, c
}

// newBlocks fills hs with blocks no backend holds, counting on from c,
// and returns where it stopped.
func newBlocks(hs []uint64, c uint64) uint64 {
	for i := range hs {
		c++
		hs[i] = mix(c)
	}
	return c
}

// BenchmarkIndexInsert inserts a 512-block prompt into one backend of an
// index whose every backend's LRU is full: "new" is a prompt no backend
// holds (each block evicts one), "held" one the backend already holds
// (each block is re-touched).
func BenchmarkIndexInsert(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("new/backends-%d", n), func(b *testing.B) {
			x, c := fullIndex(n)
			hs := make([]uint64, benchBlocks)
			s := 0
			b.ReportAllocs()
			for b.Loop() {
				c = newBlocks(hs, c)
				x.Insert(s, hs)
				s = (s + 1) % n
			}
		})
		b.Run(fmt.Sprintf("held/backends-%d", n), func(b *testing.B) {
			x, c := fullIndex(n)
			hs := make([]uint64, benchBlocks)
			for i := range hs {
				hs[i] = mix(c + 1 + uint64(i))
			}
			x.Insert(n/2, hs)
			b.ReportAllocs()
			for b.Loop() {
				x.Insert(n/2, hs)
			}
		})
	}
}

// BenchmarkIndexChat is issue 19's 220 KB chat workload at the index, one
// Match (the pick) and one Insert (the request sent) a request: a client's
// first request inserts a 512-block prompt no backend holds into a full
// LRU (each block evicts one), and its next three requests match and
// re-insert the same blocks (each block is re-touched). "in-turn" runs a client's
// four requests back to back; "interleaved" has the requests of four
// clients alternate on a backend, as 150 concurrent clients do, so each
// re-inserted run sits, contiguous, below the runs inserted since.
func BenchmarkIndexChat(b *testing.B) {
	const n = 8
	b.Run(fmt.Sprintf("in-turn/backends-%d", n), func(b *testing.B) {
		x, c := fullIndex(n)
		hs := make([]uint64, benchBlocks)
		dst := make([]int32, n)
		s := 0
		b.ReportAllocs()
		for b.Loop() {
			c = newBlocks(hs, c)
			for range 4 {
				clear(dst)
				x.Match(hs, dst)
				x.Insert(s, hs)
			}
			s = (s + 1) % n
		}
	})
	b.Run(fmt.Sprintf("interleaved/backends-%d", n), func(b *testing.B) {
		x, c := fullIndex(n)
		// prompts[s][k] is the prompt of the client on slot s that
		// made its first request k turns ago.
		var prompts [n][4][]uint64
		for s := range prompts {
			for k := range prompts[s] {
				prompts[s][k] = make([]uint64, benchBlocks)
				c = newBlocks(prompts[s][k], c)
				x.Insert(s, prompts[s][k])
			}
		}
		dst := make([]int32, n)
		s := 0
		b.ReportAllocs()
		for b.Loop() {
			p := &prompts[s]
			p[0], p[1], p[2], p[3] = p[3], p[0], p[1], p[2]
			c = newBlocks(p[0], c)
			for _, hs := range p {
				clear(dst)
				x.Match(hs, dst)
				x.Insert(s, hs)
			}
			s = (s + 1) % n
		}
	})
}

// BenchmarkIndexMatch looks up a 512-block prompt in the same full index:
// "new" is a prompt no backend holds (the walk stops at the first block),
// "held" one that one backend holds whole after a 64-block system prompt
// that every backend holds.
func BenchmarkIndexMatch(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("new/backends-%d", n), func(b *testing.B) {
			x, c := fullIndex(n)
			hs := make([]uint64, benchBlocks)
			dst := make([]int32, n)
			b.ReportAllocs()
			for b.Loop() {
				for i := range hs {
					c++
					hs[i] = mix(c)
				}
				clear(dst)
				if x.Match(hs, dst) != 0 {
					b.Fatal("wrong match")
				}
			}
		})
		b.Run(fmt.Sprintf("held/backends-%d", n), func(b *testing.B) {
			x, c := fullIndex(n)
			hs := make([]uint64, benchBlocks)
			for i := range hs {
				hs[i] = mix(c + 1 + uint64(i))
			}
			for s := range n {
				x.Insert(s, hs[:64])
			}
			x.Insert(n/2, hs)
			dst := make([]int32, n)
			b.ReportAllocs()
			for b.Loop() {
				clear(dst)
				if x.Match(hs, dst) != benchBlocks || dst[0] != 64 {
					b.Fatal("wrong match")
				}
			}
		})
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
