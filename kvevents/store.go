package kvevents

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/balancer"
)

var _ balancer.CacheEvents = (*Store)(nil)

// Chain returns the hash of one block of token ids that extends the block
// hashed prev: xxhash of prev's 8 bytes and each token id's 4 (little
// endian). A prompt's first block extends [Root] of its adapter.
func Chain(prev uint64, tokens []uint32) uint64 {
	var d xxhash.Digest
	d.Reset()
	var buf [64]byte
	binary.LittleEndian.PutUint64(buf[:8], prev)
	_, _ = d.Write(buf[:8])
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = d.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	return d.Sum64()
}

// Root is what a prompt's first block extends: the adapter's name hashed,
// so that blocks computed with an adapter match only prompts for it.
func Root(lora string) uint64 { return xxhash.Sum64String("kvevents root " + lora) }

// Blocks appends to dst the chained hashes of tokens' full blocks of
// blockSize, as the index keys what the engine stores (the engine caches
// only full blocks).
func Blocks(dst []uint64, tokens []uint32, blockSize int, lora string) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	prev := Root(lora)
	for off := 0; off+blockSize <= len(tokens); off += blockSize {
		prev = Chain(prev, tokens[off:off+blockSize])
		dst = append(dst, prev)
	}
	return dst
}

// maxBlocks bounds one server's table. A server's cache holds far fewer
// blocks (an 80 GB GPU holds about 10^5 blocks of 16 tokens of an 8B
// model); a table that grows past this is missing removals, and is
// cleared rather than left to grow.
const maxBlocks = 1 << 22

// Store is the index of every server's cache, by the ID the balancer gives
// the backend. A subscriber goroutine per server applies its events; picks
// read concurrently. Each server's table has its own lock, held only for
// map reads and writes.
type Store struct {
	// Now tells the time a batch is applied at; nil is time.Now (the
	// benchmark sets its virtual clock). Set before the first Apply.
	Now func() time.Time

	mu        sync.RWMutex
	tables    map[string]*table // guarded by mu
	blockSize atomic.Int64      // see BlockSize
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{tables: make(map[string]*table)} }

type table struct {
	mu        sync.RWMutex
	blockSize int               // guarded by mu; 0 until a block is stored
	engine    map[uint64]uint64 // engine hash -> chain hash; guarded by mu
	held      map[uint64]int32  // chain hash -> engine blocks naming it; guarded by mu
	orphans   uint64            // guarded by mu: stored blocks whose parent was never seen

	// The prefills the last batch that stored blocks shows in progress
	// ([Store.Prefilling]); all guarded by mu.
	runs       map[uint64]run // engine hash of a run's last block in the last such batch -> the run
	next       map[uint64]run // the same for the batch being applied
	prefilling int            // tokens stored by the runs that grew by 2 blocks or more in it
	prefills   int            // those runs
	stepped    int            // tokens those runs stored in it
	at         time.Time      // when it was applied
}

// run is the blocks one sequence stored in consecutive batches: a prefill
// in chunks, one batch a step, or a decode's block every few steps.
type run struct {
	tokens int // stored since the run began
	grew   int // blocks stored in the batch being applied
	step   int // their tokens
}

// minPrefillBlocks is the blocks a run must store in one batch to count as
// a prefill in progress: a decode stores one block in a step at most.
const minPrefillBlocks = 2

