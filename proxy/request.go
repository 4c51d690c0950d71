package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"unicode/utf8"
)

// Kind is the API a request was sent to.
type Kind int

const (
	// KindOther is any other POST /v1/* route, balanced by model and load.
	KindOther Kind = iota
	// KindCompletion is POST /v1/completions.
	KindCompletion
	// KindChat is POST /v1/chat/completions.
	KindChat
)

// Request is what llmlb reads from an OpenAI request body. Body holds the
// original bytes, forwarded unchanged.
type Request struct {
	Kind   Kind
	Model  string
	Stream bool
	// IncludeUsage reports whether the client asked for the final usage chunk
	// (stream_options.include_usage).
	IncludeUsage bool
	// Prompt is the raw "prompt" value (completions) and Messages the raw
	// "messages" value (chat); both alias Body.
	Prompt   json.RawMessage
	Messages json.RawMessage
	Body     []byte
}

// wireRequest lists the only fields decoded; the rest of the body is skipped.
type wireRequest struct {
	Model         json.RawMessage `json:"model"`
	Stream        json.RawMessage `json:"stream"`
	StreamOptions json.RawMessage `json:"stream_options"`
	Prompt        json.RawMessage `json:"prompt"`
	Messages      json.RawMessage `json:"messages"`
}

// checkContentType accepts a missing Content-Type and any JSON media type.
// Anything else is refused: the commonest case is curl -d, which sends
// application/x-www-form-urlencoded, so the message says how to fix it.
func checkContentType(h http.Header) *HTTPError {
	ct := h.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || (len(mt) > 5 && mt[len(mt)-5:] == "+json")) {
		return nil
	}
	return &HTTPError{Code: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
		Msg: "Content-Type must be application/json, got " + quote(ct) + " (with curl, add -H 'Content-Type: application/json')."}
}

// ParseRequest validates body as an OpenAI request of kind k and decodes the
// fields llmlb routes on. Every failure is an [*HTTPError] with status 400.
func ParseRequest(k Kind, body []byte) (*Request, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, badRequest("", "The request body is empty; expected a JSON object.")
	}
	if !utf8.Valid(body) {
		return nil, badRequest("", "The request body is not valid UTF-8.")
	}
	if trimmed[0] != '{' {
		return nil, badRequest("", "The request body must be a JSON object.")
	}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, badRequest("", "The request body is not valid JSON: %s at byte %d.", se.Error(), se.Offset)
		}
		return nil, badRequest("", "The request body is not valid JSON: %s.", err.Error())
	}
	r := &Request{Kind: k, Body: body, Prompt: w.Prompt, Messages: w.Messages}

	if isNull(w.Model) {
		return nil, badRequest("model", "You must provide a model parameter.")
	}
	if err := json.Unmarshal(w.Model, &r.Model); err != nil {
		return nil, badRequest("model", "model must be a string.")
	}
	if r.Model == "" {
		return nil, badRequest("model", "model must not be empty.")
	}
	if !isNull(w.Stream) {
		if err := json.Unmarshal(w.Stream, &r.Stream); err != nil {
			return nil, badRequest("stream", "stream must be a boolean.")
		}
	}
	if !isNull(w.StreamOptions) {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(w.StreamOptions, &so); err != nil {
			return nil, badRequest("stream_options", "stream_options must be an object with a boolean include_usage.")
		}
		r.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	switch k {
	case KindCompletion:
		if err := checkPrompt(w.Prompt); err != nil {
			return nil, err
		}
	case KindChat:
		if err := checkMessages(w.Messages); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// checkPrompt accepts what the completions API does: a string, a list of
// strings, a list of token ids or a list of lists of token ids, none empty.
func checkPrompt(raw json.RawMessage) *HTTPError {
	if isNull(raw) {
		return badRequest("prompt", "You must provide a prompt.")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return badRequest("prompt", "prompt must not be empty.")
		}
		return nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return badRequest("prompt", "prompt must be a string, a list of strings or a list of token ids.")
	}
	if len(list) == 0 {
		return badRequest("prompt", "prompt must not be empty.")
	}
	var strs []string
	var ids []int64
	var nested [][]int64
	switch {
	case json.Unmarshal(raw, &strs) == nil:
		for _, s := range strs {
			if s == "" {
				return badRequest("prompt", "prompt must not contain empty strings.")
			}
		}
	case json.Unmarshal(raw, &ids) == nil:
	case json.Unmarshal(raw, &nested) == nil:
		for _, n := range nested {
			if len(n) == 0 {
				return badRequest("prompt", "prompt must not contain empty token lists.")
			}
		}
	default:
		return badRequest("prompt", "prompt must be a string, a list of strings or a list of token ids.")
	}
	return nil
}

// checkMessages requires a non-empty list of objects, each with a role.
func checkMessages(raw json.RawMessage) *HTTPError {
	if isNull(raw) {
		return badRequest("messages", "You must provide messages.")
	}
	var msgs []struct {
		Role *string `json:"role"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return badRequest("messages", "messages must be a list of message objects.")
	}
	if len(msgs) == 0 {
		return badRequest("messages", "messages must not be empty.")
	}
	for _, m := range msgs {
		if m.Role == nil || *m.Role == "" {
			return badRequest("messages", "every message needs a role.")
		}
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
