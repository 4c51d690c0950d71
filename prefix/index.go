package prefix

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
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

// bytesPerToken is the rule of thumb converting engine tokens to canonical
// bytes: about 4 bytes of English text per token for Llama-style
// tokenizers, and exactly 4 for token-id prompts.
const bytesPerToken = 4

// minAutoBlockBytes keeps auto-tuned blocks coarse enough that MaxBlocks
// covers a long prompt, while one block is still a small fraction of it.
const minAutoBlockBytes = 256

// EntryBytes estimates the memory one remembered block costs: a simplelru
// entry and its map slot, plus the reverse-map slot and its holder list
// (BenchmarkIndexMemory measures it).
const EntryBytes = 140

// Index is an approximate prefix-cache index: per backend slot, an LRU of
// the block hashes sent there, sized from that backend's KV capacity, and
// one reverse map from block hash to the slots holding it. Slots are small
// integers the caller assigns, one per backend, reused after [Index.Forget].
//
// All methods are safe for concurrent use. Lookups share a read lock;
// inserts, resizes and evictions take the write lock, and the LRUs'
// eviction callbacks run under it.
type Index struct {
	cfg        Config
	blockBytes atomic.Int64

	mu       sync.RWMutex
	lrus     []*simplelru.LRU[uint64, struct{}] // guarded by mu; by slot, nil when unused
	engBlock []int                              // guarded by mu; by slot, the engine block size reported (tokens)
	caps     []int                              // guarded by mu; by slot, the LRU's size
	holders  map[uint64][]int32                 // guarded by mu; block hash → slots holding it
	entries  int                                // guarded by mu; sum of LRU lengths
	resets   int64                              // guarded by mu; times the block size changed
}

// NewIndex returns an empty index.
func NewIndex(cfg Config) *Index {
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultConfig().MaxBlocks
	}
	if cfg.FallbackEntries <= 0 {
		cfg.FallbackEntries = DefaultConfig().FallbackEntries
	}
	x := &Index{cfg: cfg, holders: make(map[uint64][]int32)}
	bb := cfg.BlockBytes
	if bb == 0 {
		bb = autoBlockBytes(16)
	}
	x.blockBytes.Store(int64(bb))
	return x
}

func autoBlockBytes(engineBlock int) int {
	unit := engineBlock * bytesPerToken
	if unit <= 0 {
		unit = 16 * bytesPerToken
	}
	return (minAutoBlockBytes + unit - 1) / unit * unit
}

// BlockBytes returns the current block size in bytes.
func (x *Index) BlockBytes() int { return int(x.blockBytes.Load()) }

// BlockTokens returns about how many engine tokens one block holds.
func (x *Index) BlockTokens() int { return x.BlockBytes() / bytesPerToken }

// AppendHashes appends the chained hashes of prompt's blocks at the
// index's block size, at most MaxBlocks of them.
func (x *Index) AppendHashes(dst []uint64, seed uint64, prompt []byte) []uint64 {
	bb := x.BlockBytes()
	n := len(dst)
	dst = AppendHashes(dst, seed, prompt, bb, x.cfg.MaxBlocks)
	full := len(dst) - n
	if x.cfg.Partial && full < x.cfg.MaxBlocks && len(prompt) > full*bb {
		prev := seed
		if full > 0 {
			prev = dst[len(dst)-1]
		}
		dst = AppendHashes(dst, prev, prompt[full*bb:], len(prompt)-full*bb, 1)
	}
	return dst
}

// Match sets dst[slot] to the number of leading blocks of hashes that slot
// holds, for every slot holding the first block, and returns the longest
// such run. The walk stops at the first block no slot holds, or when no
// slot still matches every block so far. dst must be zero where it is read
// and at least as long as the highest slot in use plus one; shorter means
// those slots are not counted.
func (x *Index) Match(hashes []uint64, dst []int32) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	best := 0
	for i, h := range hashes {
		going := false
		for _, s := range x.holders[h] {
			if int(s) < len(dst) && int(dst[s]) == i {
				dst[s] = int32(i + 1)
				going = true
			}
		}
		if !going {
			break
		}
		best = i + 1
	}
	return best
}

// Insert records that slot now holds every block of hashes, as the engine
// will once it has prefilled them, and marks them most recently used.
func (x *Index) Insert(slot int, hashes []uint64) {
	if slot < 0 || len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.lruLocked(slot)
	for _, h := range hashes {
		if _, ok := l.Get(h); ok { // refreshes recency
			continue
		}
		l.Add(h, struct{}{})
		x.holders[h] = append(x.holders[h], int32(slot))
		x.entries++
	}
}

// Resize sizes slot's LRU from the backend's KV cache: blockTokens tokens
// per engine block times numBlocks blocks, in the index's block unit. Zero
// for either means unknown, and the slot gets FallbackEntries. With auto
// block size, a larger engine block than any seen so far re-tunes the
// block size, which empties the index (hashes at the old size would never
// match again).
func (x *Index) Resize(slot, blockTokens, numBlocks int) {
	if slot < 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.growLocked(slot)
	x.engBlock[slot] = blockTokens
	if x.cfg.BlockBytes == 0 {
		largest := 16
		for _, b := range x.engBlock {
			largest = max(largest, b)
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
		size = max(1, blockTokens*numBlocks/max(1, x.BlockTokens()))
	}
	l := x.lruLocked(slot)
	if size != x.caps[slot] {
		l.Resize(size)
		x.caps[slot] = size
	}
}

// Forget drops everything slot holds; the slot may then be reused.
func (x *Index) Forget(slot int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if slot < 0 || slot >= len(x.lrus) || x.lrus[slot] == nil {
		return
	}
	x.lrus[slot].Purge()
	x.lrus[slot] = nil
	x.engBlock[slot] = 0
	x.caps[slot] = 0
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

func (x *Index) growLocked(slot int) {
	for len(x.lrus) <= slot {
		x.lrus = append(x.lrus, nil)
		x.engBlock = append(x.engBlock, 0)
		x.caps = append(x.caps, 0)
	}
}

// lruLocked returns slot's LRU, making it at the fallback size. Caller must
// hold x.mu for writing.
func (x *Index) lruLocked(slot int) *simplelru.LRU[uint64, struct{}] {
	x.growLocked(slot)
	if l := x.lrus[slot]; l != nil {
		return l
	}
	s := int32(slot)
	// The callback runs inside Add, Resize and Purge, all called with
	// x.mu held for writing.
	l, _ := simplelru.NewLRU(x.cfg.FallbackEntries, func(h uint64, _ struct{}) { x.dropHolderLocked(h, s) })
	x.lrus[slot] = l
	x.caps[slot] = x.cfg.FallbackEntries
	return l
}

func (x *Index) dropHolderLocked(h uint64, slot int32) {
	x.entries--
	hs := x.holders[h]
	for i, s := range hs {
		if s == slot {
			hs[i] = hs[len(hs)-1]
			hs = hs[:len(hs)-1]
			break
		}
	}
	if len(hs) == 0 {
		delete(x.holders, h)
		return
	}
	x.holders[h] = hs
}

// resetLocked empties every slot, keeping their sizes.
func (x *Index) resetLocked() {
	for _, l := range x.lrus {
		if l != nil {
			l.Purge()
		}
	}
	x.resets++
}
