package prefix

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config is the `prefix:` section of config.yaml: how prompts are cut into
// blocks and how much the index remembers.
type Config struct {
	// BlockBytes is the size of one hashed block of canonical prompt bytes.
	// 0 tunes it from the engines' cache block size: the smallest multiple
	// of 4 bytes per token times the largest block size any backend reports
	// (vLLM: 16 tokens) that is at least 256 bytes, so a 16-token engine
	// block gives 256-byte (about 64-token) blocks. (default 0: auto)
	BlockBytes int `mapstructure:"block_bytes"`
	// MaxBlocks caps the blocks hashed and looked up per request; with
	// 256-byte blocks, 512 blocks reach about 32k tokens into a prompt.
	// (default 512)
	MaxBlocks int `mapstructure:"max_blocks"`
	// FallbackEntries is how many blocks the index remembers per backend
	// until the backend reports its KV-cache size (block size and count),
	// and for engines that do not. (default 16384)
	FallbackEntries int `mapstructure:"fallback_entries"`

	// Partial hashes a trailing block shorter than BlockBytes too, as the
	// endpoint picker does; set by its presets, not by config.
	Partial bool `mapstructure:"-"`
	// EntriesPerEngineBlock sizes a backend's LRU at as many entries as it
	// reports KV blocks, whatever the block sizes (the endpoint picker's
	// autoTune); set by its presets, not by config.
	EntriesPerEngineBlock bool `mapstructure:"-"`
	// HeadFirst marks a prompt's blocks most recently used in order, so
	// its last block ends most recent and its first is evicted first: the
	// endpoint picker's indexer adds them so (llm-d/llm-d-router
	// pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/indexer.go
	// Add at ebab6879); set by its presets, not by config. Without it,
	// tail first, as vLLM evicts (see [Index.Insert]).
	HeadFirst bool `mapstructure:"-"`
	// TTL forgets a block this long after it was last sent, as NVIDIA
	// Dynamo's router does without KV events (--router-ttl-secs); 0
	// never. Set by its preset, not by config.
	TTL time.Duration `mapstructure:"-"`
	// Now tells the time for TTL; nil is time.Now.
	Now func() time.Time `mapstructure:"-"`
}

// DefaultConfig returns the prefix defaults.
func DefaultConfig() Config {
	return Config{MaxBlocks: 512, FallbackEntries: 16384}
}

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	if c.BlockBytes < 0 || (c.BlockBytes > 0 && c.BlockBytes < 16) {
		errs = append(errs, fmt.Errorf("prefix.block_bytes: must be 0 (auto) or at least 16, got %d", c.BlockBytes))
	}
	if c.MaxBlocks < 1 {
		errs = append(errs, fmt.Errorf("prefix.max_blocks: must be at least 1, got %d", c.MaxBlocks))
	}
	if c.FallbackEntries < 1 {
		errs = append(errs, fmt.Errorf("prefix.fallback_entries: must be at least 1, got %d", c.FallbackEntries))
	}
	return errors.Join(errs...)
}

// BytesPerToken converts engine tokens to canonical bytes until a
// backend's own rate is learned from its answers' usage: about 4 bytes of
// English text per token for Llama-style tokenizers, and exactly 4 for
// token-id prompts. It also sets the auto block size's unit, a matching
// granularity that no learned rate changes, since a new block size
// empties the index.
const BytesPerToken = 4

// EngineBlockTokens is an engine's KV-cache block, in tokens, until a
// backend reports its own: vLLM's default block size.
const EngineBlockTokens = 16

// Tokens estimates the tokens in n bytes of canonical prompt, at
// [BytesPerToken], rounding up.
func Tokens(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }

// minAutoBlockBytes keeps auto-tuned blocks coarse enough that MaxBlocks
// covers a long prompt, while one block is still a small fraction of it.
const minAutoBlockBytes = 256

// EntryBytes estimates the memory one remembered block costs: its record,
// its LRU node and its hash-table slot at the table's mean fill
// (BenchmarkIndexMemory measures it).
const EntryBytes = 115

