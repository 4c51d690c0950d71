package prefix

// holder is one slot holding a block, and where the block's node sits in
// that slot's LRU.
type holder struct{ slot, node int32 }

// record lists the slots holding one block hash. The first two holders
// are inline, because most blocks are held by one or two backends and a
// lookup then reads no further memory; the rest are in more, whose array
// is kept when the record is reused so that a warm index allocates nothing.
type record struct {
	hash uint64
	n    int32 // holders
	in   [2]holder
	more []holder // holders from the third on
}

func (r *record) at(i int32) holder {
	if i < int32(len(r.in)) {
		return r.in[i]
	}
	return r.more[i-int32(len(r.in))]
}

func (r *record) set(i int32, h holder) {
	if i < int32(len(r.in)) {
		r.in[i] = h
		return
	}
	r.more[i-int32(len(r.in))] = h
}

func (r *record) add(h holder) {
	if r.n < int32(len(r.in)) {
		r.in[r.n] = h
	} else {
		r.more = append(r.more[:r.n-int32(len(r.in))], h)
	}
	r.n++
}

// inline returns the holders kept in r.in; r.more holds the rest, and is
// empty unless r.in is full.
func (r *record) inline() []holder { return r.in[:min(r.n, int32(len(r.in)))] }

// find returns the index among r's holders of slot, or -1.
func (r *record) find(slot int32) int32 {
	for i, h := range r.inline() {
		if h.slot == slot {
			return int32(i)
		}
	}
	for i, h := range r.more {
		if h.slot == slot {
			return int32(len(r.in) + i)
		}
	}
	return -1
}

// removeAt drops holder i, moving the last holder into its place.
func (r *record) removeAt(i int32) {
	r.n--
	r.set(i, r.at(r.n))
	if r.n >= int32(len(r.in)) {
		r.more = r.more[:r.n-int32(len(r.in))]
	}
}

// node is one block in a slot's LRU: its record and its neighbours, as
// indexes into the slot's nodes, -1 for none; and the slot's insert
// generation that last placed it, which tells a block repeated within one
// [Index.Insert] from one held before it.
type node struct {
	rec, prev, next int32
	gen             uint32
}

// slotLRU is one slot's LRU of blocks, most recent at head. Nodes are
// reused in place: a full LRU's tail becomes the new head, and nodes
// dropped by a shrink wait on the free list (linked by next), so the
// nodes slice only grows to the largest size the slot has had.
type slotLRU struct {
	used       bool // false: not in use, made at FallbackEntries on first insert
	nodes      []node
	head, tail int32  // -1 when empty
	free       int32  // first free node, -1 when none
	n          int    // blocks held
	size       int    // capacity in blocks
	gen        uint32 // Inserts so far, wrapping past 0 to 1
	engBlock   int    // the engine block size reported (tokens), 0 unknown
	// ghost remembers the blocks the slot dropped most recently,
	// direct-mapped by hash (nil until the first): a block the backend
	// turns out to hold after the LRU dropped it tells that the LRU is
	// smaller than the backend's cache ([Index.Evicted]).
	ghost []uint64
	// With Config.TTL (timed): at[node] is when the node's block was
	// last placed (Unix nanoseconds), and now the time of the Insert in
	// progress. Placements go to the head, so the times fall from head to
	// tail and the expired blocks are a run at the tail.
	timed bool
	at    []int64
	now   int64
}

// touch marks node i placed by the Insert in progress.
func (l *slotLRU) touch(i int32) {
	l.nodes[i].gen = l.gen
	if l.timed {
		for int(i) >= len(l.at) {
			l.at = append(l.at, 0)
		}
		l.at[i] = l.now
	}
}

func (l *slotLRU) unlink(i int32) {
	nd := &l.nodes[i]
	if nd.prev >= 0 {
		l.nodes[nd.prev].next = nd.next
	} else {
		l.head = nd.next
	}
	if nd.next >= 0 {
		l.nodes[nd.next].prev = nd.prev
	} else {
		l.tail = nd.prev
	}
}

// placeAfter links node i, not in the list, after node at, or at the head
// when at is -1.
func (l *slotLRU) placeAfter(i, at int32) {
	l.linkAfter(i, i, at)
}

// linkAfter links the chain first..last (linked among themselves by next
// and prev, and not in the list) after node at, or at the head when at is
// -1.
func (l *slotLRU) linkAfter(first, last, at int32) {
	var below int32
	if at < 0 {
		below, l.head = l.head, first
	} else {
		below, l.nodes[at].next = l.nodes[at].next, first
	}
	l.nodes[first].prev, l.nodes[last].next = at, below
	if below >= 0 {
		l.nodes[below].prev = last
	} else {
		l.tail = last
	}
}

// moveRun places hashes[i], which l holds at node first, right after node
// at (at the head when at is -1), and with it each following block of
// hashes that l holds right below the one before; it returns the index of
// the first block of hashes it did not move and the run's last node.
//
// [Index.Insert] leaves a prompt's blocks contiguous in the list, first
// block nearest the head, so a re-sent prompt is such a run: it is found
// by following next links and comparing record hashes instead of by table
// lookups, and moved as one piece (issue 19: the lookups were most of the
// cost of re-inserting the 220 KB chats' prompts). A node in the list
// holds a record in use, and only one record is in use per hash, so a
// matching hash proves l holds that block there. The caller has checked
// that first was not placed by this Insert; nodes below it were not either,
// since everything this Insert placed sits above.
func (l *slotLRU) moveRun(recs []record, first int32, hashes []uint64, i int, at int32) (int, int32) {
	last := first
	l.touch(first)
	for i++; i < len(hashes); i++ {
		n := l.nodes[last].next
		if n < 0 || recs[l.nodes[n].rec].hash != hashes[i] {
			break
		}
		last = n
		l.touch(n)
	}
	if l.nodes[first].prev == at {
		return i, last // already in place
	}
	above, below := l.nodes[first].prev, l.nodes[last].next
	l.nodes[above].next = below // above exists: first is below at
	if below >= 0 {
		l.nodes[below].prev = above
	} else {
		l.tail = above
	}
	l.linkAfter(first, last, at)
	return i, last
}

// alloc returns a node off the free list, or a new one.
func (l *slotLRU) alloc() int32 {
	if i := l.free; i >= 0 {
		l.free = l.nodes[i].next
		return i
	}
	l.nodes = append(l.nodes, node{})
	return int32(len(l.nodes) - 1)
}

// reset empties l, keeping its size, engine block and node array.
func (l *slotLRU) reset() {
	l.nodes = l.nodes[:0]
	l.at = l.at[:0]
	l.head, l.tail, l.free = -1, -1, -1
	l.n = 0
	clear(l.ghost)
}
