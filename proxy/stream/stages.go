package stream

import (
	"bytes"
	"encoding/json"
	"slices"
)

// event runs one whole event through the stages, in this order, and
// appends what is left of it to out:
//
//  1. parse each data line once ([chunk.parse]);
//  2. whole: the API's terminator, the server's error events ([Reader.ends]);
//  3. continuation bookkeeping: what the client received, and a
//     continuation's events made the first stream's ([Reader.track]);
//  4. usage and inter-token timing ([Reader.observe]);
//  5. the usage strip ([Reader.keep]);
//  6. the model name and response ids as the client knows them (Options.Edit).
//
// A data line that a stage drops leaves the event's other lines; an event
// left with no data line is dropped whole.
func (r *Reader) event(ev []byte) {
	r.chunks = r.chunks[:0]
	text := r.scratch[:0]
	for rest := ev; len(rest) > 0; {
		var line []byte
		line, rest = nextLine(rest)
		if data, ok := dataOf(line); ok {
			r.chunks = append(r.chunks, chunk{})
			c := &r.chunks[len(r.chunks)-1]
			text = c.parse(r.opt.API, data, text)
		}
	}
	r.scratch = text[:0]

	edited := r.edited[:0]
	kept, dropped, i := false, false, 0
	for rest := ev; len(rest) > 0; {
		var line []byte
		line, rest = nextLine(rest)
		if _, ok := dataOf(line); !ok {
			edited = append(edited, line...)
			continue
		}
		c := &r.chunks[i]
		i++
		if !r.ends(c) {
			return // an error event broke the stream: nothing of it goes on
		}
		var keep bool
		if line, keep = r.track(c, line); keep {
			r.observe(c)
			keep = r.keep(c)
		}
		if !keep {
			dropped = true
			continue
		}
		kept = true
		edited = append(edited, line...)
	}
	r.edited = edited
	if dropped && !kept {
		return
	}
	if r.opt.Edit != nil {
		r.out = r.opt.Edit(r.out, edited)
	} else {
		r.out = append(r.out, edited...)
	}
}

// ends records the API's terminator and the server's error events, and
// reports whether the stream goes on: an error event in a completions or
// chat stream that can still be continued breaks it instead.
func (r *Reader) ends(c *chunk) bool {
	switch r.opt.API {
	case Completions, Chat:
		switch {
		case c.done:
			r.whole = true
		case c.failed:
			if !r.finished && r.continuable() == "" {
				r.brk = errServerError
				return false
			}
			r.failed = true
		}
	case Messages:
		switch {
		case c.is("message_stop"):
			r.whole = true
		case c.is("error"):
			r.failed = true
		}
	case Responses:
		switch {
		case c.is("response.completed"), c.is("response.incomplete"), c.is("response.failed"):
			r.whole = true
		case c.is("error"):
			r.failed = true
		}
	}
	return true
}

// track records what the client receives of a chunk, and makes a
// continuation's chunk one of the client's stream: the first stream's id
// and created, the usage counted over the whole answer. keep is false for
// the continuation's role preamble, which the client had.
func (r *Reader) track(c *chunk, line []byte) (out []byte, keep bool) {
	if r.opt.API == Responses || r.opt.API == Messages {
		if c.seq >= 0 {
			r.seq = c.seq
		}
		switch {
		case c.toolUse:
			r.why = "tool_call"
		case c.is("message_delta") && c.stop:
			r.finished = true
		}
		return line, true
	}
	if !c.obj {
		return line, true
	}
	if r.cont {
		if r.contID == nil {
			r.contID, r.contCreated = bytes.Clone(c.id), bytes.Clone(c.created)
		}
		if c.roleOnly && c.usage == nil {
			return nil, false
		}
		line = r.edit(c, line)
	} else if r.id == nil {
		r.id, r.created = bytes.Clone(c.id), bytes.Clone(c.created)
	}
	if u := c.wire(); u != nil && c.choices > 0 {
		r.usageTokens = r.contDelivered + u.CompletionTokens // continuous usage
	}
	r.text.Write(c.text)
	r.events += c.texts
	switch {
	case c.tool:
		r.why = "tool_call"
	case c.reasoning:
		r.why = "reasoning"
	}
	r.finished = r.finished || c.finish
	return line, true
}

