package prefix

import "encoding/json"

// minRef is the shortest text a [Parts] refers to instead of copying: a
// long prompt's text is hashed where it lies in the request body, one
// read of it fewer; a short one costs less to copy than to keep apart.
const minRef = 4 << 10

// Ref is a text of a canonical prompt left where it lies (in the request
// body), to be read at At, an offset into the glue.
type Ref struct {
	At   int
	Text []byte
}

// Parts is a canonical prompt in pieces: the bytes the canonicaliser wrote
// (Glue) with long plain texts referenced where they lie instead of
// copied into it (Refs, in order). Its bytes, [Parts.AppendTo], are
// exactly those of [AppendValidChat], [AppendValidCompletion],
// [AppendValidResponses] or [AppendValidMessages]; its block
// hashes, [Parts.AppendHashes], those of [AppendHashes] over them. A
// Parts refers to the request body it was made from and is valid as long
// as that body is.
type Parts struct {
	Glue []byte
	Refs []Ref
	// FirstUser and FirstTurn are, for a chat (or a Responses or Messages
	// request) with a user message, where the first one begins and ends
	// in the canonical bytes; 0 for any other prompt. Every turn of a conversation shares the bytes through
	// FirstTurn, and their blocks past FirstUser are what tells it from
	// other conversations on the same system prompt.
	FirstUser, FirstTurn int
}

// LaterTurn reports whether messages follow the first user message: the
// prompt is a later turn of a conversation.
func (p *Parts) LaterTurn() bool { return p.FirstTurn > 0 && p.FirstTurn < p.Len() }

// refList collects the texts of at least min bytes a canonicaliser
// refers to instead of copying.
type refList struct {
	refs []Ref
	min  int
}

// bytes is the length of the texts referred to.
func (l *refList) bytes() int {
	n := 0
	for _, r := range l.refs {
		n += len(r.Text)
	}
	return n
}

// SetValidChat makes p the canonical bytes of a chat request known to be
// valid JSON in valid UTF-8 (see [AppendValidChat]), writing the glue
// into the spare capacity of p.Glue[:0].
func (p *Parts) SetValidChat(messages, tools json.RawMessage) error {
	return p.setChat(messages, tools, minRef)
}

func (p *Parts) setChat(messages, tools json.RawMessage, min int) error {
	refs := refList{refs: p.Refs[:0], min: min}
	var err error
	var turn [2]int
	p.Glue, err = appendChat(p.Glue[:0], messages, tools, true, &refs, &turn)
	p.Refs = refs.refs
	p.FirstUser, p.FirstTurn = turn[0], turn[1]
	return err
}

// SetValidResponses is [Parts.SetValidChat] for a Responses API request
// (see [AppendValidResponses]).
func (p *Parts) SetValidResponses(instructions, input, tools json.RawMessage) error {
	return p.setResponses(instructions, input, tools, minRef)
}

func (p *Parts) setResponses(instructions, input, tools json.RawMessage, min int) error {
	refs := refList{refs: p.Refs[:0], min: min}
	var err error
	var turn [2]int
	p.Glue, err = appendResponses(p.Glue[:0], instructions, input, tools, true, &refs, &turn)
	p.Refs = refs.refs
	p.FirstUser, p.FirstTurn = turn[0], turn[1]
	return err
}

// SetValidMessages is [Parts.SetValidChat] for an Anthropic Messages API
// request (see [AppendValidMessages]).
func (p *Parts) SetValidMessages(system, messages, tools json.RawMessage) error {
	return p.setMessages(system, messages, tools, minRef)
}

func (p *Parts) setMessages(system, messages, tools json.RawMessage, min int) error {
	refs := refList{refs: p.Refs[:0], min: min}
	var err error
	var turn [2]int
	p.Glue, err = appendMessages(p.Glue[:0], system, messages, tools, true, &refs, &turn)
	p.Refs = refs.refs
	p.FirstUser, p.FirstTurn = turn[0], turn[1]
	return err
}

