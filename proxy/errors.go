package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
)

// StatusClientClosed is the status recorded (never sent) when the client went
// away before the response ended, as nginx logs it.
const StatusClientClosed = 499

// noBackendRetryAfter is the Retry-After of a 503 for a model none of whose
// servers is up: a server that comes back is used after its first good
// health probe, and scrape.health_interval defaults to 2s.
const noBackendRetryAfter = 2 * time.Second

// HTTPError is an error answered to the client as an OpenAI-shaped JSON body.
// Msg goes to the client; Err, if any, only to the log.
type HTTPError struct {
	Status int    // HTTP status
	Type   string // OpenAI error type, e.g. "invalid_request_error"
	Param  string // the offending request field, or ""
	Code   string // OpenAI error code, e.g. "model_not_found", or ""
	Msg    string
	Err    error
	// RetryAfter, when positive, is sent as Retry-After in whole seconds.
	RetryAfter time.Duration
}

func (e *HTTPError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%d %s: %v", e.Status, e.Msg, e.Err)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Msg)
}

func (e *HTTPError) Unwrap() error { return e.Err }

// badRequest returns a 400 invalid_request_error about param.
func badRequest(param, format string, args ...any) *HTTPError {
	return &HTTPError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Msg: fmt.Sprintf(format, args...)}
}

// errorBody is the OpenAI error envelope:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// writeError answers e to the client as OpenAI-shaped JSON.
func writeError(w http.ResponseWriter, e *HTTPError) {
	var body errorBody
	body.Error.Message = e.Msg
	body.Error.Type = e.Type
	if e.Param != "" {
		body.Error.Param = &e.Param
	}
	if e.Code != "" {
		body.Error.Code = &e.Code
	}
	setErrorHeaders(w.Header(), e)
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(&body) // the client may be gone; nothing to do
}

