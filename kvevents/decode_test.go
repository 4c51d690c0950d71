package kvevents

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/llmlb/llmlb/sim"
)

// chain returns the events of a prompt of n blocks of bs tokens stored at
// once, as the emulated engine records them, and the prompt's tokens.
func chain(seed uint64, n, bs int, adapter string) ([]sim.KVEvent, []uint32) {
	tokens := make([]uint32, n*bs)
	for i := range tokens {
		tokens[i] = uint32(seed)*1000 + uint32(i)
	}
	var evs []sim.KVEvent
	for i := range n {
		e := sim.KVEvent{Stored: true, Hash: seed<<32 | uint64(i+1), Tokens: tokens[i*bs : (i+1)*bs], Adapter: adapter}
		if i > 0 {
			e.Parent, e.HasParent = evs[i-1].Hash, true
		}
		evs = append(evs, e)
	}
	return evs, tokens
}

func TestDecodeMapForm(t *testing.T) {
	stored, _ := chain(7, 3, 4, "")
	lora, _ := chain(8, 1, 4, "sql-lora")
	evs := append(append(stored, lora...), sim.KVEvent{Hash: 1}, sim.KVEvent{Hash: 2})
	b, err := Decode(sim.EncodeKVBatch(nil, 12.5, evs, 4))
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 12.5 || b.Rank != 0 || len(b.Events) != 3 {
		t.Fatalf("batch %+v", b)
	}
	s := b.Events[0]
	if s.Kind != Stored || !slices.Equal(s.Hashes, []uint64{7<<32 | 1, 7<<32 | 2, 7<<32 | 3}) || s.HasParent || s.BlockSize != 4 || len(s.Tokens) != 12 || s.LoRA != "" || s.Opaque || s.Other {
		t.Fatalf("stored %+v", s)
	}
	if l := b.Events[1]; l.LoRA != "sql-lora" || len(l.Hashes) != 1 {
		t.Fatalf("lora %+v", l)
	}
	if r := b.Events[2]; r.Kind != Removed || !slices.Equal(r.Hashes, []uint64{1, 2}) {
		t.Fatalf("removed %+v", r)
	}
}

// enc builds msgpack by hand for the encodings sim does not write.
type enc []byte

func (e enc) arr(n int) enc    { return append(e, 0x90|byte(n)) }
func (e enc) mp(n int) enc     { return append(e, 0x80|byte(n)) }
func (e enc) str(s string) enc { return append(append(e, 0xa0|byte(len(s))), s...) }
func (e enc) bin(b []byte) enc { return append(append(e, 0xc4, byte(len(b))), b...) }
func (e enc) nil() enc         { return append(e, 0xc0) }
func (e enc) i(v int64) enc    { return binary.BigEndian.AppendUint64(append(e, 0xd3), uint64(v)) }
func (e enc) f(v float64) enc {
	return binary.BigEndian.AppendUint64(append(e, 0xcb), math.Float64bits(v))
}
func (e enc) fix(v byte) enc { return append(e, v) }
func (e enc) ints(v ...int64) enc {
	e = e.arr(len(v))
	for _, x := range v {
		e = e.i(x)
	}
	return e
}

// TestDecodeArrayForm reads the encoding of vLLM releases whose structs
// were msgspec array_like: [ts, events, rank], events [tag, fields...],
// the oldest with num_toks_per_block where block_size is now, negative
// integer hashes (Python's hash()) and byte-string hashes (sha256).
func TestDecodeArrayForm(t *testing.T) {
	p := enc(nil).arr(3).f(1.5).arr(4)
	// BlockStored, block_size form, lora_id and medium, lora_name.
	p = p.arr(8).str("BlockStored").ints(-5, 6).nil().ints(1, 2, 3, 4).fix(2).nil().str("GPU").nil()
	// BlockStored, num_toks_per_block form, parent set, no medium.
	p = p.arr(6).str("BlockStored").ints(9).i(6).ints(5, 6).ints(2).i(3)
	// BlockRemoved with a byte-string hash.
	p = p.arr(3).str("BlockRemoved").arr(1).bin([]byte("0123456789abcdef0123456789abcdef")).str("CPU")
	p = p.arr(1).str("AllBlocksCleared")
	p = p.i(1)
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 1.5 || b.Rank != 1 || len(b.Events) != 4 {
		t.Fatalf("batch %+v", b)
	}
	e0, e1 := b.Events[0], b.Events[1]
	if e0.Hashes[0] != uint64(math.MaxUint64-4) || e0.BlockSize != 2 || e0.HasParent || e0.LoRA != "" {
		t.Fatalf("event 0 %+v", e0)
	}
	if e1.Parent != 6 || !e1.HasParent || e1.BlockSize != 2 || e1.LoRA != "#3" {
		t.Fatalf("event 1 %+v", e1)
	}
	if e2 := b.Events[2]; e2.Kind != Removed || e2.Hashes[0] == 0 || !e2.Other {
		t.Fatalf("event 2 %+v", e2)
	}
	if b.Events[3].Kind != Cleared {
		t.Fatalf("event 3 %+v", b.Events[3])
	}
}

