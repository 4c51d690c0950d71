package stream

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"time"
)

// API is the inference API a stream speaks: how its events read and when
// it is whole.
type API int

// The APIs whose answers stream.
const (
	Completions API = iota // OpenAI's /v1/completions
	Chat                   // OpenAI's /v1/chat/completions
	Responses              // OpenAI's /v1/responses
	Messages               // Anthropic's /v1/messages
)

// Why a stream broke: the reason label of llmlb_stream_continuations_total.
const (
	BreakCut       = "cut"       // the connection broke mid-body
	BreakStall     = "stall"     // silent past the idle limit
	BreakError     = "error"     // the server sent an error event
	BreakTruncated = "truncated" // the body ended cleanly before the API's terminator
	// BreakEvicted is what a source is told ([Judged]) of a stream llmlb
	// ended itself ([Options.Evicted]); it is no break of the server's,
	// and not counted as one.
	BreakEvicted = "evicted"
)

// What became of a break: the outcome label of
// llmlb_stream_continuations_total.
const (
	OutcomeContinued    = "continued"     // another server sent the rest
	OutcomeCompleted    = "completed"     // every token had reached the client; llmlb ended the stream for it
	OutcomeNotContinued = "not_continued" // the request or API cannot be continued; the client got an error event
	OutcomeFailed       = "failed"        // no other server could continue it; the client got an error event
)

var (
	// ErrStalled is the cause a source's read returns when the server sent
	// nothing for longer than the stream's idle limit.
	ErrStalled = errors.New("stream stalled")
	// ErrTruncated is the cause of a stream whose body ended before its
	// API's terminator.
	ErrTruncated = errors.New("stream ended before its terminator")
	// errServerError is the cause of a stream broken by the server's
	// error event.
	errServerError = errors.New("error event mid-stream")
)

// maxEvent bounds what the reader holds of one event: a longer event
// passes through unparsed. A Responses stream's response.completed holds
// the whole answer; 16 MiB is some four million tokens of text.
const maxEvent = 16 << 20

// Rest is what a client received of a broken stream: what another server
// is asked to continue from.
type Rest struct {
	Text   string // the text delivered
	Tokens int    // the tokens delivered (see [Reader.delivered])
}

// Resumer asks another server for the rest of a broken answer.
type Resumer interface {
	// Resume returns the body of another server's stream that continues
	// the answer from rest, or an error when none could.
	Resume(rest Rest) (io.ReadCloser, error)
}

// Judged is a source told how its stream ended by its API's protocol:
// reason "" when whole, else one of the Break reasons. The reader calls
// Ended once per source, before it closes it.
type Judged interface {
	Ended(reason string)
}

// Options say what a [Reader] does with a stream.
type Options struct {
	API API
	// Strip drops the usage chunk of a completions or chat stream: llmlb
	// asked for it on the client's behalf.
	Strip bool
	// Edit appends an event, edited, to dst: the model name and response
	// ids as the client knows them. Nil edits nothing.
	Edit func(dst, event []byte) []byte
	// Now times token events (default time.Now); OnGap, if not nil, is
	// called with the time between two.
	Now   func() time.Time
	OnGap func(time.Duration)

	// Resume continues a broken stream; nil continues none.
	Resume Resumer
	// Continuations is how many times the stream may be continued.
	Continuations int
	// Uncontinuable says why the request cannot be continued faithfully
	// ("n>1", "logprobs"), "" if it can.
	Uncontinuable string
	// Gone reports whether nobody waits for the stream any more (the
	// client left, or llmlb's request timeout): a break then ends it
	// with its cause and nothing else. Nil means someone always waits.
	Gone func() bool
	// Evicted, if not nil, reports whether llmlb itself ended the stream
	// to make room for a request of higher priority (its source's read
	// then fails, cancelled): the client's stream ends with an error
	// event that says so, never continued, and OnBreak is not told, since
	// no server broke it.
	Evicted func() bool
	// OnBreak, if not nil, is told of every break: its reason, what
	// became of it, and its cause.
	OnBreak func(reason, outcome string, cause error)
}