// setErrorHeaders sets the headers of llmlb's own error answer e.
func setErrorHeaders(h http.Header, e *HTTPError) {
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
		// The OpenAI SDKs read this before Retry-After, to the millisecond.
		h.Set("Retry-After-Ms", strconv.FormatInt(int64((e.RetryAfter+time.Millisecond-1)/time.Millisecond), 10))
	}
	if e.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="llmlb"`) // RFC 6750
	}
}

// anthropicErrorBody is Anthropic's error envelope:
// {"type":"error","error":{"type":...,"message":...}}
// (docs.anthropic.com/en/api/errors).
type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// anthropicType is Anthropic's error type for an answer of status code.
func anthropicType(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusRequestTimeout, http.StatusMethodNotAllowed:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if code >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// writeAnthropicError answers e to the client in Anthropic's shape, with
// the same status and headers as [writeError].
func writeAnthropicError(w http.ResponseWriter, e *HTTPError) {
	var body anthropicErrorBody
	body.Type = "error"
	body.Error.Type = anthropicType(e.Status)
	body.Error.Message = e.Msg
	setErrorHeaders(w.Header(), e)
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(&body)
}

// dialError marks a failure to connect to a backend: nothing was sent, so the
// request may go to another backend whatever the retry settings.
type dialError struct {
	backend string
	err     error
}

func (e *dialError) Error() string { return fmt.Sprintf("connect to %s: %v", e.backend, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// isDialError reports whether err is a failure to establish a connection.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// unknownModelError is a request for a model no backend serves. Its answer
// is the same 404 whatever the reason the model cannot be used here.
type unknownModelError struct {
	model string
	err   error // balancer.ErrUnknownModel, or why this client may not see it
}

func (e *unknownModelError) Error() string { return "model " + quote(e.model) + ": " + e.err.Error() }
func (e *unknownModelError) Unwrap() error { return e.err }

// errorFor maps an error met while serving a request to what the client is
// told: the one place a status and a client message are chosen for an
// error. clientCtx is the client's own request context, so that a client
// that left (499) is told apart from our own timeout (504).
func (s *Server) errorFor(clientCtx context.Context, err error) *HTTPError {
	var (
		he  *HTTPError
		ume *unknownModelError
		rle *rateLimitError
		fde *fleetDownError
	)
	switch {
	case errors.Is(err, balancer.ErrEvicted) && clientCtx.Err() == nil:
		// Before any other cause: eviction's cancel is what the others are.
		return &HTTPError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "evicted", Msg: stream.EvictedMessage, Err: err, RetryAfter: s.bal.RetryAfter()}
	case errors.As(err, &he):
		return he
	case errors.As(err, &fde):
		return fde.httpError()
	case clientCtx.Err() != nil:
		return &HTTPError{Status: StatusClientClosed, Type: "client_closed", Msg: "client closed request", Err: err}
	case errors.Is(err, errKeyMissing):
		return &HTTPError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Err: err,
			Msg: "You didn't provide an API key. Send it in an Authorization header using Bearer auth (Authorization: Bearer YOUR_KEY), or in an x-api-key header."}
	case errors.Is(err, errKeyInvalid):
		return &HTTPError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Err: err, Msg: "Incorrect API key provided."}
	case errors.As(err, &rle):
		return &HTTPError{Status: http.StatusTooManyRequests, Type: rle.kind, Code: "rate_limit_exceeded", Err: err, RetryAfter: rle.wait,
			Msg: fmt.Sprintf("Rate limit reached for this API key: %d %s per minute. Try again in %s.", rle.limit, rle.kind, rle.wait.Round(time.Millisecond))}
	case errors.As(err, &ume):
		return &HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found", Msg: "The model " + quote(ume.model) + " does not exist.", Err: err}
	case errors.Is(err, balancer.ErrUnknownModel):
		return &HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found", Msg: err.Error() + ": no backend serves it (GET /v1/models lists the models served here).", Err: err}
	case errors.Is(err, balancer.ErrQueueFull):
		return &HTTPError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", Msg: "Every model server is saturated and the queue is full; retry later.", Err: err, RetryAfter: s.bal.RetryAfter()}
	case errors.Is(err, balancer.ErrDeadline):
		return &HTTPError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "deadline_unmeetable", Msg: "No model server can send this request's first token within its deadline (x-slo-ttft-ms) and its priority is sheddable; retry later or with a later deadline.", Err: err, RetryAfter: s.bal.RetryAfter()}
	case errors.Is(err, balancer.ErrShed):
		return &HTTPError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "shed", Msg: "Every model server is saturated and this request's priority is sheddable; retry later.", Err: err, RetryAfter: s.bal.RetryAfter()}
	case errors.Is(err, balancer.ErrSaturated):
		// Only a P/D request's prefill pick returns it unqueued: its
		// decode server was picked, and it cannot answer in one leg.
		return &HTTPError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "prefill_saturated", Msg: "Every prefill server is saturated; retry later.", Err: err, RetryAfter: s.bal.RetryAfter()}
	case errors.Is(err, balancer.ErrQueueTimeout):
		return &HTTPError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "queue_timeout", Msg: "Every model server stayed saturated while the request waited; retry later.", Err: err}
	case errors.Is(err, balancer.ErrNoBackend):
		return &HTTPError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_backend", Msg: "No server of this model is up; try again shortly.", Err: err, RetryAfter: noBackendRetryAfter}
	case errors.Is(err, errAnswerCut):
		return &HTTPError{Status: http.StatusBadGateway, Type: "bad_gateway", Msg: "The model server's answer ended before it was whole.", Err: err}
	case errors.Is(err, errFirstByteTimeout):
		return &HTTPError{Status: http.StatusGatewayTimeout, Type: "timeout", Msg: "The model server did not start the stream in time.", Err: err}
	case errors.Is(err, errStreamStalled):
		return &HTTPError{Status: http.StatusGatewayTimeout, Type: "timeout", Msg: "The model server's stream stalled.", Err: err}
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return &HTTPError{Status: http.StatusGatewayTimeout, Type: "timeout", Msg: "The model server did not answer in time.", Err: err}
	default:
		return &HTTPError{Status: http.StatusBadGateway, Type: "bad_gateway", Msg: "The model server could not be reached.", Err: err}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
