package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.opentelemetry.io/otel/attribute"

	"github.com/llmlb/llmlb/balancer"
)

// A stream whose server dies after its first byte is continued on another
// server: llmlb asks it for the rest of the answer and the client's stream
// carries on, as NVIDIA Dynamo's request migration does. A completion is
// asked again with the text delivered so far appended to its prompt; a
// chat with that text as a final assistant message, which vLLM and SGLang
// continue when told "continue_final_message": true and
// "add_generation_prompt": false (vLLM's ChatCompletionRequest,
// vllm/entrypoints/openai/chat_completion/protocol.py; SGLang's
// ChatCompletionRequest, python/sglang/srt/entrypoints/openai/protocol.py).
// max_tokens shrinks by the tokens delivered. The client sees one stream:
// the first stream's id and created throughout, the continuation's role
// preamble dropped, usage counting the prompt once and every token.
//
// Tokens delivered are counted from the events: the completion_tokens of
// the latest usage the server sent with a chunk (continuous usage), else
// one per event carrying text. vLLM sends one token an event unless
// --stream-interval or speculative decoding groups several, so without
// continuous usage the count, and the continuation's max_tokens, can fall
// short of the truth by the tokens grouped.

// Why a stream broke, the reason label of llmlb_stream_continuations_total.
const (
	breakCut   = "cut"   // the connection or the stream ended early
	breakStall = "stall" // silent past stream_idle_timeout
	breakError = "error" // an error event mid-stream
)

// errStreamError is an error event a server sent mid-stream.
var errStreamError = errors.New("error event mid-stream")

// continuer is the body of a stream that can be continued: it hands the
// client whole events only (a break leaves no half event behind), learns
// what the client received, and on a break asks the next candidate for
// the rest. Read and Close run on the handler's goroutine.
type continuer struct {
	t   *retryTransport
	req *http.Request // the outgoing request, for the continuation's attempts
	ex  *exchange
	src *attemptBody // the answering attempt's body

	pending []byte // read, not yet a whole event
	out     []byte // whole events for the client
	eof     bool
	err     error // returned once out is drained
	brk     error // an error event broke the stream; set by event

	left int // continuations left

	// What the client received.
	id, created []byte       // the first chunk's raw values
	text        bytes.Buffer // delivered content
	events      int          // events that carried text
	usageTokens int          // completion_tokens of the latest continuous usage; -1 if none
	finished    bool         // a finish_reason reached the client
	done        bool         // so did [DONE]
	why         string       // why it can no longer be continued, "" if it can

	// The continuation under way, if any.
	cont          bool
	contID        []byte // its first chunk's id and created, replaced by the first stream's
	contCreated   []byte
	contDelivered int // tokens delivered before it, which its prompt holds
	contEvents    int // events and continuous usage before it
}

func newContinuer(t *retryTransport, req *http.Request, ex *exchange, src *attemptBody, left int) *continuer {
	return &continuer{t: t, req: req, ex: ex, src: src, left: left, usageTokens: -1}
}

// delivered is the tokens the client received.
func (c *continuer) delivered() int {
	if c.usageTokens >= 0 {
		return c.usageTokens
	}
	return c.events
}

func (c *continuer) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if c.eof {
			if len(c.pending) == 0 {
				return 0, io.EOF
			}
			c.out = append(c.out, c.pending...) // an event the server did not terminate
			c.pending = c.pending[:0]
			break
		}
		// The caller's buffer is the read buffer, as the observer's is:
		// a stream holds no buffer of its own while it waits.
		n, err := c.src.Read(p)
		c.pending = append(c.pending, p[:n]...)
		c.split()
		switch {
		case c.brk != nil:
			c.broke(c.brk, breakError)
		case err == io.EOF:
			c.eof = true
		case err != nil:
			reason := breakCut
			if errors.Is(err, errStreamStalled) {
				reason = breakStall
			}
			c.broke(err, reason)
		}
	}
	n := copy(p, c.out)
	if n == len(c.out) {
		c.out = c.out[:0]
	} else {
		c.out = c.out[n:]
	}
	return n, nil
}

// split hands every whole event of pending to event, until an error event
// breaks the stream.
func (c *continuer) split() {
	rest := c.pending
	for c.brk == nil {
		end := eventEnd(rest)
		if end < 0 {
			break
		}
		c.event(rest[:end])
		rest = rest[end:]
	}
	if c.brk != nil {
		rest = nil // what follows an error event is not the answer
	}
	c.pending = append(c.pending[:0], rest...)
}

