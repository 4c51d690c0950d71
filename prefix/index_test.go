package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// modelIndex is the index's specification in its plainest form: per slot,
// a list of the blocks held, most recently used first.
type modelIndex struct {
	cfg        Config
	blockBytes int
	resets     int64
	slots      map[int]*modelSlot
	engBlock   map[int]int
}

type modelSlot struct {
	order []uint64 // most recent first
	size  int
}

func newModel(cfg Config) *modelIndex {
	bb := cfg.BlockBytes
	if bb == 0 {
		bb = autoBlockBytes(16)
	}
	return &modelIndex{cfg: cfg, blockBytes: bb, slots: map[int]*modelSlot{}, engBlock: map[int]int{}}
}

func (m *modelIndex) slot(s int) *modelSlot {
	if m.slots[s] == nil {
		m.slots[s] = &modelSlot{size: m.cfg.FallbackEntries}
	}
	return m.slots[s]
}

func (m *modelIndex) insert(s int, hs []uint64) {
	if len(hs) == 0 {
		return
	}
	l := m.slot(s)
	if m.cfg.HeadFirst {
		// Each block in turn marked most recent: the last ends first.
		for _, h := range hs {
			if i := slices.Index(l.order, h); i >= 0 {
				l.order = slices.Delete(l.order, i, i+1)
			}
			l.order = slices.Insert(l.order, 0, h)
			if len(l.order) > l.size {
				l.order = l.order[:l.size]
			}
		}
		return
	}
	// hs's distinct blocks, first block most recent, then the blocks held
	// before that hs does not name, as many as fit.
	var order []uint64
	for _, h := range hs {
		if !slices.Contains(order, h) {
			order = append(order, h)
		}
	}
	for _, h := range l.order {
		if !slices.Contains(order, h) {
			order = append(order, h)
		}
	}
	l.order = order[:min(len(order), l.size)]
}

// match returns each slot's run of leading blocks held.
func (m *modelIndex) match(hs []uint64, n int) ([]int32, int) {
	dst := make([]int32, n)
	best := 0
	for s := range dst {
		l := m.slots[s]
		if l == nil {
			continue
		}
		for _, h := range hs {
			if !slices.Contains(l.order, h) {
				break
			}
			dst[s]++
		}
		best = max(best, int(dst[s]))
	}
	return dst, best
}

func (m *modelIndex) resize(s, blockTokens, numBlocks int) {
	m.engBlock[s] = blockTokens
	if m.cfg.BlockBytes == 0 {
		largest := 16
		for _, b := range m.engBlock {
			largest = max(largest, b)
		}
		if bb := autoBlockBytes(largest); bb != m.blockBytes {
			m.blockBytes = bb
			m.resets++
			for _, l := range m.slots {
				l.order = nil
			}
		}
	}
	size := m.cfg.FallbackEntries
	switch {
	case numBlocks > 0 && m.cfg.EntriesPerEngineBlock:
		size = numBlocks
	case blockTokens > 0 && numBlocks > 0:
		size = max(1, blockTokens*numBlocks/(m.blockBytes/BytesPerToken))
	}
	l := m.slot(s)
	l.size = size
	if len(l.order) > size {
		l.order = l.order[:size]
	}
}

func (m *modelIndex) forget(s int) {
	delete(m.slots, s)
	m.engBlock[s] = 0
}

func (m *modelIndex) entries() int {
	n := 0
	for _, l := range m.slots {
		n += len(l.order)
	}
	return n
}

// checkInternals holds x's layout to itself and to m: each slot's list in
// both directions, each node's record holding that node, each record
// entered under its hash, and nothing else in the table.
func checkInternals(t *testing.T, x *Index, m *modelIndex) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	held := 0
	for s := range x.slots {
		l := &x.slots[s]
		ms := m.slots[s]
		if !l.used {
			if ms != nil {
				t.Fatalf("slot %d unused, model holds %v", s, ms.order)
			}
			continue
		}
		if ms == nil {
			t.Fatalf("slot %d in use, not in model", s)
		}
		var order []uint64
		prev := int32(-1)
		for nd := l.head; nd >= 0; nd = l.nodes[nd].next {
			if l.nodes[nd].prev != prev {
				t.Fatalf("slot %d node %d: prev %d, want %d", s, nd, l.nodes[nd].prev, prev)
			}
			r := &x.recs[l.nodes[nd].rec]
			if j := r.find(int32(s)); j < 0 || r.at(j).node != nd {
				t.Fatalf("slot %d node %d: record %d does not point back", s, nd, l.nodes[nd].rec)
			}
			order = append(order, r.hash)
			prev = nd
		}
		if l.tail != prev {
			t.Fatalf("slot %d: tail %d, want %d", s, l.tail, prev)
		}
		if !slices.Equal(order, ms.order) || l.n != len(order) || l.size != ms.size {
			t.Fatalf("slot %d: order %v (n %d, size %d), model %v (size %d)", s, order, l.n, l.size, ms.order, ms.size)
		}
		held += l.n
	}
	holders := 0
	for _, ts := range x.blocks.slots {
		if ts.rec == 0 {
			continue
		}
		h, id := ts.hash, ts.rec-1
		if got, ok := x.blocks.get(h); !ok || got != id {
			t.Fatalf("blocks.get(%#x) = %d %v, want %d", h, got, ok, id)
		}
		r := &x.recs[id]
		if r.hash != h || r.n == 0 {
			t.Fatalf("blocks[%#x] = record %d with hash %#x and %d holders", h, id, r.hash, r.n)
		}
		holders += int(r.n)
	}
	if holders != held || x.entries != held {
		t.Fatalf("holders %d, entries %d, nodes in lists %d", holders, x.entries, held)
	}
	if x.blocks.n+len(x.freeRecs) != len(x.recs) {
		t.Fatalf("%d records in use and %d free of %d", x.blocks.n, len(x.freeRecs), len(x.recs))
	}
}

