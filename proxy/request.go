package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"slices"
	"unicode/utf8"

	"github.com/llmlb/llmlb/jsonscan"
	"github.com/llmlb/llmlb/prefix"
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
	// KindResponses is POST /v1/responses, OpenAI's Responses API.
	KindResponses
	// KindMessages is POST /v1/messages, Anthropic's Messages API.
	KindMessages
	// KindCountTokens is POST /v1/messages/count_tokens: a Messages
	// request the server only counts the tokens of.
	KindCountTokens
	// KindStored is a request on a stored response by its id: GET or
	// DELETE /v1/responses/{id}, its cancel and its input items. It has
	// no body.
	KindStored
)

// anthropic reports whether requests of kind k speak Anthropic's API, and
// are answered Anthropic's error shape.
func (k Kind) anthropic() bool { return k == KindMessages || k == KindCountTokens }

// generates reports whether requests of kind k generate tokens, whose
// usage the answer reports.
func (k Kind) generates() bool {
	return k == KindCompletion || k == KindChat || k == KindResponses || k == KindMessages
}

// Request is what llmlb reads from an OpenAI request body. Body holds the
// original bytes, forwarded unchanged.
type Request struct {
	Kind   Kind
	Model  string
	Stream bool
	// IncludeUsage reports whether the client asked for the final usage chunk
	// (stream_options.include_usage).
	IncludeUsage bool
	// StreamOptions is the raw "stream_options" value (null included), nil
	// when the body has no such key; it aliases Body.
	StreamOptions json.RawMessage
	// Prompt is the raw "prompt" value (completions) and Messages the raw
	// "messages" value (chat, Messages); both alias Body.
	Prompt   json.RawMessage
	Messages json.RawMessage
	Body     []byte
	// Canonical is the prompt's canonical bytes (package prefix), for
	// completions and chat, with long texts left in Body (prefix.Parts);
	// empty for other routes, and in the proxy once the pick has read it
	// (its buffer is lent to the next request).
	Canonical prefix.Parts
	// MaxTokens is max_completion_tokens or max_tokens (max_output_tokens
	// for Responses); 0 if none.
	MaxTokens int
	// maxKeys are the keys of the body that set MaxTokens.
	maxKeys []string
	// PreviousResponseID is a Responses request's previous_response_id, as
	// the client sent it; "" if none.
	PreviousResponseID string
	// CacheSalt is vLLM's cache_salt, which separates prefix caches.
	CacheSalt string
	// Uncontinuable says why a stream of this request cannot be continued
	// on another server if its own dies ("" when it can): only a single
	// text answer to a chat or a one-string completion can be, without
	// log probabilities or constrained output, which another server could
	// not resume faithfully.
	Uncontinuable string
}

// PromptTokens estimates the prompt's tokens from its canonical bytes
// ([prefix.Tokens]).
func (r *Request) PromptTokens() int { return prefix.Tokens(r.Canonical.Len()) }

// wireRequest holds the only fields routed on, each found by its exact
// key: OpenAI-compatible servers (pydantic models) match keys with case, so
// "Model" or "stream_Options" is not the field; encoding/json would match
// them without case.
type wireRequest struct {
	Model, Stream, StreamOptions, Prompt, Messages, Tools, MaxTokens, MaxCompletion, CacheSalt json.RawMessage
	// Responses and Messages
	Input, Instructions, System, MaxOutput, PreviousResponseID json.RawMessage
	// What makes a stream impossible to continue faithfully on another
	// server (see [Request.Uncontinuable]).
	N, BestOf, Logprobs, TopLogprobs, Echo, ResponseFormat json.RawMessage
	Guided                                                 []byte // the first guided_* or structured_outputs key set
}

// set keeps val if key is one of the fields; a later duplicate key wins,
// as it does in encoding/json and in the servers behind us.
func (w *wireRequest) set(key, val []byte) bool {
	switch string(key) {
	case "model":
		w.Model = val
	case "stream":
		w.Stream = val
	case "stream_options":
		w.StreamOptions = val
	case "prompt":
		w.Prompt = val
	case "messages":
		w.Messages = val
	case "tools":
		w.Tools = val
	case "max_tokens":
		w.MaxTokens = val
	case "max_completion_tokens":
		w.MaxCompletion = val
	case "cache_salt":
		w.CacheSalt = val
	case "input":
		w.Input = val
	case "instructions":
		w.Instructions = val
	case "system":
		w.System = val
	case "max_output_tokens":
		w.MaxOutput = val
	case "previous_response_id":
		w.PreviousResponseID = val
	case "n":
		w.N = val
	case "best_of":
		w.BestOf = val
	case "logprobs":
		w.Logprobs = val
	case "top_logprobs":
		w.TopLogprobs = val
	case "echo":
		w.Echo = val
	case "response_format":
		w.ResponseFormat = val
	default:
		if (bytes.HasPrefix(key, []byte("guided_")) || string(key) == "structured_outputs") && !isNull(val) && w.Guided == nil {
			w.Guided = key
		}
	}
	return true
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
	return &HTTPError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
		Msg: "Content-Type must be application/json, got " + quote(ct) + " (with curl, add -H 'Content-Type: application/json')."}
}

