package balancer

import (
	"math"
	"time"

	"github.com/llmlb/llmlb/prefix"

	"github.com/cespare/xxhash/v2"
)

// hashPrompt is the stage before any lock: it hashes the prompt into
// blocks, sets the pick's key, and asks the prefix index how many leading
// blocks each backend slot holds (s.bySlot).
func (b *Balancer) hashPrompt(s *scratch, p *PickInfo) {
	req := p.Req
	s.matched = false
	if !req.hasPrompt() {
		return
	}
	if idx := b.pol.index; idx != nil {
		bb, most, partial := idx.HashShape()
		if req.Parts != nil {
			s.hashes = req.Parts.AppendHashes(s.hashes[:0], req.Seed, bb, most, partial)
		} else {
			s.hashes = idx.AppendHashes(s.hashes[:0], req.Seed, req.Prompt)
		}
		p.hashes = s.hashes
		p.PromptBlocks = len(s.hashes)
		if req.FirstTurn > 0 && len(s.hashes) > 0 {
			p.Conversation, s.tail = conversation(req, s.hashes, bb, s.tail[:0])
		}
		if len(s.hashes) > 0 {
			p.Key = s.hashes[0]
			by := grow(s.bySlot, p.snap.slots)
			clear(by)
			s.bySlot = by
			s.matched = idx.Match(s.hashes, by) > 0
		}
	}
	if p.Key == 0 {
		if req.Parts != nil { // keyOf's hash: the first 256 bytes, or all of a shorter prompt
			s.hashes = req.Parts.AppendHashes(s.hashes[:0], req.Seed, 256, 1, true)
			p.Key, s.hashes = s.hashes[0], s.hashes[:0]
		} else {
			p.Key = keyOf(req.Seed, req.Prompt)
		}
	}
}

// conversation returns [PickInfo.Conversation] for a chat whose prompt hashed
// to hashes in blocks of bb bytes, reading the bytes after the last whole
// block into buf, which it returns for reuse.
func conversation(req *Request, hashes []uint64, bb int, buf []byte) (uint64, []byte) {
	j := req.FirstTurn/bb - 1 // the last whole block of the first turn
	switch {
	case req.FirstUser < bb:
		return hashes[0], buf // the first block is the conversation's own
	case j >= len(hashes):
		return hashes[len(hashes)-1], buf
	}
	from, to := (j+1)*bb, min(req.FirstTurn, (j+1)*bb+maxTail)
	if req.Parts != nil {
		buf = req.Parts.AppendRange(buf, from, to)
	} else if to <= len(req.Prompt) {
		buf = append(buf, req.Prompt[from:to]...)
	}
	var d xxhash.Digest
	d.ResetWithSeed(hashes[j])
	_, _ = d.Write(buf)
	return d.Sum64(), buf
}

// maxTail bounds the bytes after a conversation's last whole block that
// its key reads: blocks are 256 bytes unless the engines' are larger.
const maxTail = 1024

// applyMatch fills in each candidate's share of the prompt from the index
// match; for the presets with [Preset.TrueCache], from the engines' true
// caches instead; and with KV events ([Deps.Events]), from the longer of
// the index's match and the events'.
func (b *Balancer) applyMatch(s *scratch, p *PickInfo) {
	req := p.Req
	if !req.hasPrompt() {
		return
	}
	bb := prefix.EngineBlockTokens * prefix.BytesPerToken
	if idx := b.pol.index; idx != nil {
		bb, _, _ = idx.HashShape()
	}
	if b.pol.oracle != nil {
		// The true cache is counted in tokens: a block is a token.
		p.PromptBlocks = req.PromptTokens
	}
	bytes := req.promptBytes()
	for i := range p.Cands {
		c := &p.Cands[i]
		// The prompt's tokens and a block's, at the backend's learned
		// rate, else as the caller and the default rate estimate them.
		prompt, blockTokens := req.PromptTokens, float64(bb)/prefix.BytesPerToken
		if r := c.Backend.Ledger.tok.rate(); b.pol.learnTokens && r > 0 {
			prompt, blockTokens = int(math.Ceil(float64(bytes)/r)), float64(bb)/r
		}
		if sl := c.Backend.slot; s.matched && sl < len(s.bySlot) {
			c.MatchedBlocks = int(s.bySlot[sl])
		}
		c.MatchedTokens = min(int(float64(c.MatchedBlocks)*blockTokens), prompt)
		switch {
		case b.pol.oracle != nil:
			c.MatchedTokens = min(b.pol.oracle.CachedTokens(c.Backend, req), prompt)
			c.MatchedBlocks = c.MatchedTokens
		case b.pol.events != nil:
			// The server's own events add what other balancers sent
			// there; what this one sent and the server has not yet
			// computed (queued), which no event has named yet, stays.
			if n, ok := b.pol.events.Held(c.Backend, req); ok && min(n, prompt) > c.MatchedTokens {
				c.MatchedTokens = min(n, prompt)
				c.MatchedBlocks = int(math.Ceil(float64(c.MatchedTokens) / blockTokens))
			}
		}
		c.UncachedTokens = prompt - c.MatchedTokens
	}
}