// modelSlots is how many slots the model runs use; Match is also asked
// with a dst one shorter, which must leave the last slot uncounted.
const modelSlots = 4

// runAgainstModel decodes ops from data and applies each to x and to the
// model, comparing every Match, the entry count, the block size and the
// resets as it goes, and the layout at the end.
func runAgainstModel(t *testing.T, cfg Config, data []byte) {
	t.Helper()
	x, m := NewIndex(cfg), newModel(cfg)
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return int(b)
	}
	// A small alphabet of hashes, so that blocks are shared, repeated
	// and evicted often.
	hashes := func() []uint64 {
		hs := make([]uint64, next()%9)
		for i := range hs {
			hs[i] = uint64(next()%12) + 1
		}
		return hs
	}
	for len(data) > 0 {
		switch op := next(); op % 5 {
		case 0, 1:
			s, hs := next()%modelSlots, hashes()
			x.Insert(s, hs)
			m.insert(s, hs)
		case 2:
			hs, n := hashes(), modelSlots-next()%2
			got := make([]int32, n)
			best := x.Match(hs, got)
			want, wantBest := m.match(hs, n)
			if best != wantBest || !slices.Equal(got, want) {
				t.Fatalf("Match(%v) = %d %v, want %d %v", hs, best, got, wantBest, want)
			}
		case 3:
			s := next() % modelSlots
			bt := []int{0, 1, 16, 128}[next()%4]
			nb := []int{0, 1, 2, 3, 5, 40}[next()%6]
			x.Resize(s, bt, nb, 0)
			m.resize(s, bt, nb)
		case 4:
			s := next() % modelSlots
			x.Forget(s)
			m.forget(s)
		}
		if n, _ := x.Stats(); n != m.entries() {
			t.Fatalf("Stats entries = %d, want %d", n, m.entries())
		}
		if x.BlockBytes() != m.blockBytes || x.Resets() != m.resets {
			t.Fatalf("BlockBytes, Resets = %d, %d, want %d, %d", x.BlockBytes(), x.Resets(), m.blockBytes, m.resets)
		}
	}
	checkInternals(t, x, m)
}

var modelConfigs = []Config{
	{BlockBytes: 64, FallbackEntries: 6},
	{FallbackEntries: 6},
	{BlockBytes: 64, FallbackEntries: 6, EntriesPerEngineBlock: true},
	{BlockBytes: 64, FallbackEntries: 6, EntriesPerEngineBlock: true, HeadFirst: true},
}

func TestIndexMatchesModel(t *testing.T) {
	for i, cfg := range modelConfigs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(1, uint64(i)))
			for range 300 {
				data := make([]byte, 600)
				for j := range data {
					data[j] = byte(r.Uint32())
				}
				runAgainstModel(t, cfg, data)
			}
		})
	}
}

func FuzzIndexMatchesModel(f *testing.F) {
	f.Add([]byte{0, 0, 3, 1, 2, 3, 2, 3, 1, 2, 3})
	f.Add([]byte{1, 3, 0, 3, 2, 3, 5, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		runAgainstModel(t, modelConfigs[int(data[0])%len(modelConfigs)], data[1:])
	})
}

// TestIndexConcurrentUse runs every method from several goroutines at once
// (for the race detector), then checks the layout still holds together.
func TestIndexConcurrentUse(t *testing.T) {
	x := NewIndex(Config{BlockBytes: 64, FallbackEntries: 50})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(2, uint64(g)))
			hs := make([]uint64, 40)
			dst := make([]int32, 8)
			for range 500 {
				for i := range hs {
					hs[i] = r.Uint64N(200)
				}
				switch r.IntN(10) {
				case 0:
					x.Resize(r.IntN(8), 16, r.IntN(100), float64(1+r.IntN(8)))
				case 1:
					x.Forget(r.IntN(8))
				case 2, 3, 4:
					clear(dst)
					x.Match(hs, dst)
				default:
					x.Insert(r.IntN(8), hs)
				}
				x.Stats()
			}
		})
	}
	wg.Wait()
	// The model agrees on nothing here; rebuild one from x's own lists
	// so checkInternals tests the links and records alone.
	m := newModel(x.cfg)
	for s := range x.slots {
		l := &x.slots[s]
		if !l.used {
			continue
		}
		ms := m.slot(s)
		ms.size = l.size
		for nd := l.head; nd >= 0; nd = l.nodes[nd].next {
			ms.order = append(ms.order, x.recs[l.nodes[nd].rec].hash)
		}
	}
	checkInternals(t, x, m)
}