// TestDecodeExtraKeys: blocks whose extra hash keys hold only the
// adapter's name stay matchable; any other key (a cache salt, multimodal
// hashes) makes them opaque.
func TestDecodeExtraKeys(t *testing.T) {
	event := func(extra enc) []byte {
		p := enc(nil).mp(2).str("ts").f(0).str("events").arr(1).mp(8)
		p = p.str("type").str("BlockStored").str("block_hashes").ints(1).str("parent_block_hash").nil()
		p = p.str("token_ids").ints(1, 2).str("block_size").fix(2).str("lora_name").str("a")
		p = p.str("medium").nil().str("extra_keys")
		return append(p, extra...)
	}
	for _, c := range []struct {
		name   string
		extra  enc
		opaque bool
	}{
		{"none", enc(nil).nil(), false},
		{"per block none", enc(nil).arr(1).nil(), false},
		{"adapter", enc(nil).arr(1).arr(1).str("a"), false},
		{"salt", enc(nil).arr(1).arr(2).str("a").str("salt"), true},
		{"other string", enc(nil).arr(1).arr(1).str("salt"), true},
		{"mm hash", enc(nil).arr(1).arr(1).arr(2).str("h").fix(0), true},
	} {
		b, err := Decode(event(c.extra))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := b.Events[0].Opaque; got != c.opaque {
			t.Errorf("%s: opaque %v, want %v", c.name, got, c.opaque)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := sim.EncodeKVBatch(nil, 1, []sim.KVEvent{{Stored: true, Hash: 1, Tokens: []uint32{1, 2}}}, 2)
	for name, p := range map[string][]byte{
		"empty":          nil,
		"truncated":      good[:len(good)-1],
		"trailing":       append(slices.Clone(good), 0),
		"not a batch":    enc(nil).str("x"),
		"no events":      enc(nil).mp(1).str("ts").f(1),
		"unknown type":   enc(nil).arr(2).f(0).arr(1).arr(1).str("BlockMoved"),
		"tokens short":   enc(nil).arr(2).f(0).arr(1).arr(5).str("BlockStored").ints(1, 2).nil().ints(1, 2, 3).fix(2),
		"zero blocksize": enc(nil).arr(2).f(0).arr(1).arr(5).str("BlockStored").ints(1).nil().ints().fix(0),
		"huge array":     append(enc(nil).arr(2).f(0), 0xdd, 0xff, 0xff, 0xff, 0xff),
		"deep":           append(append(enc(nil).mp(2).str("ts").f(0).str("x"), slices.Repeat([]byte{0x91}, 100)...), 0xc0),
		"token too big":  enc(nil).arr(2).f(0).arr(1).arr(5).str("BlockStored").ints(1).nil().ints(1 << 33).fix(1),
	} {
		if _, err := Decode(p); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func FuzzDecode(f *testing.F) {
	evs, _ := chain(3, 2, 2, "x")
	f.Add(sim.EncodeKVBatch(nil, 1, append(evs, sim.KVEvent{Hash: 4}), 2))
	f.Add([]byte(enc(nil).arr(3).f(1.5).arr(1).arr(6).str("BlockStored").ints(9).i(6).ints(5, 6).ints(2).i(3).i(1)))
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Decode(p)
		if err != nil {
			return
		}
		s := NewStore()
		s.Apply("b", b) // must not panic, whatever the events say
		for _, e := range b.Events {
			if e.Kind == Stored && (e.BlockSize <= 0 || len(e.Tokens) != len(e.Hashes)*e.BlockSize) {
				t.Fatalf("stored event with %d tokens, %d blocks of %d", len(e.Tokens), len(e.Hashes), e.BlockSize)
			}
		}
	})
}