// Reader is a streamed answer on its way to the client. It hands the
// client whole events only, so a break leaves no half event behind. Read
// and Close run on one goroutine.
type Reader struct {
	opt Options
	src io.ReadCloser

	pending []byte // read, not yet a whole event
	out     []byte // edited events for the client
	eof     bool
	err     error // returned once out is drained
	brk     error // a server's error event broke the stream
	skip    bool  // the end of an event too long to read passes through

	chunks  []chunk // the current event's data lines
	scratch []byte  // decoded text of the current event
	edited  []byte  // the current event as edited

	// What the client received.
	whole       bool         // the API's terminator
	failed      bool         // an error event
	id, created []byte       // completions and chat: the first chunk's raw values
	text        bytes.Buffer // text delivered
	events      int          // events that carried text
	usageTokens int          // completion_tokens of the latest continuous usage; -1 if none
	finished    bool         // every token: a finish_reason (completions, chat), a stop_reason (Messages)
	why         string       // why it can no longer be continued, "" if it can
	seq         int          // Responses: the latest sequence_number

	// The continuation under way, if any.
	left          int
	cont          bool
	contID        []byte // its first chunk's id and created, replaced by the first stream's
	contCreated   []byte
	contDelivered int // tokens delivered before it, which its prompt holds

	u      Usage
	counts apiCounts
}

// NewReader returns the reader of src, a stream of api's events.
func NewReader(src io.ReadCloser, opt Options) *Reader {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Reader{opt: opt, src: src, left: opt.Continuations, usageTokens: -1, seq: -1}
}

// Usage returns what the server reported and the timing of the token
// events so far; complete once the stream ended.
func (r *Reader) Usage() Usage { return r.u }

// Whole reports whether the client's stream ended with its API's
// terminator.
func (r *Reader) Whole() bool { return r.whole && r.eof }

// Delivered reports whether the API's terminator, and every event before
// it, has been handed to the client: the answer is whole even if the
// client leaves before the server's body ends, as clients that stop
// reading at the terminator do.
func (r *Reader) Delivered() bool { return r.whole && len(r.out) == 0 }

// Read hands the client the stream's next whole events.
func (r *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for len(r.out) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.eof {
			return 0, io.EOF
		}
		// The caller's buffer is the read buffer: what is read goes to
		// pending at once, and p is refilled from out below, so a stream
		// holds no buffer of its own while it waits for its next token.
		n, err := r.src.Read(p)
		r.pending = append(r.pending, p[:n]...)
		r.split()
		switch {
		case r.brk != nil:
			r.broke(r.brk, BreakError)
		case err == io.EOF:
			if len(r.pending) > 0 { // an event the server did not terminate
				r.event(r.pending)
				r.pending = r.pending[:0]
			}
			r.ended()
		case err != nil:
			reason := BreakCut
			if errors.Is(err, ErrStalled) {
				reason = BreakStall
			}
			r.broke(err, reason)
		}
	}
	n := copy(p, r.out)
	if n == len(r.out) {
		r.out = r.out[:0] // all handed over: the buffer is reused from its start
	} else {
		r.out = r.out[n:]
	}
	return n, nil
}

// Close closes the source.
func (r *Reader) Close() error { return r.src.Close() }

// split runs every whole event of pending through the stages, until an
// error event breaks the stream.
func (r *Reader) split() {
	rest := r.pending
	for r.brk == nil {
		end := eventEnd(rest)
		if end < 0 {
			break
		}
		if r.skip { // the end of an event too long to read
			r.out, r.skip = append(r.out, rest[:end]...), false
		} else {
			r.event(rest[:end])
		}
		rest = rest[end:]
	}
	switch {
	case r.brk != nil:
		rest = nil // what follows an error event is not the answer
	case len(rest) > maxEvent: // not an event we can hold: pass it on
		r.out, rest, r.skip = append(r.out, rest...), nil, true
	}
	// What is left of an event moves to the buffer's start (it is short),
	// so that the next read appends to the same buffer.
	r.pending = append(r.pending[:0], rest...)
}

// ended handles the end of the source's body: whole if the terminator
// came, else a break.
func (r *Reader) ended() {
	if !r.whole {
		r.broke(ErrTruncated, BreakTruncated)
		return
	}
	r.judge("")
	r.eof = true
}

// judge tells the source how its stream ended and closes it.
func (r *Reader) judge(reason string) {
	if j, ok := r.src.(Judged); ok {
		j.Ended(reason)
	}
	r.src.Close()
}

// broke handles a break: it continues the stream on another server when
// it can, and otherwise ends it with an error event and cause, which
// makes the proxy end the client's connection as failed. A stream that
// delivered every token lost nothing and ends whole, with the terminator
// it was owed.
func (r *Reader) broke(cause error, reason string) {
	r.pending, r.brk, r.skip = r.pending[:0], nil, false
	if r.evicted() {
		r.judge(BreakEvicted)
		r.err = cause
		if !r.failed { // a server's error event reached the client first: it stands
			r.fail(cause, "")
		}
		return
	}
	r.judge(reason)
	if r.opt.Gone != nil && r.opt.Gone() {
		r.err = cause
		return
	}
	if r.failed { // the server's error event reached the client
		r.report(reason, OutcomeNotContinued, cause)
		r.err = cause
		return
	}
	if r.finished && r.complete() {
		r.report(reason, OutcomeCompleted, cause)
		return
	}
	if why := r.continuable(); why != "" {
		r.report(reason, OutcomeNotContinued, cause)
		r.fail(cause, "it cannot be continued ("+why+")")
		return
	}
	r.left--
	src, err := r.opt.Resume.Resume(Rest{Text: r.text.String(), Tokens: r.delivered()})
	if err != nil {
		if !r.evicted() { // evicted while it waited for another server: no failure of theirs
			r.report(reason, OutcomeFailed, cause)
		}
		r.fail(cause, "no other server could continue it")
		return
	}
	r.report(reason, OutcomeContinued, cause)
	r.src, r.cont, r.contID, r.contCreated = src, true, nil, nil
	r.contDelivered = r.delivered()
}

