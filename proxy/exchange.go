package proxy

import (
	"context"
	"net/http"
	"net/url"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
)

// exchange is one client request from its arrival to its last byte: the one
// object the handler's stages (authorize, parse, admit, route, tokenize,
// pick, forward) fill in, and from which [Server.finish] derives, once,
// the request's status, metrics, status-page entry and access line.
//
// It rides in the request context from [Server.withExchange] through the
// handler and ReverseProxy's Rewrite, RoundTrip, ModifyResponse and
// ErrorHandler, all of which run on the handler's goroutine; only the
// stream timers' cancel runs elsewhere, and it touches no field, and an
// eviction, which touches only evict's atomic flag.
type exchange struct {
	// set on arrival
	id     string
	start  time.Time
	w      *recorder       // the only writer the handler and ReverseProxy see
	client context.Context // the client's own context, before our timeout
	inURL  *url.URL        // the path and query the client asked for
	// span is the request's span, nil without tracing; traced is the
	// client's context with it, the parent of the stages' spans.
	span   trace.Span
	traced context.Context

	// authorize
	inference bool    // a route that names a model: counted and listed as such
	anthropic bool    // a route of Anthropic's API: llmlb's errors take its shape
	tenant    *tenant // the key's tenant; nil without keys configured

	// parse
	req   *Request // nil until parsed; carries the model when a later field was bad
	canon *[]byte  // req.Canonical's buffer, lent by Server.buffers; nil if none or given back
	// promptTokens is req.PromptTokens(), kept when the canonical prompt
	// is given back after the pick; prompt is its start for a debug
	// access line, "" unless prompts are logged.
	promptTokens int
	prompt       string

	// admit
	admitted int // tokens (estimated) taken from the tenant's limit; 0 if none
	// fleetAdmitted: the fleet's limits admitted the request, so its
	// tokens are settled there, not in the local limiter.
	fleetAdmitted bool
	// sessionHome is the backend the fleet holds for the request's
	// session, "" for none or no fleet.
	sessionHome string

	// route
	target string // the model backends are asked for; req.Model is the client's; "" before routing
	// deadlines are the request's latency targets, from its headers;
	// sloResults what came of them ("ttft=met"), for the access line.
	deadlines  deadlines
	sloResults []string
	// holder is the backend storing the response the request names
	// (previous_response_id, or the path's id), the only one it may go
	// to; nil for any other request.
	holder *balancer.Backend
	// breq is what the balancer was asked; its prompt fields are the
	// canonical buffer's, given back after the pick.
	breq *balancer.Request

	// pick
	picked bool // PickWait returned, with a decision or an error
	guard  *balancer.Guard
	dec    balancer.Decision

	// pd is the request's prefill leg, nil for a request answered in one
	// leg (pd.go).
	pd *pdPlan
	// evict is the request's registration for eviction, nil for a request
	// eviction may not end (evict.go). It is the one part of the exchange
	// another goroutine touches, through its atomic fired.
	evict *eviction

	// capture is the request's capture line, nil unless sampled
	// (capture.go).
	capture *captured

	// forward
	forwarded bool // handed to ReverseProxy
	// body is what each attempt sends; its buffer (body.held) is the
	// client's body as read, held until the exchange is finished.
	body     sendBody
	attempts int // backends tried so far
	// continuations is how many times the stream was continued on
	// another server after its first byte.
	continuations int
	sentAt        time.Time // when the latest attempt was sent
	// stripUsage: llmlb asked for the stream's usage chunk, the client
	// did not, so the stream pipeline drops it.
	stripUsage bool
	obs        usageReader // what the answering backend reported, once it answered 200: its stream, or its held JSON answer
	// resumer continues the answer's stream on another server; nil
	// unless the answer is a stream.
	resumer *resumer
	// streamErr is why the proxy cut the answering backend's stream
	// (errStreamStalled), nil if it did not.
	streamErr error

	// finish
	failure *HTTPError // what llmlb answered itself (status 499: nothing), nil if it did not
	ended   bool       // the handler returned: the answer the client got is whole
	backend string     // the answering backend's ID, "" if none
	usage   stream.Usage
	ttft    time.Duration // streams: to the first token event; 0 if none
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// reason is the x-llmlb-reason of the backend that answered: the picker's
// reason, or [balancer.ReasonRetry] when earlier candidates failed.
func (ex *exchange) reason() string {
	if ex.attempts > 1 {
		return string(balancer.ReasonRetry)
	}
	return string(ex.dec.Reason)
}

// withExchange gives every request its exchange and its ID, and finishes
// it when the handler returns, whatever path it took. A panic becomes a
// 500 and a log line with the stack; http.ErrAbortHandler, which
// ReverseProxy raises to cut a stream, is re-raised once the request is
// finished, so that net/http aborts the connection, as chi's Recoverer
// does.
func (s *Server) withExchange(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestID(r.Header.Get(HeaderRequestID))
		r.Header.Set(HeaderRequestID, id) // forwarded to the backend with the other headers
		w.Header().Set(HeaderRequestID, id)
		ex := &exchange{id: id, start: time.Now(), w: &recorder{ResponseWriter: w}, client: r.Context(), inURL: r.URL}
		ctx := r.Context()
		if s.tracer != nil && r.URL.Path != "/health" && r.URL.Path != "/ready" {
			ctx = s.startSpan(ctx, ex, r)
		}
		ex.traced = ctx
		defer func() {
			p := recover()
			if p != nil && p != http.ErrAbortHandler {
				s.logger.Error("handler panic", "panic", p, "stack", string(debug.Stack()))
				if !ex.w.wrote {
					writeError(ex.w, &HTTPError{Status: http.StatusInternalServerError, Type: "internal_error", Msg: "Internal error in the load balancer."})
					ex.ended = true
				}
			}
			s.finish(ex, r)
			if p == http.ErrAbortHandler {
				panic(p)
			}
		}()
		next.ServeHTTP(ex.w, r.WithContext(context.WithValue(ctx, exchangeKey{}, ex)))
		ex.ended = true
	})
}

// fail ends the exchange with llmlb's own answer to err, as [errorFor]
// maps it; a client that left is not answered.
func (s *Server) fail(ex *exchange, err error) {
	he := s.errorFor(ex.client, ex.evictedErr(err))
	ex.failure = he
	switch {
	case he.Status == StatusClientClosed:
	case ex.anthropic:
		writeAnthropicError(ex.w, he)
	default:
		writeError(ex.w, he)
	}
}

// recorder remembers the status written through it. It unwraps for
// http.ResponseController, so flushing reaches the real writer.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	failed bool // a write failed: the client did not get it all
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status = code
		r.wrote = code >= 200
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	n, err := r.ResponseWriter.Write(p)
	if err != nil {
		r.failed = true
	}
	return n, err
}

func (r *recorder) Flush() {
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