// TestBlockTableMatchesMap runs random puts, deletes and gets on a table
// and a map, with hashes from a small range so probe runs collide, wrap
// and shift back on deletion.
func TestBlockTableMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var tb blockTable
	m := map[uint64]int32{}
	for i := range 200_000 {
		h := r.Uint64N(300) << (r.Uint64N(2) * 60) // high bits too
		switch want, ok := m[h]; {
		case r.IntN(3) == 0 && ok:
			tb.del(h)
			delete(m, h)
		case !ok && r.IntN(2) == 0:
			tb.put(h, int32(i))
			m[h] = int32(i)
		default:
			if got, gok := tb.get(h); gok != ok || got != want {
				t.Fatalf("op %d: get(%#x) = %d %v, want %d %v", i, h, got, gok, want, ok)
			}
		}
		if i%1000 == 0 {
			used := 0
			for _, s := range tb.slots {
				if s.rec != 0 {
					used++
				}
			}
			if used != len(m) || tb.n != len(m) {
				t.Fatalf("op %d: %d slots used, n %d, want %d", i, used, tb.n, len(m))
			}
			for h, want := range m {
				if got, ok := tb.get(h); !ok || got != want {
					t.Fatalf("op %d: get(%#x) = %d %v, want %d", i, h, got, ok, want)
				}
			}
		}
	}
}

// TestIndexInsertGenerationWraps: a slot's insert generation, which tells
// a block repeated within one Insert from one held before it, wraps after
// 2^32 inserts without mistaking an old node for one placed by this call.
func TestIndexInsertGenerationWraps(t *testing.T) {
	cfg := Config{BlockBytes: 64, FallbackEntries: 8}
	x, m := NewIndex(cfg), newModel(cfg)
	for _, hs := range [][]uint64{{1, 2, 3}, {4}} {
		x.Insert(0, hs)
		m.insert(0, hs)
	}
	x.slots[0].gen = ^uint32(0) // the next Insert wraps; blocks 1-3 were placed at generation 1
	for _, hs := range [][]uint64{{2, 5, 2}, {3, 1}} {
		x.Insert(0, hs)
		m.insert(0, hs)
	}
	checkInternals(t, x, m)
	if got := x.slots[0].gen; got != 2 {
		t.Errorf("generation after wrapping = %d, want 2", got)
	}
}

// TestIndexTTLForgetsUnsentBlocks: with a TTL, a block not sent again for
// that long is no longer matched nor counted, and sending it again renews
// it; the expired blocks are dropped at the next Insert.
func TestIndexTTLForgetsUnsentBlocks(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	x := NewIndex(Config{BlockBytes: 64, FallbackEntries: 100, TTL: 120 * time.Second, Now: func() time.Time { return now }})
	match := func(hs []uint64) [2]int32 {
		var dst [2]int32
		x.Match(hs, dst[:])
		return dst
	}
	x.Insert(0, []uint64{1, 2, 3})
	now = now.Add(60 * time.Second)
	x.Insert(1, []uint64{1, 2})
	now = now.Add(59 * time.Second) // slot 0 placed 119 s ago
	if got := match([]uint64{1, 2, 3}); got != [2]int32{3, 2} {
		t.Errorf("Match before the TTL = %v, want [3 2]", got)
	}
	now = now.Add(2 * time.Second) // 121 s
	if got := match([]uint64{1, 2, 3}); got != [2]int32{0, 2} {
		t.Errorf("Match after slot 0's TTL = %v, want [0 2]", got)
	}
	if got := x.Held(0); got != 0 {
		t.Errorf("Held(0) after its TTL = %d, want 0", got)
	}
	x.Insert(0, []uint64{1}) // renews block 1 only; drops 2 and 3 there
	if n, _ := x.Stats(); n != 3 {
		t.Errorf("entries after the expired were dropped = %d, want 3 (slot 0: 1; slot 1: 1, 2)", n)
	}
	now = now.Add(100 * time.Second) // slot 1's blocks 161 s old, slot 0's block 1 100 s
	if got := match([]uint64{1, 2}); got != [2]int32{1, 0} {
		t.Errorf("Match after slot 1's TTL = %v, want [1 0]", got)
	}
	if got := []int{x.Held(0), x.Held(1)}; !slices.Equal(got, []int{1, 0}) {
		t.Errorf("Held = %v, want [1 0]", got)
	}
}