// ParseRequest validates body as an OpenAI request of kind k and decodes the
// fields llmlb routes on. Every failure is an [*HTTPError] with status 400.
//
// An error found after the model field was read comes with a Request that
// carries the Model, so that a rejection can be counted and listed under
// the model the client asked for; other errors come with nil.
func ParseRequest(k Kind, body []byte) (*Request, error) {
	return parseRequest(k, body, nil)
}

// parseRequest is ParseRequest writing the canonical prompt's glue into
// canon's spare capacity.
func parseRequest(k Kind, body, canon []byte) (*Request, error) {
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
	if !jsonscan.Object(body, w.set) {
		// Not valid, or not sure: encoding/json decides and words the
		// error.
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(body, &fields); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) {
				return nil, badRequest("", "The request body is not valid JSON: %s at byte %d.", se.Error(), se.Offset)
			}
			return nil, badRequest("", "The request body is not valid JSON: %s.", err.Error())
		}
		w = wireRequest{}
		for k, v := range fields {
			w.set([]byte(k), v)
		}
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
			return r, badRequest("stream", "stream must be a boolean.")
		}
	}
	if !isNull(w.StreamOptions) {
		var so map[string]json.RawMessage
		var include *bool
		if err := json.Unmarshal(w.StreamOptions, &so); err != nil || (!isNull(so["include_usage"]) && json.Unmarshal(so["include_usage"], &include) != nil) {
			return r, badRequest("stream_options", "stream_options must be an object with a boolean include_usage.")
		}
		r.IncludeUsage = include != nil && *include
	}
	r.StreamOptions = w.StreamOptions
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"max_tokens", w.MaxTokens}, {"max_completion_tokens", w.MaxCompletion}, {"max_output_tokens", w.MaxOutput}} {
		if isNull(f.raw) {
			continue
		}
		var n int
		if err := json.Unmarshal(f.raw, &n); err != nil || n < 0 {
			return r, badRequest(f.name, "%s must be a non-negative integer.", f.name)
		}
		if r.MaxTokens == 0 || f.name != "max_tokens" {
			r.MaxTokens = n
		}
		r.maxKeys = append(r.maxKeys, f.name)
	}
	if !isNull(w.CacheSalt) {
		if err := json.Unmarshal(w.CacheSalt, &r.CacheSalt); err != nil {
			return r, badRequest("cache_salt", "cache_salt must be a string.")
		}
	}
	if k == KindResponses && !isNull(w.PreviousResponseID) {
		if err := json.Unmarshal(w.PreviousResponseID, &r.PreviousResponseID); err != nil || r.PreviousResponseID == "" {
			return r, badRequest("previous_response_id", "previous_response_id must be a non-empty string.")
		}
	}
	// The body is valid UTF-8 and valid JSON (jsonscan or encoding/json
	// took it whole), so the prompt's text need not be checked again.
	var err error
	r.Canonical.Glue = canon
	switch k {
	case KindCompletion:
		err = r.Canonical.SetValidCompletion(w.Prompt)
	case KindChat:
		err = r.Canonical.SetValidChat(w.Messages, w.Tools)
	case KindResponses:
		err = r.Canonical.SetValidResponses(w.Instructions, w.Input, w.Tools)
	case KindMessages, KindCountTokens:
		err = r.Canonical.SetValidMessages(w.System, w.Messages, w.Tools)
	}
	var fe *prefix.FormatError
	if errors.As(err, &fe) {
		return r, badRequest(fe.Field, "%s", fe.Msg)
	}
	r.Uncontinuable = uncontinuable(k, &w)
	return r, nil
}

// uncontinuable says why a stream of a request of kind k with fields w
// cannot be continued, "" if it can.
func uncontinuable(k Kind, w *wireRequest) string {
	is := func(raw json.RawMessage, vals ...string) bool {
		return isNull(raw) || slices.Contains(vals, string(raw))
	}
	switch {
	case k != KindCompletion && k != KindChat:
		return "api"
	case k == KindCompletion && (len(w.Prompt) == 0 || w.Prompt[0] != '"'):
		return "prompt" // token ids or a batch
	case !is(w.N, "1"), !is(w.BestOf, "1"):
		return "n"
	case !is(w.Logprobs, "false"), !is(w.TopLogprobs, "0"):
		return "logprobs"
	case w.Guided != nil, !is(w.ResponseFormat) && !bytes.Contains(w.ResponseFormat, []byte(`"text"`)):
		return "structured"
	case !is(w.Echo, "false"):
		return "echo"
	}
	return ""
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
