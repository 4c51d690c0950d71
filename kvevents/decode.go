package kvevents

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Kind is what an [Event] says happened to a server's cache.
type Kind uint8

const (
	// Stored: blocks entered the prefix cache.
	Stored Kind = iota + 1
	// Removed: blocks left it.
	Removed
	// Cleared: the cache was emptied (a reset, or the engine restarted).
	Cleared
)

// Event is one decoded KV-cache event.
type Event struct {
	Kind Kind
	// Hashes are the engine's block hashes, as 64 bits: an integer hash
	// as its bits, a byte-string hash (vLLM's sha256 variants) by its
	// xxhash.
	Hashes []uint64
	// Parent is the engine hash of the block the first stored block
	// extends; HasParent is false for a prompt's first block.
	Parent    uint64
	HasParent bool
	// Tokens are the stored blocks' token ids, BlockSize per block.
	Tokens    []uint32
	BlockSize int
	// LoRA names the adapter the blocks were computed with; "" is the
	// base model. An engine that sends only a numeric lora_id (vLLM
	// before lora_name) gets "#<id>", which no prompt matches.
	LoRA string
	// Opaque: some block carries extra hash keys besides the adapter's
	// name (multimodal inputs, a cache salt, prompt embeddings), which a
	// prompt's token ids do not tell, so the blocks match no prompt.
	Opaque bool
	// Other: the blocks are not in GPU memory (an offloading tier's
	// medium) or belong to another KV-cache group than the first (hybrid
	// models); they are not what a prefix hit on this server reuses.
	Other bool

	extra string // a one-string extra key, until check compares it with LoRA
}

// Batch is one published message: the events of one engine step.
type Batch struct {
	TS     float64
	Events []Event
	// Rank is the data-parallel rank that published the batch, -1 when
	// the batch does not say.
	Rank int
}

// maxTokens bounds the token ids of one event: far above a step's worth.
const maxTokens = 1 << 22

// Decode reads one event batch payload, in either encoding vLLM has used:
// arrays (msgspec array_like, vLLM up to 0.10: [ts, events, rank] and
// [tag, fields...]) or maps (later releases: {"ts", "events",
// "data_parallel_rank"} and {"type": tag, field: value, ...}). Fields it
// does not know are skipped; a malformed payload is an error and decodes
// to nothing.
func Decode(payload []byte) (Batch, error) {
	r := &reader{b: payload}
	b := Batch{Rank: -1}
	c, err := r.peek()
	if err != nil {
		return Batch{}, err
	}
	if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
		err = b.decodeMap(r)
	} else {
		err = b.decodeArray(r)
	}
	if err != nil {
		return Batch{}, fmt.Errorf("kv event batch: %w", err)
	}
	if r.off != len(r.b) {
		return Batch{}, fmt.Errorf("kv event batch: %d bytes after the batch", len(r.b)-r.off)
	}
	return b, nil
}

func (b *Batch) decodeArray(r *reader) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("a batch array has %d fields, want ts and events", n)
	}
	if b.TS, err = r.float(); err != nil {
		return err
	}
	if err := b.decodeEvents(r); err != nil {
		return err
	}
	for i := 2; i < n; i++ {
		switch {
		case i > 2:
			err = r.skip(0)
		case !r.nil():
			var rank uint64
			rank, err = r.int()
			b.Rank = clampInt(rank)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *Batch) decodeMap(r *reader) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	seen := false
	for range n {
		k, err := r.str()
		if err != nil {
			return err
		}
		switch string(k) {
		case "ts":
			b.TS, err = r.float()
		case "events":
			err, seen = b.decodeEvents(r), true
		case "data_parallel_rank":
			if !r.nil() {
				var rank uint64
				rank, err = r.int()
				b.Rank = clampInt(rank)
			}
		default:
			err = r.skip(0)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	if !seen {
		return errors.New("a batch map has no events")
	}
	return nil
}

func (b *Batch) decodeEvents(r *reader) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	b.Events = make([]Event, 0, n)
	for i := range n {
		var e Event
		c, err := r.peek()
		if err != nil {
			return err
		}
		if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
			err = e.decodeMap(r)
		} else {
			err = e.decodeArray(r)
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if err := e.check(); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	return nil
}

func kindOf(tag []byte) (Kind, error) {
	switch string(tag) {
	case "BlockStored":
		return Stored, nil
	case "BlockRemoved":
		return Removed, nil
	case "AllBlocksCleared":
		return Cleared, nil
	}
	return 0, fmt.Errorf("unknown event type %q", tag)
}

// The fields of each event type in array order after the tag, as in
// vllm/distributed/kv_events.py; older releases stop earlier and had
// num_toks_per_block (a list) where block_size is.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (e *Event) decodeArray(r *reader) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("an event array has no tag")
	}
	tag, err := r.str()
	if err != nil {
		return err
	}
	if e.Kind, err = kindOf(tag); err != nil {
		return err
	}
	var fields []string
	switch e.Kind {
	case Stored:
		fields = storedFields
	case Removed:
		fields = removedFields
	}
	for i := 1; i < n; i++ {
		name := ""
		if i-1 < len(fields) {
			name = fields[i-1]
		}
		if err := e.field(r, name); err != nil {
			return fmt.Errorf("%s: %w", tag, err)
		}
	}
	return nil
}