// Index is an approximate prefix-cache index: per backend slot, an LRU of
// the block hashes sent there, sized from that backend's KV capacity, and
// one table from block hash to a record of the slots holding it. Slots are
// small integers the caller assigns, one per backend, reused after
// [Index.Forget].
//
// Each slot's LRU is a doubly linked list of nodes kept in the slot's own
// slice and linked by index, and each record lists its holders as (slot,
// node) pairs, so a block costs one table lookup to match or re-touch, and
// a new block one lookup, one insert and at most one delete (for the block
// it evicts), with no allocation once the index is warm. (Issue 19: a
// simplelru per slot and a separate reverse map took about seven map
// operations and a node allocation a block, 28% of the proxy's CPU on
// 220 KB prompts.) A re-sent prompt's blocks, which sit together in the
// LRU, are found by following its links instead (see [slotLRU.moveRun]).
//
// All methods are safe for concurrent use. Lookups share a read lock;
// inserts, resizes and evictions take the write lock.
type Index struct {
	cfg        Config
	blockBytes atomic.Int64

	mu       sync.RWMutex
	blocks   blockTable // guarded by mu; block hash → its record in recs
	recs     []record   // guarded by mu; in use when in blocks, else listed in freeRecs
	freeRecs []int32    // guarded by mu; records not in use
	slots    []slotLRU  // guarded by mu; by slot
	entries  int        // guarded by mu; sum of the slots' lengths
	resets   int64      // guarded by mu; times the block size changed
	reversed []uint64   // guarded by mu; Insert's hashes last first, for HeadFirst
}

// NewIndex returns an empty index.
func NewIndex(cfg Config) *Index {
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultConfig().MaxBlocks
	}
	if cfg.FallbackEntries <= 0 {
		cfg.FallbackEntries = DefaultConfig().FallbackEntries
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	x := &Index{cfg: cfg}
	bb := cfg.BlockBytes
	if bb == 0 {
		bb = autoBlockBytes(EngineBlockTokens)
	}
	x.blockBytes.Store(int64(bb))
	return x
}

func autoBlockBytes(engineBlock int) int {
	unit := engineBlock * BytesPerToken
	if unit <= 0 {
		unit = EngineBlockTokens * BytesPerToken
	}
	return (minAutoBlockBytes + unit - 1) / unit * unit
}

// BlockBytes returns the current block size in bytes.
func (x *Index) BlockBytes() int { return int(x.blockBytes.Load()) }

// AppendHashes appends the chained hashes of prompt's blocks at the
// index's block size, at most MaxBlocks of them, and with Partial a last
// block of what is left (see [Parts.AppendHashes]).
func (x *Index) AppendHashes(dst []uint64, seed uint64, prompt []byte) []uint64 {
	bb, most, partial := x.HashShape()
	p := Parts{Glue: prompt}
	return p.AppendHashes(dst, seed, bb, most, partial)
}

// Match sets dst[slot] to the number of leading blocks of hashes that slot
// holds, for every slot holding the first block, and returns the longest
// such run. The walk stops at the first block no slot holds, or when no
// slot still matches every block so far. dst must be zero where it is read
// and at least as long as the highest slot in use plus one; shorter means
// those slots are not counted. Match does not change recency.
func (x *Index) Match(hashes []uint64, dst []int32) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	cutoff := x.cutoff()
	best := 0
	for i, h := range hashes {
		id, ok := x.blocks.get(h)
		if !ok {
			break
		}
		r := &x.recs[id]
		going := x.extend(dst, r.inline(), i, cutoff)
		if len(r.more) > 0 && x.extend(dst, r.more, i, cutoff) {
			going = true
		}
		if !going {
			break
		}
		best = i + 1
	}
	return best
}

// extend sets dst[s] to i+1 for each holder s whose run reaches block i,
// and reports whether there was one. A block placed before cutoff (Unix
// nanoseconds; 0 none) has expired and is not held. Caller must hold x.mu.
func (x *Index) extend(dst []int32, hs []holder, i int, cutoff int64) bool {
	going := false
	for _, h := range hs {
		if int(h.slot) < len(dst) && int(dst[h.slot]) == i {
			if cutoff != 0 && x.slots[h.slot].at[h.node] < cutoff {
				continue
			}
			dst[h.slot] = int32(i + 1)
			going = true
		}
	}
	return going
}

// cutoff returns the time before which a placed block has expired (Unix
// nanoseconds), or 0 without a TTL.
func (x *Index) cutoff() int64 {
	if x.cfg.TTL <= 0 {
		return 0
	}
	return x.cfg.Now().Add(-x.cfg.TTL).UnixNano()
}

// Held returns how many blocks slot holds that have not expired.
func (x *Index) Held(slot int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if slot < 0 || slot >= len(x.slots) {
		return 0
	}
	l := &x.slots[slot]
	if !l.used {
		return 0
	}
	n := l.n
	if cutoff := x.cutoff(); cutoff != 0 {
		for nd := l.tail; nd >= 0 && l.at[nd] < cutoff; nd = l.nodes[nd].prev {
			n--
		}
	}
	return n
}