func (s *Store) table(id string, create bool) *table {
	s.mu.RLock()
	t := s.tables[id]
	s.mu.RUnlock()
	if t != nil || !create {
		return t
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t = s.tables[id]; t == nil {
		t = &table{engine: make(map[uint64]uint64), held: make(map[uint64]int32), runs: make(map[uint64]run), next: make(map[uint64]run)}
		s.tables[id] = t
	}
	return t
}

// Apply enters one batch of server id's events.
func (s *Store) Apply(id string, b Batch) {
	t := s.table(id, true)
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range b.Events {
		t.applyLocked(&b.Events[i])
	}
	t.endBatchLocked(s.now())
	if t.blockSize > 0 {
		s.blockSize.Store(int64(t.blockSize))
	}
	if len(t.engine) > maxBlocks {
		t.clearLocked()
	}
}

// Clear forgets what server id holds: it restarted, or events were lost.
func (s *Store) Clear(id string) {
	if t := s.table(id, false); t != nil {
		t.mu.Lock()
		t.clearLocked()
		t.mu.Unlock()
	}
}

// Forget drops server id.
func (s *Store) Forget(id string) {
	s.mu.Lock()
	delete(s.tables, id)
	s.mu.Unlock()
}

func (t *table) clearLocked() {
	clear(t.engine)
	clear(t.held)
	clear(t.runs)
	clear(t.next)
	t.prefilling, t.prefills, t.stepped, t.at = 0, 0, 0, time.Time{}
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// trackLocked follows the run a stored event extends: the run whose last
// block is its parent, in this batch or the one before; else it starts
// one (a prompt's first uncached block, whatever its cached parent).
func (t *table) trackLocked(e *Event) {
	var r run
	if e.HasParent {
		if p, ok := t.next[e.Parent]; ok {
			r = p
			delete(t.next, e.Parent)
		} else if p, ok := t.runs[e.Parent]; ok {
			r.tokens = p.tokens
		}
	}
	r.tokens += len(e.Hashes) * e.BlockSize
	r.grew += len(e.Hashes)
	r.step += len(e.Hashes) * e.BlockSize
	t.next[e.Hashes[len(e.Hashes)-1]] = r
}

// endBatchLocked ends a batch: when it stored blocks, the runs it grew
// by minPrefillBlocks or more are the prefills in progress at now, and
// its runs are the ones the next batch may extend. A run not extended
// by a batch that stores blocks has ended.
func (t *table) endBatchLocked(now time.Time) {
	if len(t.next) == 0 {
		return
	}
	t.prefilling, t.prefills, t.stepped = 0, 0, 0
	for _, r := range t.next {
		if r.grew >= minPrefillBlocks {
			t.prefilling += r.tokens
			t.prefills++
			t.stepped += r.step
		}
	}
	t.at = now
	t.runs, t.next = t.next, t.runs
	clear(t.next)
}

func (t *table) applyLocked(e *Event) {
	switch e.Kind {
	case Cleared:
		t.clearLocked()
	case Removed:
		if e.Other {
			return // left another tier or group; the GPU copy may remain
		}
		for _, h := range e.Hashes {
			t.removeLocked(h)
		}
	case Stored:
		if e.Other || len(e.Hashes) == 0 {
			return
		}
		t.trackLocked(e)
		prev, ok := t.parentLocked(e.Parent, e.HasParent, e.LoRA)
		if !ok {
			t.orphans += uint64(len(e.Hashes))
			return
		}
		if e.Opaque {
			// Chained to something no prompt names: the blocks and
			// their descendants stay out of reach of every match.
			prev = ^prev
		}
		t.blockSize = e.BlockSize
		for i, h := range e.Hashes {
			prev = t.storeLocked(h, prev, e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize])
		}
	}
}

// parentLocked returns the chain hash a stored block extends: its
// parent's, or the adapter's root for a first block; ok is false for a
// parent never seen.
func (t *table) parentLocked(parent uint64, hasParent bool, lora string) (uint64, bool) {
	if !hasParent {
		return Root(lora), true
	}
	p, ok := t.engine[parent]
	return p, ok
}

// storeLocked enters engine block h, holding tokens and extending chain
// hash prev, and returns its chain hash.
func (t *table) storeLocked(h, prev uint64, tokens []uint32) uint64 {
	c := Chain(prev, tokens)
	if old, ok := t.engine[h]; ok {
		if old == c {
			return c
		}
		t.dropLocked(old)
	}
	t.engine[h] = c
	t.held[c]++
	return c
}

// removeLocked forgets engine block h, if it was known.
func (t *table) removeLocked(h uint64) {
	if c, ok := t.engine[h]; ok {
		delete(t.engine, h)
		t.dropLocked(c)
	}
}

func (t *table) dropLocked(c uint64) {
	if t.held[c]--; t.held[c] <= 0 {
		delete(t.held, c)
	}
}

// Match returns how many leading blocks of blocks server id holds.
func (s *Store) Match(id string, blocks []uint64) int {
	t := s.table(id, false)
	if t == nil {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.matchLocked(blocks)
}

// matchLocked counts the leading blocks held; caller must hold t.mu.
func (t *table) matchLocked(blocks []uint64) int {
	n := 0
	for _, h := range blocks {
		if t.held[h] == 0 {
			break
		}
		n++
	}
	return n
}

// Held implements [balancer.CacheEvents]: the tokens of the request's
// leading blocks that backend be's events say it holds. It knows nothing
// (ok false) of a backend that has stored no block yet, or whose blocks
// are not the request's block size.
func (s *Store) Held(be *balancer.Backend, req *balancer.Request) (int, bool) {
	if len(req.TokenBlocks) == 0 {
		return 0, false
	}
	t := s.table(be.ID, false)
	if t == nil {
		return 0, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.blockSize != req.TokenBlockSize {
		return 0, false
	}
	return t.matchLocked(req.TokenBlocks) * t.blockSize, true
}

// Prefilling implements [balancer.CacheEvents]: the sequences backend be's
// last batch of stored blocks showed it prefilling (runs of 2 blocks or
// more a batch), the prompt tokens they have stored since each began, and
// when that batch was applied.
func (s *Store) Prefilling(be *balancer.Backend) (balancer.Prefills, bool) {
	t := s.table(be.ID, false)
	if t == nil {
		return balancer.Prefills{}, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return balancer.Prefills{Sequences: t.prefills, Done: t.prefilling, Step: t.stepped, At: t.at}, !t.at.IsZero()
}

// Stats is what one server's table holds, for metrics and tests.
type Stats struct {
	Blocks    int    // distinct blocks held
	BlockSize int    // tokens per block, 0 before the first stored block
	Orphans   uint64 // stored blocks dropped because their parent was never seen
}

// Stats returns server id's table's figures.
func (s *Store) Stats(id string) Stats {
	t := s.table(id, false)
	if t == nil {
		return Stats{}
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return Stats{Blocks: len(t.held), BlockSize: t.blockSize, Orphans: t.orphans}
}

// BlockSize returns the tokens a block held in the last block any server's
// events stored, 0 before the first: what a prompt is cut by before its
// pick. [Store.Held] compares it with each server's own, so a fleet whose
// servers differ matches only those of the size the prompt was cut by.
func (s *Store) BlockSize() int { return int(s.blockSize.Load()) }