// SetValidCompletion is [Parts.SetValidChat] for a completion's prompt
// (see [AppendValidCompletion]).
func (p *Parts) SetValidCompletion(prompt json.RawMessage) error {
	return p.setCompletion(prompt, minRef)
}

func (p *Parts) setCompletion(prompt json.RawMessage, min int) error {
	refs := refList{refs: p.Refs[:0], min: min}
	var err error
	p.FirstUser, p.FirstTurn = 0, 0
	p.Glue, err = appendCompletion(p.Glue[:0], prompt, true, &refs)
	p.Refs = refs.refs
	return err
}

// Len returns the length of the canonical bytes.
func (p *Parts) Len() int {
	n := len(p.Glue)
	for _, r := range p.Refs {
		n += len(r.Text)
	}
	return n
}

// each calls f with the canonical bytes in order, in pieces.
func (p *Parts) each(f func([]byte) bool) {
	at := 0
	for _, r := range p.Refs {
		if !f(p.Glue[at:r.At]) || !f(r.Text) {
			return
		}
		at = r.At
	}
	f(p.Glue[at:])
}

// AppendRange appends the canonical bytes from offset from up to to
// (clamped to the prompt) to dst.
func (p *Parts) AppendRange(dst []byte, from, to int) []byte {
	at := 0
	p.each(func(b []byte) bool {
		lo, hi := max(from-at, 0), min(to-at, len(b))
		if lo < hi {
			dst = append(dst, b[lo:hi]...)
		}
		at += len(b)
		return at < to
	})
	return dst
}

// AppendTo appends the canonical bytes to dst.
func (p *Parts) AppendTo(dst []byte) []byte {
	p.each(func(b []byte) bool { dst = append(dst, b...); return true })
	return dst
}

// AppendHashes appends the chained hashes of the canonical bytes' first
// max full blocks of blockBytes bytes, as [AppendHashes] does over
// [Parts.AppendTo]'s bytes, and with partial a last block of what is left
// when fewer than max were full (hashed as one more link of the chain); a
// block inside one piece is hashed where it lies, one across pieces from a
// copy. [Index.AppendHashes] is this over a prompt in one piece.
func (p *Parts) AppendHashes(dst []uint64, seed uint64, blockBytes, max int, partial bool) []uint64 {
	if blockBytes <= 0 || max <= 0 {
		return dst
	}
	h := seed
	n := 0
	emit := func(block []byte) { // one link of AppendHashes' chain
		dst = AppendHashes(dst, h, block, len(block), 1)
		h = dst[len(dst)-1]
		n++
	}
	// carry is a block begun in one piece and ended in a later one; it
	// lives on the stack for the block sizes engines use (the pick makes
	// no allocation).
	var stack [1024]byte
	carry := stack[:0]
	p.each(func(b []byte) bool {
		if len(carry) > 0 { // end the block the pieces before began
			k := min(blockBytes-len(carry), len(b))
			carry, b = append(carry, b[:k]...), b[k:]
			if len(carry) < blockBytes {
				return true
			}
			emit(carry)
			carry = carry[:0]
		}
		m := len(dst)
		dst = AppendHashes(dst, h, b, blockBytes, max-n) // the piece's whole blocks, where they lie
		if k := len(dst) - m; k > 0 {
			n += k
			h = dst[len(dst)-1]
		}
		if n < max { // less than a block is left: it begins the next one
			carry = append(carry, b[(len(dst)-m)*blockBytes:]...)
		}
		return n < max
	})
	if partial && n < max && len(carry) > 0 {
		emit(carry)
	}
	return dst
}

// HashShape returns how [Index.AppendHashes] cuts a prompt: the block
// size, the most blocks, and whether a partial last block is hashed; with
// it, [Parts.AppendHashes] gives the index's hashes of a prompt in parts.
func (x *Index) HashShape() (blockBytes, maxBlocks int, partial bool) {
	return x.BlockBytes(), x.cfg.MaxBlocks, x.cfg.Partial
}
