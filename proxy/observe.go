package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"time"

	"github.com/llmlb/llmlb/jsonscan"
)

// Usage is the token counts a backend reported for one request, from the
// "usage" object of its response or of its stream's final usage chunk.
type Usage struct {
	Known                bool // the backend reported usage
	Prompt, Completion   int
	CachedKnown          bool // it reported prompt_tokens_details.cached_tokens
	Cached               int
	TokenEvents          int // stream events that carried output
	FirstToken, LastSeen time.Time
}

// wireUsage is OpenAI's usage object as vLLM, SGLang and trtllm-serve send
// it; prompt_tokens_details is null unless the server is asked to report
// it (vLLM: --enable-prompt-tokens-details).
type wireUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *Usage) set(w *wireUsage) {
	u.Known, u.Prompt, u.Completion = true, w.PromptTokens, w.CompletionTokens
	if d := w.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		u.CachedKnown, u.Cached = true, *d.CachedTokens
	}
}

// Bounds on what the observer holds: an SSE event longer than maxEvent
// passes through unread; a JSON body longer than maxJSONBody is passed on
// without its usage being read.
const (
	maxEvent    = 1 << 20
	maxJSONBody = 8 << 20
)

// observer sits between a backend's response body and the client. It times
// the stream's token events (the first, and the gaps between them, as they
// reach the proxy), reads the usage the backend reports, and, when llmlb
// asked for the final usage chunk on the client's behalf, drops that chunk
// so the client sees the stream it asked for. A JSON body passes through
// as it is read and its usage is read at the end.
type observer struct {
	src   io.ReadCloser
	kind  Kind // the API, whose events and usage it reads
	sse   bool
	strip bool
	now   func() time.Time
	onGap func(time.Duration) // between token events; may be nil

	u Usage
	// Responses and Messages: the counts their usage gives apart, which
	// later events may update one by one.
	in, cacheRead, cacheWrite int
	pending                   []byte // SSE: bytes of an event not yet complete; JSON: the body so far
	out                       []byte // SSE: complete events to hand to the client
	over                      bool   // JSON: the body outgrew maxJSONBody
	eof                       bool
	err                       error // from src, after EOF-less end
}

func newObserver(src io.ReadCloser, kind Kind, sse, strip bool, now func() time.Time, onGap func(time.Duration)) *observer {
	return &observer{src: src, kind: kind, sse: sse, strip: strip, now: now, onGap: onGap}
}

// Usage returns what was observed so far; complete once the body is read.
func (o *observer) Usage() Usage { return o.u }