func (r *Reader) report(reason, outcome string, cause error) {
	if r.opt.OnBreak != nil {
		r.opt.OnBreak(reason, outcome, cause)
	}
}

// complete ends a stream whose every token reached the client with the
// terminator the server did not send, and reports whether the API has one
// llmlb can send: a Responses stream ends in an event that carries the
// whole response, which llmlb does not have.
func (r *Reader) complete() bool {
	switch r.opt.API {
	case Completions, Chat:
		r.out = append(r.out, "data: [DONE]\n\n"...)
	case Messages:
		r.out = append(r.out, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	default:
		return false
	}
	r.whole, r.eof = true, true
	return true
}

// continuable says why the stream cannot be continued now, "" if it can.
// Only completions and chat are: neither vLLM's nor SGLang's Messages
// endpoint continues a final assistant turn (see docs/design/streams.md).
func (r *Reader) continuable() string {
	switch {
	case r.opt.Resume == nil || r.opt.API != Completions && r.opt.API != Chat:
		return "api"
	case r.opt.Uncontinuable != "":
		return r.opt.Uncontinuable
	case r.why != "":
		return r.why
	case r.left <= 0:
		return "limit"
	}
	return ""
}

// delivered is the tokens the client received: the completion_tokens of
// the latest usage the server sent with a chunk (continuous usage), else
// one per event carrying text. vLLM sends one token an event unless
// --stream-interval or speculative decoding groups several, so without
// continuous usage the count can fall short by the tokens grouped.
func (r *Reader) delivered() int {
	if r.usageTokens >= 0 {
		return r.usageTokens
	}
	return r.events
}

// EvictedMessage is what the client of a request llmlb ended for one of
// higher priority is told ([Options.Evicted]), in an error event or, when
// nothing was sent yet, a 429.
const EvictedMessage = "This request's priority is sheddable and it was ended to make room for a request of higher priority; retry later."

// evicted reports whether llmlb ended the stream for a request of higher
// priority ([Options.Evicted]).
func (r *Reader) evicted() bool { return r.opt.Evicted != nil && r.opt.Evicted() }

// fail ends the client's stream with an error event in its API's shape
// and cause: the server's stream broke and why, or, for an evicted
// stream, that it was ended for a request of higher priority, as a rate
// limit the client may retry after (the 429 it gets when nothing was
// sent yet).
func (r *Reader) fail(cause error, why string) {
	msg := "The model server's stream broke and " + why + "."
	code, openAIType, anthropicType := "stream_broken", "server_error", "api_error"
	if r.evicted() {
		msg = EvictedMessage
		code, openAIType, anthropicType = "evicted", "rate_limit_error", "rate_limit_error"
	}
	m, _ := json.Marshal(msg)
	switch r.opt.API {
	case Messages:
		// Anthropic's error event (docs.anthropic.com, "Error events";
		// anthropic-sdk-python raises on it).
		r.out = append(r.out, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\""+anthropicType+"\",\"message\":"...)
		r.out = append(r.out, m...)
		r.out = append(r.out, "}}\n\n"...)
	case Responses:
		// OpenAI's ResponseErrorEvent (openai-python,
		// src/openai/types/responses/response_error_event.py): every
		// field is required, sequence_number one past the last event's.
		r.out = append(r.out, "event: error\ndata: {\"type\":\"error\",\"code\":\""+code+"\",\"message\":"...)
		r.out = append(r.out, m...)
		r.out = append(r.out, ",\"param\":null,\"sequence_number\":"...)
		r.out = strconv.AppendInt(r.out, int64(r.seq+1), 10)
		r.out = append(r.out, "}\n\n"...)
	default:
		r.out = append(r.out, `data: {"error":{"message":`...)
		r.out = append(r.out, m...)
		r.out = append(r.out, `,"type":"`+openAIType+`","param":null,"code":"`+code+`"}}`+"\n\n"...)
	}
	r.err = cause
}
