package balancer

import (
	"math"

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
