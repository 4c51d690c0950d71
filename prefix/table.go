package prefix

import "math/bits"

// blockTable maps block hashes to record numbers: open addressing with
// linear probing, at most half full, deletion by backward shift (no
// tombstones). It replaces a Go map on the index's hot path because a
// lookup here reads one 16-byte slot, usually in one cache line, where a
// map reads a control word and then a slot; the index does one to three
// of these a block (issue 19).
//
// A slot's home comes from a multiplicative hash of the block hash, so
// that low-entropy hashes (tests, fuzzing, an unseeded caller) spread as
// well as xxhash outputs do.
type blockTable struct {
	slots []tableSlot // length a power of two, or nil
	shift uint8       // 64 - log2(len(slots))
	n     int         // slots in use
}

type tableSlot struct {
	hash uint64
	rec  int32 // the record plus one; 0 is an empty slot
}

func (t *blockTable) home(h uint64) int { return int((h * 0x9e3779b97f4a7c15) >> t.shift) }

// get returns h's record.
func (t *blockTable) get(h uint64) (int32, bool) {
	if t.n == 0 {
		return 0, false
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.rec == 0 {
			return 0, false
		}
		if s.hash == h {
			return s.rec - 1, true
		}
	}
}

// put enters h, which must not be in t, with record rec.
func (t *blockTable) put(h uint64, rec int32) {
	if (t.n+1)*2 > len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].rec != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = tableSlot{hash: h, rec: rec + 1}
	t.n++
}

// del removes h, which must be in t, and moves back any slot of its probe
// run that may now sit nearer its home.
func (t *blockTable) del(h uint64) {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].rec == 0 || t.slots[i].hash != h {
		i = (i + 1) & mask
	}
	for j := i; ; {
		j = (j + 1) & mask
		if t.slots[j].rec == 0 {
			break
		}
		// Slot j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if k := t.home(t.slots[j].hash); (j-k)&mask < (j-i)&mask {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = tableSlot{}
	t.n--
}

func (t *blockTable) grow() {
	old := t.slots
	size := max(64, 2*len(old))
	t.slots = make([]tableSlot, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	t.n = 0
	for _, s := range old {
		if s.rec != 0 {
			t.put(s.hash, s.rec-1)
		}
	}
}

// reset empties t, keeping its slots.
func (t *blockTable) reset() {
	clear(t.slots)
	t.n = 0
}