func (e *Event) decodeMap(r *reader) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	// The tag may come anywhere; fields are read into e whatever its kind
	// and checked once the kind is known.
	for range n {
		k, err := r.str()
		if err != nil {
			return err
		}
		if string(k) == "type" {
			tag, err := r.str()
			if err != nil {
				return err
			}
			if e.Kind, err = kindOf(tag); err != nil {
				return err
			}
			continue
		}
		if err := e.field(r, string(k)); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	if e.Kind == 0 {
		return errors.New("an event map has no type")
	}
	return nil
}

// field reads the value of one named field into e; an unknown name is
// skipped.
func (e *Event) field(r *reader, name string) error {
	var err error
	switch name {
	case "block_hashes":
		e.Hashes, err = hashes(r)
	case "parent_block_hash":
		if !r.nil() {
			e.Parent, err = hash(r)
			e.HasParent = true
		}
	case "token_ids":
		e.Tokens, err = tokens(r)
	case "block_size":
		err = e.blockSize(r)
	case "lora_id":
		if !r.nil() {
			var id uint64
			if id, err = r.int(); err == nil && e.LoRA == "" {
				e.LoRA = "#" + strconv.FormatInt(int64(id), 10)
			}
		}
	case "lora_name":
		if !r.nil() {
			var s []byte
			if s, err = r.str(); err == nil {
				e.LoRA = string(s)
			}
		}
	case "medium":
		if !r.nil() {
			var s []byte
			if s, err = r.str(); err == nil && string(s) != "GPU" {
				e.Other = true
			}
		}
	case "group_idx":
		if !r.nil() {
			var g uint64
			if g, err = r.int(); err == nil && g != 0 {
				e.Other = true
			}
		}
	case "extra_keys":
		err = e.extraKeys(r)
	default:
		err = r.skip(0)
	}
	return err
}

// blockSize reads block_size, or the older num_toks_per_block list, whose
// entries must then be equal.
func (e *Event) blockSize(r *reader) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	if c&0xf0 != 0x90 && c != 0xdc && c != 0xdd {
		v, err := r.int()
		e.BlockSize = clampInt(v)
		return err
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	for i := range n {
		v, err := r.int()
		if err != nil {
			return err
		}
		if i == 0 {
			e.BlockSize = clampInt(v)
		} else if clampInt(v) != e.BlockSize {
			e.BlockSize = -1 // blocks of unequal sizes: not full blocks
		}
	}
	return nil
}

// extraKeys reads one entry per block, nil or a tuple. A tuple that holds
// only the adapter's name adds nothing a prompt cannot tell; any other
// makes the blocks opaque. The adapter's name is not known until
// lora_name is read, so a one-string tuple is held for check.
func (e *Event) extraKeys(r *reader) error {
	if r.nil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	for range n {
		if r.nil() {
			continue
		}
		start := r.off
		m, err := r.arrayLen()
		if err != nil {
			// Not a tuple: something a prompt does not tell.
			r.off = start
			if err := r.skip(1); err != nil {
				return err
			}
			e.Opaque = true
			continue
		}
		if m == 1 {
			if c, _ := r.peek(); c&0xe0 == 0xa0 || c >= 0xd9 && c <= 0xdb {
				s, err := r.str()
				if err != nil {
					return err
				}
				e.extraName(string(s))
				continue
			}
		}
		for range m {
			if err := r.skip(1); err != nil {
				return err
			}
		}
		if m > 0 {
			e.Opaque = true
		}
	}
	return nil
}

// extraName notes a one-string extra key, which is the adapter's name
// when lora_name says so; check decides once every field is read.
func (e *Event) extraName(s string) {
	if e.extra == "" {
		e.extra = s
	} else if e.extra != s {
		e.Opaque = true
	}
}

// check validates what the fields say together.
func (e *Event) check() error {
	if e.extra != "" && e.extra != e.LoRA {
		e.Opaque = true
	}
	e.extra = ""
	if e.Kind != Stored {
		return nil
	}
	if e.BlockSize <= 0 {
		return fmt.Errorf("block size %d", e.BlockSize)
	}
	if len(e.Tokens) != len(e.Hashes)*e.BlockSize {
		return fmt.Errorf("%d token ids for %d blocks of %d", len(e.Tokens), len(e.Hashes), e.BlockSize)
	}
	return nil
}

func hash(r *reader) (uint64, error) {
	if r.isBin() {
		b, err := r.bin()
		return xxhash.Sum64(b), err
	}
	return r.int()
}

func hashes(r *reader) ([]uint64, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = hash(r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func tokens(r *reader) ([]uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n > maxTokens {
		return nil, fmt.Errorf("%d token ids in one event", n)
	}
	out := make([]uint32, n)
	for i := range out {
		v, err := r.int()
		if err != nil {
			return nil, err
		}
		if v > 1<<32-1 {
			return nil, fmt.Errorf("token id %d", int64(v))
		}
		out[i] = uint32(v)
	}
	return out, nil
}

func clampInt(v uint64) int {
	if int64(v) < 0 || v > 1<<31 {
		return -1
	}
	return int(v)
}
