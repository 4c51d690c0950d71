package capture

import (
	"slices"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// FuzzHash: Hash is deterministic, never panics, gives one id per block
// (the last partial), each within 53 bits, and the ids of a prompt's
// whole blocks are the leading ids of any longer prompt that starts with
// it.
func FuzzHash(f *testing.F) {
	f.Add([]byte("hello"), []byte(" world"), uint64(1), 0)
	f.Add(make([]byte, 5000), []byte("tail"), uint64(7), 4100)
	w, err := Open(Config{Path: f.TempDir() + "/c", Sample: 1, BlockTokens: BlockTokens, MaxBytes: minMaxBytes}, []byte(testSalt), Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = w.Close() })
	f.Fuzz(func(t *testing.T, head, tail []byte, seed uint64, turn int) {
		whole := append(slices.Clip(head), tail...)
		p := prefix.Parts{Glue: whole, FirstTurn: turn}
		var a, b, c Line
		w.Hash(&a, &p, seed)
		w.Hash(&b, &p, seed)
		if !slices.Equal(a.HashIDs, b.HashIDs) || a.Conversation != b.Conversation {
			t.Fatal("not deterministic")
		}
		if want := min(MaxIDs, (len(whole)+maxBlockBytes-1)/maxBlockBytes); len(a.HashIDs) != want {
			t.Fatalf("%d ids for %d bytes, want %d", len(a.HashIDs), len(whole), want)
		}
		for _, id := range a.HashIDs {
			if id > idMask {
				t.Fatalf("id %d beyond 53 bits", id)
			}
		}
		w.Hash(&c, &prefix.Parts{Glue: head}, seed)
		full := min(len(head)/maxBlockBytes, len(c.HashIDs))
		if !slices.Equal(c.HashIDs[:full], a.HashIDs[:full]) {
			t.Fatalf("the whole blocks of a prefix are not the leading ids")
		}
	})
}