// expireLocked drops every slot's expired blocks, the run at its tail.
// Caller must hold x.mu for writing.
func (x *Index) expireLocked(cutoff int64) {
	for s := range x.slots {
		l := &x.slots[s]
		if !l.used {
			continue
		}
		for l.tail >= 0 && l.at[l.tail] < cutoff {
			nd := l.tail
			l.unlink(nd)
			x.releaseLocked(int32(s), l.nodes[nd].rec)
			l.nodes[nd].next, l.free = l.free, nd
			l.n--
			x.entries--
		}
	}
}

// Insert records that slot now holds every block of hashes, as the engine
// will once it has prefilled them, and marks them most recently used in
// reverse order: the first block ends most recent and the last block is
// evicted first. That is vLLM's order: a finished request's blocks go to
// its free queue last block first "so that the tail blocks are freed
// first" (vllm/v1/core/single_type_kv_cache_manager.py, free), so a prompt
// squeezed by later ones keeps its head, which a prefix match needs, and
// loses the tail no other prompt shares. A full LRU evicts its least
// recently used block for each block it gains; a prompt longer than the
// slot keeps its first blocks. With Config.HeadFirst the order is the
// endpoint picker's, the reverse: a prompt's last block ends most recent.
func (x *Index) Insert(slot int, hashes []uint64) {
	if slot < 0 || len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cfg.HeadFirst {
		// Placing the blocks last first leaves the order of marking each
		// most recent in turn, first to last.
		x.reversed = append(x.reversed[:0], hashes...)
		slices.Reverse(x.reversed)
		hashes = x.reversed
	}
	l := x.slotLocked(slot)
	if x.cfg.TTL > 0 {
		now := x.cfg.Now()
		x.expireLocked(now.Add(-x.cfg.TTL).UnixNano())
		l.timed, l.now = true, now.UnixNano()
	}
	s := int32(slot)
	if l.gen++; l.gen == 0 {
		for i := range l.nodes {
			l.nodes[i].gen = 0
		}
		l.gen = 1
	}
	at := int32(-1) // the last node placed; the blocks placed so far sit from the head to it
	for i := 0; i < len(hashes); {
		h := hashes[i]
		id, known := x.blocks.get(h)
		if known {
			r := &x.recs[id]
			if j := r.find(s); j >= 0 {
				if nd := r.at(j).node; l.nodes[nd].gen != l.gen {
					i, at = l.moveRun(x.recs, nd, hashes, i, at)
				} else {
					i++ // a block repeated in hashes, placed already
				}
				continue
			}
		}
		i++
		var nd int32
		if l.n >= l.size {
			if l.tail == at {
				return // every block held is one placed here: keep the head
			}
			// Reuse the least recently used node. Its block is not h,
			// which s does not hold, so id stays valid.
			nd = l.tail
			l.unlink(nd)
			x.releaseLocked(s, l.nodes[nd].rec)
		} else {
			nd = l.alloc()
			l.n++
			x.entries++
		}
		if !known {
			id = x.newRecordLocked(h)
		}
		x.recs[id].add(holder{s, nd})
		l.nodes[nd].rec = id
		l.touch(nd)
		l.placeAfter(nd, at)
		at = nd
	}
}