// chunk is what the continuer reads of a chat or completion stream chunk.
type chunk struct {
	ID      json.RawMessage `json:"id"`
	Created json.RawMessage `json:"created"`
	Choices []struct {
		Text  *string `json:"text"`
		Delta struct {
			Role             *string         `json:"role"`
			Content          *string         `json:"content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *wireUsage `json:"usage"`
	// An error event: vLLM's {"error": {...}}, or the older
	// {"object": "error", ...}.
	Error  json.RawMessage `json:"error"`
	Object string          `json:"object"`
}

// event reads one whole event and appends it to out, edited when it comes
// from a continuation; an error event sets brk instead while the stream
// can still be continued.
func (c *continuer) event(ev []byte) {
	var data []byte
	for rest := ev; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimSpace(d)
			break
		}
	}
	if len(data) == 0 || data[0] != '{' {
		c.done = c.done || string(data) == "[DONE]"
		c.out = append(c.out, ev...) // [DONE], comments
		return
	}
	var ch chunk
	if json.Unmarshal(data, &ch) != nil {
		c.out = append(c.out, ev...)
		return
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" || ch.Object == "error" {
		if c.finished || c.continuable() != "" {
			c.out = append(c.out, ev...)
			return
		}
		c.brk = errStreamError
		return
	}
	if c.cont {
		var keep bool
		if ev, keep = c.edit(ev, &ch); !keep {
			return
		}
	} else if c.id == nil {
		c.id, c.created = bytes.Clone(ch.ID), bytes.Clone(ch.Created)
	}
	if ch.Usage != nil && len(ch.Choices) > 0 {
		c.usageTokens = c.contEvents + ch.Usage.CompletionTokens // continuous usage
	}
	for _, choice := range ch.Choices {
		d := choice.Delta
		text := choice.Text
		if d.Content != nil {
			text = d.Content
		}
		if text != nil && *text != "" {
			c.text.WriteString(*text)
			c.events++
		}
		if len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" {
			c.why = "tool_call"
		}
		if d.ReasoningContent != nil && *d.ReasoningContent != "" || d.Reasoning != nil && *d.Reasoning != "" {
			c.why = "reasoning"
		}
		if choice.FinishReason != nil {
			c.finished = true
		}
	}
	c.out = append(c.out, ev...)
}

// edit makes an event of a continuation one of the client's stream: the
// first stream's id and created, the usage counted over the whole answer;
// keep is false for the continuation's role preamble, which the client had.
func (c *continuer) edit(ev []byte, ch *chunk) (out []byte, keep bool) {
	if c.contID == nil {
		c.contID, c.contCreated = bytes.Clone(ch.ID), bytes.Clone(ch.Created)
	}
	if len(ch.Choices) == 1 && ch.Usage == nil {
		d := ch.Choices[0].Delta
		if d.Role != nil && (d.Content == nil || *d.Content == "") && ch.Choices[0].FinishReason == nil && len(d.ToolCalls) == 0 {
			return nil, false
		}
	}
	for _, kv := range [][2][]byte{{c.contID, c.id}, {c.contCreated, c.created}} {
		if len(kv[0]) == 0 || len(kv[1]) == 0 || bytes.Equal(kv[0], kv[1]) {
			continue
		}
		for _, key := range []string{`"id":`, `"id": `, `"created":`, `"created": `} {
			from := append([]byte(key), kv[0]...)
			if bytes.Contains(ev, from) {
				ev = bytes.ReplaceAll(ev, from, append([]byte(key), kv[1]...))
			}
		}
	}
	if u := ch.Usage; u != nil && len(ch.Choices) == 0 {
		// The continuation's prompt holds the tokens delivered before it;
		// the client's usage counts them once, as completion tokens.
		prompt := max(0, u.PromptTokens-c.contDelivered)
		completion := c.contDelivered + u.CompletionTokens
		fixed := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
		if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
			fixed["prompt_tokens_details"] = map[string]int{"cached_tokens": min(*d.CachedTokens, prompt)}
		}
		val, _ := json.Marshal(fixed)
		start := bytes.Index(ev, []byte("data:"))
		data := bytes.TrimSpace(ev[start+len("data:"):])
		if edited, _, err := setField(data, "usage", val); err == nil {
			ev = append(append(append([]byte(nil), ev[:start]...), "data: "...), edited...)
			ev = append(ev, "\n\n"...)
		}
	}
	return ev, true
}

// continuable says why the stream cannot be continued now, "" if it can.
func (c *continuer) continuable() string {
	switch {
	case c.ex.req.Uncontinuable != "":
		return c.ex.req.Uncontinuable
	case c.why != "":
		return c.why
	case c.left <= 0:
		return "limit"
	}
	return ""
}

// broke handles a break: it continues the stream on the next candidate
// when it can, and otherwise ends it as a stream that broke, with an error
// event for the client and cause for ReverseProxy, which cuts the
// connection. A stream whose finish_reason reached the client lost
// nothing and ends cleanly, with the [DONE] it was owed.
func (c *continuer) broke(cause error, reason string) {
	c.pending, c.brk = c.pending[:0], nil
	if reason == breakError && c.src.judge { // an answer that failed
		c.src.judge = false
		c.t.bal.Failed(c.src.be, balancer.FailStatus)
	}
	c.src.Close()
	if c.req.Context().Err() != nil || c.ex.client.Err() != nil {
		c.err = cause // the client left, or llmlb's request timeout
		return
	}
	if c.finished {
		// Every token reached the client; the end of the stream did not.
		if !c.done {
			c.out = append(c.out, "data: [DONE]\n\n"...)
		}
		c.eof = true
		return
	}
	m := c.t.metrics.continuations
	if why := c.continuable(); why != "" {
		m.WithLabelValues(reason, "not_continued").Inc()
		c.t.debug(c.req.Context(), "stream broke, not continued", c.src.be, cause, "why", why)
		c.fail(cause, "it cannot be continued ("+why+")")
		return
	}
	c.left--
	if err := c.resume(); err != nil {
		m.WithLabelValues(reason, "failed").Inc()
		c.t.debug(c.req.Context(), "stream broke, continuation failed", c.src.be, err)
		c.fail(cause, "no other server could continue it")
		return
	}
	m.WithLabelValues(reason, "continued").Inc()
	c.ex.streamErr = nil
	c.ex.continuations++
}

// fail ends the client's stream with an error event and cause.
func (c *continuer) fail(cause error, why string) {
	msg, _ := json.Marshal("The model server's stream broke and " + why + ".")
	c.out = append(c.out, `data: {"error":{"message":`...)
	c.out = append(c.out, msg...)
	c.out = append(c.out, `,"type":"server_error","param":null,"code":"stream_broken"}}`+"\n\n"...)
	c.err = cause
}

// resume asks the remaining candidates in turn for the rest of the answer
// and reads on from the first that starts a stream.
func (c *continuer) resume() error {
	body, err := c.body()
	if err != nil {
		return err
	}
	ex, t := c.ex, c.t
	sentAt := ex.sentAt // the stream's time to first token stays the first attempt's
	defer func() { ex.sentAt = sentAt }()
	// A fresh pick, by model and load, away from the server that broke
	// the stream: the first pick's candidates may be minutes old, and
	// under load it kept only those not saturated.
	breq := *ex.breq
	breq.Prompt, breq.Parts, breq.UserText, breq.TokenBlocks = nil, nil, nil, nil
	breq.FirstUser, breq.FirstTurn, breq.Session = 0, 0, ""
	breq.PromptTokens += c.delivered()
	breq.MaxTokens = max(0, breq.MaxTokens-c.delivered())
	breq.Avoid, breq.Guard = c.src.be.ID, ex.guard
	dec, err := t.bal.PickWait(c.req.Context(), &breq, nil)
	if err != nil {
		return err
	}
	ex.dec = dec
	for i, be := range dec.Candidates {
		a := try{ex: ex, be: be}
		a.ctx, a.cancel = context.WithCancelCause(c.req.Context())
		resp, err := t.attempt(c.req, &a, i, sendBody{head: body})
		if a.span != nil {
			a.span.SetAttributes(attribute.Bool("llmlb.continuation", true))
		}
		if err == nil && resp.StatusCode != http.StatusOK {
			if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
				t.bal.Failed(a.be, balancer.FailStatus)
			}
			resp.Body.Close()
			err = fmt.Errorf("%s answered status %d", be.ID, resp.StatusCode)
		}
		if err != nil {
			if c.req.Context().Err() == nil {
				t.bal.Failed(a.be, balancer.FailConnect)
			}
			endAttempt(a.span, 0, err)
			a.cancel(nil)
			if c.req.Context().Err() != nil {
				return err
			}
			continue
		}
		ex.attempts++
		c.src = t.attemptBody(a, resp, true)
		c.cont, c.contID, c.contCreated = true, nil, nil
		c.contDelivered = c.delivered()
		c.contEvents = c.contDelivered
		return nil
	}
	return errors.New("no server could take the rest")
}

// body is the request for the rest of the answer: the client's request
// with the text delivered so far at the end of its prompt (a completion)
// or as a final assistant message to continue (a chat), max_tokens less
// the tokens delivered, and the usage chunk asked for when the client's
// stream has one, so that it can be counted over the whole answer.
func (c *continuer) body() ([]byte, error) {
	req, body := c.ex.req, c.ex.req.Body
	delivered := c.delivered()
	var err error
	set := func(key string, val any) {
		if err != nil {
			return
		}
		v, _ := json.Marshal(val)
		body, _, err = setField(body, key, v)
	}
	switch {
	case c.text.Len() == 0: // nothing delivered: the request as it was
	case req.Kind == KindCompletion:
		var prompt string
		if err = json.Unmarshal(req.Prompt, &prompt); err != nil {
			return nil, err
		}
		set("prompt", prompt+c.text.String())
	case req.Kind == KindChat:
		var msgs []json.RawMessage
		if err = json.Unmarshal(req.Messages, &msgs); err != nil {
			return nil, err
		}
		msgs = append(msgs, mustJSON(map[string]string{"role": "assistant", "content": c.text.String()}))
		set("messages", msgs)
		set("continue_final_message", true)
		set("add_generation_prompt", false)
	default:
		return nil, errors.New("not a completion or a chat")
	}
	if req.MaxTokens > 0 {
		rest := max(1, req.MaxTokens-delivered)
		for _, key := range req.maxKeys {
			set(key, rest)
		}
	}
	if req.IncludeUsage || c.ex.stripUsage {
		set("stream_options", map[string]bool{"include_usage": true})
	}
	return body, err
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func (c *continuer) Close() error { return c.src.Close() }
