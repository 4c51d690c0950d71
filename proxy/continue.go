package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.opentelemetry.io/otel/attribute"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
)

// A stream whose server breaks it after its first byte is continued on
// another server: llmlb asks it for the rest of the answer and the
// client's stream carries on, as NVIDIA Dynamo's request migration does.
// The stream package finds the break and keeps the client's stream one
// stream; this file asks for the rest. A completion is asked again with
// the text delivered so far appended to its prompt; a chat with that text
// as a final assistant message, which vLLM and SGLang continue when told
// "continue_final_message": true and "add_generation_prompt": false
// (vLLM's ChatCompletionRequest,
// vllm/entrypoints/openai/chat_completion/protocol.py; SGLang's
// ChatCompletionRequest, python/sglang/srt/entrypoints/openai/protocol.py).
// max_tokens shrinks by the tokens delivered.

// resumer continues the stream of one exchange on the next candidate.
// It runs on the handler's goroutine, from the stream's Read.
type resumer struct {
	t   *retryTransport
	req *http.Request // the outgoing request, for the continuation's attempts
	ex  *exchange
	cur *attemptBody // the answering attempt's body
}

var _ stream.Resumer = (*resumer)(nil)

// gone reports whether nobody waits for the stream: the client left, or
// llmlb's request timeout ended it. An evicted stream's client still
// waits, for the error event that says so.
func (c *resumer) gone() bool {
	return c.req.Context().Err() != nil && !c.ex.evicted() || c.ex.client.Err() != nil
}

// broke records a break of the exchange's stream.
func (c *resumer) broke(reason, outcome string, cause error) {
	c.t.metrics.continuations.WithLabelValues(reason, outcome).Inc()
	switch outcome {
	case stream.OutcomeContinued:
		c.ex.streamErr = nil
		c.ex.continuations++
	case stream.OutcomeNotContinued, stream.OutcomeFailed:
		c.ex.streamErr = &streamBreak{backend: c.cur.be.ID, reason: reason, err: cause}
	}
	c.t.debug(c.req.Context(), "stream broke", c.cur.be, cause, "reason", reason, "outcome", outcome)
}

// streamBreak is why a client's stream ended failed: the backend that
// broke it, how, and the cause.
type streamBreak struct {
	backend, reason string
	err             error
}

func (e *streamBreak) Error() string {
	return fmt.Sprintf("backend %s: stream broke (%s): %v", e.backend, e.reason, e.err)
}

func (e *streamBreak) Unwrap() error { return e.err }

// Resume asks the remaining candidates in turn for the rest of the answer
// and returns the body of the first that starts a stream.
func (c *resumer) Resume(rest stream.Rest) (io.ReadCloser, error) {
	body, err := c.body(rest)
	if err != nil {
		return nil, err
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
	// The first token came: its deadline was met or missed, and the rest
	// is not refused for it.
	breq.TTFTDeadline = 0
	breq.PromptTokens += rest.Tokens
	breq.MaxTokens = max(0, breq.MaxTokens-rest.Tokens)
	breq.Avoid, breq.Guard = c.cur.be.ID, ex.guard
	// A pick whose candidates all failed unanswered (a server that died
	// since: passive health has ejected one that refused) is made again,
	// as RoundTrip's is, within max_attempts tries.
	for tried := 0; tried < t.maxAttempts; {
		dec, err := t.bal.PickWait(c.req.Context(), &breq, nil)
		if err != nil {
			return nil, err
		}
		ex.dec = dec
		answered := false
		for i, be := range dec.Candidates[:min(len(dec.Candidates), t.maxAttempts-tried)] {
			tried++
			a := try{ex: ex, be: be}
			a.ctx, a.cancel = context.WithCancelCause(c.req.Context())
			resp, err := t.attempt(c.req, &a, i, sendBody{head: body})
			if a.span != nil {
				a.span.SetAttributes(attribute.Bool("llmlb.continuation", true))
			}
			if err == nil && resp.StatusCode != http.StatusOK {
				answered = true
				if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
					t.bal.Failed(a.be, balancer.FailStatus)
				}
				resp.Body.Close()
				err = fmt.Errorf("%s answered status %d", be.ID, resp.StatusCode)
			}
			if err != nil {
				answered = answered || !t.unanswered(err)
				if c.req.Context().Err() == nil {
					t.bal.Failed(a.be, failKind(err))
				}
				endAttempt(a.span, 0, err)
				a.cancel(nil)
				if c.req.Context().Err() != nil {
					return nil, err
				}
				continue
			}
			ex.attempts++
			c.cur = t.attemptBody(a, resp, true)
			c.cur.byProtocol = true
			return c.cur, nil
		}
		if answered {
			break
		}
	}
	return nil, errors.New("no server could take the rest")
}

// body is the request for the rest of the answer: the client's request
// with the text delivered so far at the end of its prompt (a completion)
// or as a final assistant message to continue (a chat), max_tokens less
// the tokens delivered, and the usage chunk asked for when the client's
// stream has one, so that it can be counted over the whole answer.
func (c *resumer) body(rest stream.Rest) ([]byte, error) {
	req, body := c.ex.req, c.ex.req.Body
	var err error
	set := func(key string, val any) {
		if err != nil {
			return
		}
		v, _ := json.Marshal(val)
		body, _, err = setField(body, key, v)
	}
	switch {
	case rest.Text == "": // nothing delivered: the request as it was
	case req.Kind == KindCompletion:
		var prompt string
		if err = json.Unmarshal(req.Prompt, &prompt); err != nil {
			return nil, err
		}
		set("prompt", prompt+rest.Text)
	case req.Kind == KindChat:
		var msgs []json.RawMessage
		if err = json.Unmarshal(req.Messages, &msgs); err != nil {
			return nil, err
		}
		msgs = append(msgs, mustJSON(map[string]string{"role": "assistant", "content": rest.Text}))
		set("messages", msgs)
		set("continue_final_message", true)
		set("add_generation_prompt", false)
	default:
		return nil, errors.New("not a completion or a chat")
	}
	if req.MaxTokens > 0 {
		left := max(1, req.MaxTokens-rest.Tokens)
		for _, key := range req.maxKeys {
			set(key, left)
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