// stepSlack is how many times a step's prefill time a prefill seen in
// progress is believed to go on without a later step reported.
const stepSlack = 1.5

// othersPrefilling is the prefill work the backend's KV events show in
// progress that is not ours, which our ledger cannot see: it adds to our
// pending prompts ([Ledger.aheadTokens]) in what is ahead of a new
// request. Which sequences are ours the events do not say, so our pending
// requests, and those whose first byte came since a pick first read that
// step, are taken to be as many of them (all, with no other balancer) and
// the rest count by their share. A prefill seen in progress is taken to
// have as much left as it has done (its prompt's length is unknown here;
// for lengths with a Pareto tail of index 2 that is the expected
// remainder), less what the backend's rate has prefilled since the step
// the events reported, and to have ended if no later step has been
// reported by the time half as long again as that step's prefill should
// take (a server prefilling sends a batch of events every step).
func (b *Balancer) othersPrefilling(be *Backend, pending int64, now time.Time) float64 {
	l := be.Ledger
	p, ok := b.pol.events.Prefilling(be)
	if !ok || p.Done <= 0 {
		return 0
	}
	if at := p.At.UnixNano(); l.eventsAt.Load() != at {
		l.eventsPrefilled.Store(l.prefilled.Load())
		l.eventsAt.Store(at)
	}
	others := int64(p.Sequences) - pending - (l.prefilled.Load() - l.eventsPrefilled.Load())
	if others <= 0 {
		return 0
	}
	rate := b.cfg.TTFT.PrefillRate
	if est := l.est.load(); est.learned() {
		rate = est.Rate
	}
	since := now.Sub(p.At).Seconds()
	if since > stepSlack*float64(p.Step)/rate {
		return 0
	}
	return max(0, float64(p.Done)-rate*since) * float64(others) / float64(p.Sequences)
}

// work is what p's request costs candidate c.
func (b *Balancer) work(p *PickInfo, c *Candidate) Work {
	req := p.Req
	decode := req.MaxTokens
	if decode <= 0 {
		decode = b.cfg.TTFT.DefaultMaxTokens
	}
	inv := 1 / b.cfg.TTFT.PrefillRate
	if est := c.Backend.Ledger.est.load(); est.learned() {
		inv = 1 / est.Rate
	}
	w := Work{UncachedTokens: c.UncachedTokens, DecodeTokens: decode, Adapter: c.adapter, AheadTokens: c.AheadTokens, QueuedAhead: c.Queued, SlotWait: c.slotWait,
		PrefillSeconds: float64(c.UncachedTokens) * inv}
	// A stored response's follow-up (Holder) teaches no rate: its server
	// counts the whole stored conversation, not the bytes seen here.
	if req.Holder == "" {
		w.PromptBytes = req.promptBytes()
	}
	if idx := b.pol.index; b.pol.learnTokens && len(p.hashes) > 0 {
		bb, _, _ := idx.HashShape()
		w.Matched, w.MatchedBytes = true, min(c.MatchedBlocks*bb, w.PromptBytes)
		w.NextEvicted = c.MatchedBlocks < len(p.hashes) && idx.Evicted(c.Backend.slot, p.hashes[c.MatchedBlocks])
	}
	return w
}

// keyOf hashes the start of a prompt too short for one block.
func keyOf(seed uint64, prompt []byte) uint64 {
	if len(prompt) > 256 {
		prompt = prompt[:256]
	}
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(prompt)
	return d.Sum64()
}