func (o *observer) Read(p []byte) (int, error) {
	if !o.sse {
		n, err := o.src.Read(p)
		if !o.over {
			if len(o.pending)+n > maxJSONBody {
				o.over, o.pending = true, nil
			} else {
				o.pending = append(o.pending, p[:n]...)
			}
		}
		if err == io.EOF && !o.over {
			if o.kind == KindResponses || o.kind == KindMessages {
				o.apiBody(o.pending)
			} else if u := bodyUsage(o.pending); u != nil {
				o.u.set(u)
			}
			o.pending = nil
		}
		return n, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	for len(o.out) == 0 {
		if o.err != nil {
			return 0, o.err
		}
		if o.eof {
			if len(o.pending) == 0 {
				return 0, io.EOF
			}
			o.event(o.pending) // an event the backend did not terminate
			o.pending = o.pending[:0]
			continue
		}
		// The caller's buffer is the read buffer: what is read goes to
		// pending at once, and p is refilled from out below, so a stream
		// holds no buffer of its own while it waits for its next token.
		n, err := o.src.Read(p)
		o.pending = append(o.pending, p[:n]...)
		if err == io.EOF {
			o.eof = true
		} else if err != nil {
			o.err = err // returned once the whole events before it are handed over
		}
		o.split()
	}
	n := copy(p, o.out)
	if n == len(o.out) {
		o.out = o.out[:0] // all handed over: the buffer is reused from its start
	} else {
		o.out = o.out[n:]
	}
	return n, nil
}

// split moves every complete event of pending to out.
func (o *observer) split() {
	rest := o.pending
	for {
		end := eventEnd(rest)
		if end < 0 {
			break
		}
		o.event(rest[:end])
		rest = rest[end:]
	}
	if len(rest) > maxEvent { // not SSE as we know it: pass it on
		o.out = append(o.out, rest...)
		rest = nil
	}
	// What is left of an event moves to the buffer's start (it is short),
	// so that the next read appends to the same buffer.
	o.pending = append(o.pending[:0], rest...)
}

// eventEnd returns the length of the first complete event of b, blank line
// included, or -1.
func eventEnd(b []byte) int {
	i := bytes.Index(b, []byte("\n\n"))
	j := bytes.Index(b, []byte("\r\n\r\n"))
	switch {
	case i < 0 && j < 0:
		return -1
	case j < 0 || (i >= 0 && i < j):
		return i + 2
	default:
		return j + 4
	}
}

// bodyUsage reads the "usage" object of a JSON response body; nil when
// it has none. jsonscan finds the member without decoding the rest (a
// completion's text); a body it is unsure of goes to encoding/json.
func bodyUsage(body []byte) *wireUsage {
	var raw []byte
	if !jsonscan.Object(body, func(key, val []byte) bool {
		if string(key) == "usage" {
			raw = val
		}
		return true
	}) {
		var b struct {
			Usage *wireUsage `json:"usage"`
		}
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		return b.Usage
	}
	var u *wireUsage
	if raw == nil {
		return nil
	}
	if !scanUsage(raw, &u) {
		u = nil
		if json.Unmarshal(raw, &u) != nil {
			return nil
		}
	}
	return u
}

// event reads one SSE event and appends it to out, less the usage chunk
// llmlb asked for on the client's behalf. Each data line is read as a
// chunk of its own, as OpenAI clients read them: a server may send the
// usage chunk and `data: [DONE]` in one event, one data line after the
// other, and stripping the usage chunk must leave the [DONE] (issue 18).
// An event left with no data line is dropped whole.
func (o *observer) event(ev []byte) {
	mark := len(o.out)
	dropped, keptData := false, false
	for rest := ev; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if !o.dataLine(bytes.TrimSpace(d)) {
				dropped = true
				continue
			}
			keptData = true
		}
		o.out = append(o.out, line...)
	}
	if dropped && !keptData {
		o.out = o.out[:mark]
	}
}

// dataLine reads one data line's payload: it times token chunks and records
// usage. It reports whether the line goes to the client.
func (o *observer) dataLine(data []byte) bool {
	if o.kind == KindResponses || o.kind == KindMessages {
		if o.apiEvent(data) {
			o.token()
		}
		return true
	}
	keep, token := true, false
	switch {
	case len(data) == 0, bytes.Equal(data, []byte("[DONE]")):
	case bytes.Contains(data, []byte(`"usage"`)):
		choices, usage, ok := scanChunk(data)
		if !ok {
			var c struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *wireUsage        `json:"usage"`
			}
			if json.Unmarshal(data, &c) != nil {
				break
			}
			choices, usage = len(c.Choices), c.Usage
		}
		if usage != nil {
			o.u.set(usage)
		}
		token = choices > 0
		keep = !(o.strip && choices == 0 && usage != nil)
	case bytes.HasPrefix(data, []byte("{")) && !bytes.HasPrefix(data, []byte(`{"error"`)):
		token = true
	}
	if token {
		o.token()
	}
	return keep
}

// token times a stream event that carried output.
func (o *observer) token() {
	t := o.now()
	if o.u.FirstToken.IsZero() {
		o.u.FirstToken = t
	} else if o.onGap != nil {
		o.onGap(t.Sub(o.u.LastSeen))
	}
	o.u.LastSeen = t
	o.u.TokenEvents++
}

func (o *observer) Close() error {
	return o.src.Close()
}
