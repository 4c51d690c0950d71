package sim

func (e *Engine) pushTail(b int32) {
	s := int32(e.cfg.NumBlocks)
	p := e.prev[s]
	e.next[p], e.prev[b], e.next[b], e.prev[s] = b, p, s, b
	e.nfree++
}

func (e *Engine) pushHead(b int32) {
	s := int32(e.cfg.NumBlocks)
	n := e.next[s]
	e.prev[n], e.next[b], e.prev[b], e.next[s] = b, n, s, b
	e.nfree++
}

func (e *Engine) unlink(b int32) {
	p, n := e.prev[b], e.next[b]
	e.next[p], e.prev[n] = n, p
	e.nfree--
}

// allocate takes the block at the head of the free list, evicting its
// cached content.
func (e *Engine) allocate() int32 {
	b := e.next[e.cfg.NumBlocks]
	e.unlink(b)
	if e.hasHash[b] {
		delete(e.cache, e.hash[b])
		e.hasHash[b] = false
		if e.cfg.KVEvents {
			e.kv = append(e.kv, KVEvent{Hash: e.hash[b]})
		}
	}
	e.ref[b] = 1
	return b
}

// release drops s's blocks. As vLLM does, the blocks go to the tail of the
// free list last block first, so a request's tail is evicted before its
// head, which other requests are more likely to share; blocks with no
// cached content go to the head, to be reused first.
func (e *Engine) release(s *Seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		b := s.blocks[i]
		e.ref[b]--
		if e.ref[b] > 0 {
			continue
		}
		if e.hasHash[b] {
			e.pushTail(b)
		} else {
			e.pushHead(b)
		}
	}
	s.blocks = s.blocks[:0]
	s.computed, s.hashed = 0, 0
}

// admit takes blocks for waiting sequence s: its cached prefix, then new
// blocks for the first chunk of what is left. It reports false, changing
// nothing, when the free blocks do not suffice.
func (e *Engine) admit(s *Seq, budget int) bool {
	bs := e.cfg.BlockSize
	hit := 0
	if !e.cfg.NoPrefixCaching {
		// At least one token is computed, to sample from.
		limit := min(len(s.Hashes), (s.known()-1)/bs)
		for hit < limit {
			if _, ok := e.cache[s.Hashes[hit]]; !ok {
				break
			}
			hit++
		}
	}
	n := min(s.known()-hit*bs, budget)
	fresh := ceilDiv(hit*bs+n, bs) - hit
	reuse := 0 // hit blocks that are free now and stop being free
	for _, h := range s.Hashes[:hit] {
		if e.ref[e.cache[h]] == 0 {
			reuse++
		}
	}
	if fresh+reuse > e.nfree {
		return false
	}
	for _, h := range s.Hashes[:hit] {
		b := e.cache[h]
		if e.ref[b] == 0 {
			e.unlink(b)
		}
		e.ref[b]++
		s.blocks = append(s.blocks, b)
	}
	for range fresh {
		s.blocks = append(s.blocks, e.allocate())
	}
	s.computed, s.hashed = hit*bs, hit
	if s.Preemptions == 0 {
		s.CachedTokens = hit * bs
	}
	e.queries += int64(s.PromptTokens)
	e.hits += int64(min(hit*bs, s.PromptTokens))
	s.state = seqRunning
	return true
}

// register enters s's full prompt blocks up to its first tokens into the
// prefix cache. Unless CacheOnCompute, plan calls it with the tokens the
// step being planned computes, as vLLM V1 does when it allocates them
// (KVCacheManager.allocate_slots caches up to the computed tokens plus the
// tokens scheduled now, vllm/v1/core/kv_cache_manager.py at 003df29), so a
// request admitted later in the same step hits them: each layer writes the
// whole batch's keys and values before its attention reads them.
func (e *Engine) register(s *Seq, tokens int) {
	if e.cfg.NoPrefixCaching {
		return
	}
	full := min(tokens/e.cfg.BlockSize, len(s.Hashes))
	for ; s.hashed < full; s.hashed++ {
		b, h := s.blocks[s.hashed], s.Hashes[s.hashed]
		if _, dup := e.cache[h]; dup || e.hasHash[b] {
			continue
		}
		e.hash[b], e.hasHash[b] = h, true
		e.cache[h] = b
		if e.cfg.KVEvents && len(s.Tokens) >= (s.hashed+1)*e.cfg.BlockSize {
			ev := KVEvent{Stored: true, Hash: h, Adapter: s.Adapter,
				Tokens: s.Tokens[s.hashed*e.cfg.BlockSize : (s.hashed+1)*e.cfg.BlockSize]}
			if s.hashed > 0 {
				ev.Parent, ev.HasParent = s.Hashes[s.hashed-1], true
			}
			e.kv = append(e.kv, ev)
		}
	}
}

// Holds reports how many leading tokens of a prompt with these block
// hashes the prefix cache holds now.
func (e *Engine) Holds(hashes []uint64) int {
	if e.cfg.NoPrefixCaching {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if _, ok := e.cache[h]; !ok {
			break
		}
		n++
	}
	return n * e.cfg.BlockSize
}

// KVEvent is one block entering (Stored) or leaving the prefix cache, as
// vLLM's KV events report it (vllm/distributed/kv_events.py).
type KVEvent struct {
	Stored bool
	Hash   uint64
	// Parent is the hash of the block this one extends, for a stored
	// block past the prompt's first.
	Parent    uint64
	HasParent bool
	// Tokens are a stored block's token ids; they alias the sequence's.
	Tokens  []uint32
	Adapter string
}

// TakeKVEvents returns the events recorded since the last call, in order,
// appended to dst.
func (e *Engine) TakeKVEvents(dst []KVEvent) []KVEvent {
	dst = append(dst, e.kv...)
	clear(e.kv)
	e.kv = e.kv[:0]
	return dst
}