// Resize sizes slot's LRU from the backend's KV cache: blockTokens tokens
// per engine block times numBlocks blocks, at bytesPerToken canonical
// bytes a token (at most 0: [BytesPerToken]), in the index's block unit.
// Zero for either count means unknown, and the slot gets FallbackEntries.
// With auto block size, a larger engine block than any seen so far re-tunes
// the block size, which empties the index (hashes at the old size would
// never match again).
func (x *Index) Resize(slot, blockTokens, numBlocks int, bytesPerToken float64) {
	if slot < 0 {
		return
	}
	if bytesPerToken <= 0 {
		bytesPerToken = BytesPerToken
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.growLocked(slot)
	x.slots[slot].engBlock = blockTokens
	if x.cfg.BlockBytes == 0 {
		largest := EngineBlockTokens
		for i := range x.slots {
			largest = max(largest, x.slots[i].engBlock)
		}
		if bb := autoBlockBytes(largest); bb != x.BlockBytes() {
			x.blockBytes.Store(int64(bb))
			x.resetLocked()
		}
	}
	size := x.cfg.FallbackEntries
	switch {
	case numBlocks > 0 && x.cfg.EntriesPerEngineBlock:
		size = numBlocks
	case blockTokens > 0 && numBlocks > 0:
		size = max(1, int(float64(blockTokens)*float64(numBlocks)*bytesPerToken/float64(x.BlockBytes())))
	}
	l := x.slotLocked(slot)
	l.size = size
	s := int32(slot)
	for l.n > l.size {
		nd := l.tail
		l.unlink(nd)
		x.releaseLocked(s, l.nodes[nd].rec)
		l.nodes[nd].next, l.free = l.free, nd
		l.n--
		x.entries--
	}
}

// Evicted reports whether slot's LRU dropped block h among its recent
// evictions (about as many as it holds) and has not placed it again. A
// backend found to hold such a block kept it longer than the index did.
func (x *Index) Evicted(slot int, h uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if slot < 0 || slot >= len(x.slots) {
		return false
	}
	l := &x.slots[slot]
	if len(l.ghost) == 0 || l.ghost[h&uint64(len(l.ghost)-1)] != h {
		return false
	}
	if id, ok := x.blocks.get(h); ok && x.recs[id].find(int32(slot)) >= 0 {
		return false
	}
	return true
}

// Forget drops everything slot holds; the slot may then be reused.
func (x *Index) Forget(slot int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if slot < 0 || slot >= len(x.slots) || !x.slots[slot].used {
		return
	}
	l := &x.slots[slot]
	for nd := l.head; nd >= 0; nd = l.nodes[nd].next {
		x.releaseLocked(int32(slot), l.nodes[nd].rec)
	}
	x.entries -= l.n
	*l = slotLRU{}
}

// Stats returns how many blocks the index remembers over all slots and an
// estimate of the memory they take.
func (x *Index) Stats() (entries int, bytes int64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.entries, int64(x.entries) * EntryBytes
}

// Resets returns how many times auto-tuning changed the block size.
func (x *Index) Resets() int64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.resets
}

// growLocked makes room for slot in x.slots. Caller must hold x.mu for
// writing.
func (x *Index) growLocked(slot int) {
	if slot >= len(x.slots) {
		x.slots = append(x.slots, make([]slotLRU, slot+1-len(x.slots))...)
	}
}

// slotLocked returns slot's LRU, putting it in use at the fallback size.
// Caller must hold x.mu for writing.
func (x *Index) slotLocked(slot int) *slotLRU {
	x.growLocked(slot)
	l := &x.slots[slot]
	if !l.used {
		l.used = true
		l.size = x.cfg.FallbackEntries
		l.reset()
	}
	return l
}

// newRecordLocked returns a record for h with no holders, entered in
// x.blocks. Caller must hold x.mu for writing.
func (x *Index) newRecordLocked(h uint64) int32 {
	var id int32
	if n := len(x.freeRecs); n > 0 {
		id = x.freeRecs[n-1]
		x.freeRecs = x.freeRecs[:n-1]
	} else {
		x.recs = append(x.recs, record{})
		id = int32(len(x.recs) - 1)
	}
	r := &x.recs[id]
	r.hash, r.n, r.more = h, 0, r.more[:0]
	x.blocks.put(h, id)
	return id
}

// releaseLocked drops slot from record id's holders, and the record with
// its table entry when no slot holds the block any more. The caller unlinks
// the node and counts it. Caller must hold x.mu for writing.
func (x *Index) releaseLocked(slot, id int32) {
	r := &x.recs[id]
	r.removeAt(r.find(slot))
	if l := &x.slots[slot]; l.size > 0 {
		if len(l.ghost) < l.size {
			l.ghost = make([]uint64, 1<<bits.Len(uint(l.size-1)))
		}
		l.ghost[r.hash&uint64(len(l.ghost)-1)] = r.hash
	}
	if r.n == 0 {
		x.blocks.del(r.hash)
		x.freeRecs = append(x.freeRecs, id)
	}
}

// resetLocked empties every slot, keeping their sizes. Caller must hold
// x.mu for writing.
func (x *Index) resetLocked() {
	x.blocks.reset()
	x.freeRecs = x.freeRecs[:0]
	for i := range x.recs {
		x.recs[i].n, x.recs[i].more = 0, x.recs[i].more[:0]
		x.freeRecs = append(x.freeRecs, int32(i))
	}
	for i := range x.slots {
		if x.slots[i].used {
			x.slots[i].reset()
		}
	}
	x.entries = 0
	x.resets++
}
