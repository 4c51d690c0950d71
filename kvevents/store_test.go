package kvevents

import (
	"log/slog"
	"testing"

	"github.com/llmlb/llmlb/sim"
)

func apply(t *testing.T, s *Store, id string, evs []sim.KVEvent, bs int) {
	t.Helper()
	b, err := Decode(sim.EncodeKVBatch(nil, 0, evs, bs))
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(id, b)
}

func TestStoreMatchesWhatWasStored(t *testing.T) {
	const bs = 4
	s := NewStore()
	evs, tokens := chain(1, 5, bs, "")
	apply(t, s, "a", evs[:3], bs)
	// A later step extends the chain from its third block.
	apply(t, s, "a", evs[3:], bs)
	prompt := append(tokens[:5*bs:5*bs], 99, 98) // a partial block after
	blocks := Blocks(nil, prompt, bs, "")
	if len(blocks) != 5 {
		t.Fatalf("%d blocks", len(blocks))
	}
	if got := s.Match("a", blocks); got != 5 {
		t.Fatalf("a holds %d blocks, want 5", got)
	}
	if got := s.Match("b", blocks); got != 0 {
		t.Fatalf("b holds %d blocks, want 0", got)
	}
	// Another prompt diverging in the third block matches two.
	other := append([]uint32(nil), tokens...)
	other[2*bs] = 12345
	if got := s.Match("a", Blocks(nil, other, bs, "")); got != 2 {
		t.Fatalf("diverging prompt matches %d, want 2", got)
	}
	// The same tokens under an adapter match nothing.
	if got := s.Match("a", Blocks(nil, tokens, bs, "lora-1")); got != 0 {
		t.Fatalf("adapter prompt matches %d, want 0", got)
	}
	// A block leaving an offloading tier is still on the GPU.
	cpu := enc(nil).arr(2).f(0).arr(1).arr(3).str("BlockRemoved").arr(1).fix(byte(evs[3].Hash)).str("CPU")
	if evs[3].Hash > 127 {
		cpu = enc(nil).arr(2).f(0).arr(1).arr(3).str("BlockRemoved").ints(int64(evs[3].Hash)).str("CPU")
	}
	b, err := Decode(cpu)
	if err != nil {
		t.Fatal(err)
	}
	s.Apply("a", b)
	if got := s.Match("a", blocks); got != 5 {
		t.Fatalf("after a CPU-tier removal %d, want 5", got)
	}
	// Evicting the fourth block leaves three.
	apply(t, s, "a", []sim.KVEvent{{Hash: evs[3].Hash}}, bs)
	if got := s.Match("a", blocks); got != 3 {
		t.Fatalf("after eviction %d, want 3", got)
	}
	if st := s.Stats("a"); st.Blocks != 4 || st.BlockSize != bs {
		t.Fatalf("stats %+v", st)
	}
	apply(t, s, "a", nil, bs) // nothing
	b, err = Decode(enc(nil).arr(2).f(0).arr(1).arr(1).str("AllBlocksCleared"))
	if err != nil {
		t.Fatal(err)
	}
	s.Apply("a", b)
	if got := s.Match("a", blocks); got != 0 {
		t.Fatalf("after clear %d, want 0", got)
	}
}

// TestStoreOrphans: blocks whose parent was stored before the index
// began cannot be named; they are counted and left out, and a removal of
// a block never seen changes nothing.
func TestStoreOrphans(t *testing.T) {
	const bs = 2
	s := NewStore()
	evs, tokens := chain(2, 4, bs, "")
	apply(t, s, "a", evs[2:], bs)
	apply(t, s, "a", []sim.KVEvent{{Hash: evs[0].Hash}}, bs)
	if got := s.Match("a", Blocks(nil, tokens, bs, "")); got != 0 {
		t.Fatalf("matched %d", got)
	}
	if st := s.Stats("a"); st.Orphans != 2 || st.Blocks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStoreAdapterBlocks(t *testing.T) {
	const bs = 2
	s := NewStore()
	evs, tokens := chain(3, 2, bs, "sql")
	apply(t, s, "a", evs, bs)
	if got := s.Match("a", Blocks(nil, tokens, bs, "sql")); got != 2 {
		t.Fatalf("adapter prompt matches %d, want 2", got)
	}
	if got := s.Match("a", Blocks(nil, tokens, bs, "")); got != 0 {
		t.Fatalf("base prompt matches %d, want 0", got)
	}
}

func BenchmarkMatch(b *testing.B) {
	const bs, n = 16, 750 // a 12k-token prompt
	s := NewStore()
	evs, tokens := chain(4, n, bs, "")
	bt, err := Decode(sim.EncodeKVBatch(nil, 0, evs, bs))
	if err != nil {
		b.Fatal(err)
	}
	s.Apply("a", bt)
	blocks := Blocks(nil, tokens, bs, "")
	b.ReportAllocs()
	for b.Loop() {
		if s.Match("a", blocks) != n {
			b.Fatal("miss")
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