// edit gives a continuation's chunk the first stream's id and created
// and, on its usage chunk, the usage of the whole answer: the
// continuation's prompt holds the tokens delivered before it, which the
// client's usage counts once, as completion tokens.
func (r *Reader) edit(c *chunk, line []byte) []byte {
	type span struct {
		val, with []byte
	}
	var spans [3]span
	n := 0
	if len(c.id) > 0 && len(r.id) > 0 && !bytes.Equal(c.id, r.id) {
		spans[n] = span{c.id, r.id}
		n++
	}
	if len(c.created) > 0 && len(r.created) > 0 && !bytes.Equal(c.created, r.created) {
		spans[n] = span{c.created, r.created}
		n++
	}
	if u := c.wire(); u != nil && c.choices == 0 {
		w := r.counted(u)
		fixed := map[string]any{"prompt_tokens": w.PromptTokens, "completion_tokens": w.CompletionTokens, "total_tokens": w.PromptTokens + w.CompletionTokens}
		if d := w.PromptTokensDetails; d != nil && d.CachedTokens != nil {
			fixed["prompt_tokens_details"] = map[string]int{"cached_tokens": *d.CachedTokens}
		}
		val, _ := json.Marshal(fixed)
		spans[n] = span{c.usage, val}
		n++
	}
	if n == 0 || c.odd {
		return line
	}
	// Each value aliases line: its offset is how much shorter its
	// capacity is.
	at := func(s span) int { return cap(line) - cap(s.val) }
	slices.SortFunc(spans[:n], func(a, b span) int { return at(a) - at(b) })
	out := make([]byte, 0, len(line)+64)
	prev := 0
	for _, s := range spans[:n] {
		i := at(s)
		if i < prev || i+len(s.val) > len(line) {
			continue
		}
		out = append(append(out, line[prev:i]...), s.with...)
		prev = i + len(s.val)
	}
	return append(out, line[prev:]...)
}

// observe reads the usage a chunk reports and times the chunks that carry
// output.
func (r *Reader) observe(c *chunk) {
	token := false
	switch r.opt.API {
	case Completions, Chat:
		if u := c.wire(); u != nil {
			w := *u
			if c.choices == 0 {
				w = r.counted(u) // as the edit gave it to the client
			}
			r.u.set(&w)
		}
		token = c.obj && !c.failed && c.choices > 0
	default:
		if c.hasUsage {
			r.counts.mergeEvent(&r.u, r.opt.API, c.data)
		}
		token = c.obj && c.delta(r.opt.API)
	}
	if !token {
		return
	}
	t := r.opt.Now()
	if r.u.FirstToken.IsZero() {
		r.u.FirstToken = t
	} else if r.opt.OnGap != nil {
		r.opt.OnGap(t.Sub(r.u.LastSeen))
	}
	r.u.LastSeen = t
	r.u.TokenEvents++
}

// keep reports whether a chunk goes to the client: all but the usage
// chunk llmlb asked for on the client's behalf.
func (r *Reader) keep(c *chunk) bool {
	return !(r.opt.Strip && (r.opt.API == Completions || r.opt.API == Chat) && c.obj && c.choices == 0 && c.usage != nil)
}

// counted is the usage u of a chunk as the client's stream counts it: a
// continuation's prompt holds the tokens delivered before it, which the
// client's usage counts once, as completion tokens.
func (r *Reader) counted(u *wireUsage) wireUsage {
	w := *u
	if !r.cont {
		return w
	}
	prompt := max(0, u.PromptTokens-r.contDelivered)
	w.PromptTokens, w.CompletionTokens = prompt, r.contDelivered+u.CompletionTokens
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		cached := min(*d.CachedTokens, prompt)
		w.PromptTokensDetails = &struct {
			CachedTokens *int `json:"cached_tokens"`
		}{&cached}
	}
	return w
}
