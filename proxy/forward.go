package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
)

// retryTransport tries the exchange's candidates in order until one answers
// with a status that is not retryable. Because it returns before any byte of
// the response is copied to the client, every retry happens before the first
// byte, and the body is replayed from the bytes the handler already holds.
type retryTransport struct {
	base          http.RoundTripper
	maxAttempts   int
	retryStatuses []int
	retryBroken   bool
	firstByte     time.Duration      // streams: wait for response headers; 0: none of our own
	idle          time.Duration      // streams: silence allowed once headers arrived; 0: none
	continuations int                // streams: how many times one may be continued elsewhere
	bal           *balancer.Balancer // told of every failure: passive health
	logger        *slog.Logger
	metrics       *metrics
	tracer        trace.Tracer // nil makes no attempt spans
}

// RoundTrip tries the exchange's candidates in order, one [retryTransport.attempt]
// each, until [retryTransport.verdict] takes an answer or an error as final.
// A request no server answered (the connection was never made, or broke
// before the response headers) is never failed while another could take
// it: when the pick's candidates are spent on such failures, it picks
// again, away from the last that failed, within max_attempts.
func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	ex := exchangeFrom(ctx)
	for {
		cands := ex.dec.Candidates[:min(len(ex.dec.Candidates), t.maxAttempts-ex.attempts)]
		var lastErr error
		repicked := false
		for i, be := range cands {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			ex.attempts++
			a := try{ex: ex, be: be}
			// Each attempt has its own context: the first-byte and stall
			// timers cancel it with their cause, and closing the response
			// body releases it.
			a.ctx, a.cancel = context.WithCancelCause(ctx)
			resp, err := t.attempt(req, &a, i, ex.body)
			repick := i == len(cands)-1 && t.unanswered(err) && ex.attempts < t.maxAttempts && ex.pd == nil
			resp, retry, err := t.verdict(req, a, resp, err, i == len(cands)-1 && !repick)
			if !retry {
				return resp, err
			}
			if err != nil {
				lastErr = err
			}
			if repick {
				if t.repick(req, ex, be) != nil {
					if isDialError(lastErr) {
						return nil, &dialError{backend: be.ID, err: lastErr}
					}
					return nil, lastErr
				}
				repicked = true
			}
		}
		if !repicked {
			return nil, lastErr
		}
	}
}

// unanswered reports whether err is a failure that another server can
// take the request after: no connection made, or, with
// retry_broken_connections, one that broke before the response headers
// (the server died or restarted). A timeout is not: the request may be
// what is slow.
func (t *retryTransport) unanswered(err error) bool {
	return err != nil && (isDialError(err) || t.retryBroken && !isTimeout(err) && !errors.Is(err, errFirstByteTimeout))
}

// repick replaces the exchange's decision with a fresh pick by model and
// load that avoids failed, the backend that could not be reached: under
// load the first pick may have kept only it (the others saturated), and
// passive health may not have ejected it yet.
func (t *retryTransport) repick(req *http.Request, ex *exchange, failed *balancer.Backend) error {
	breq := *ex.breq
	breq.Prompt, breq.Parts, breq.UserText, breq.TokenBlocks = nil, nil, nil, nil // the canonical prompt was given back
	breq.Avoid, breq.Guard = failed.ID, ex.guard
	dec, err := t.bal.PickWait(req.Context(), &breq, nil)
	if err != nil {
		t.debug(req.Context(), "no backend to try after a connect failure", failed, err)
		return err
	}
	ex.dec = dec
	return nil
}

// try is one attempt: the exchange, the candidate it goes to, and the
// attempt's own context under the request's. It lives for one pass of
// RoundTrip's loop; an answer's [attemptBody] takes over ctx and cancel.
type try struct {
	ex     *exchange
	be     *balancer.Backend
	ctx    context.Context
	cancel context.CancelCauseFunc
	span   trace.Span // nil without tracing; ended with the attempt
}

// attempt sends req to a.be, the exchange's i-th candidate, and returns
// what came back. On a stream with a first-byte limit, a timer cancels the
// attempt when no response headers arrive in time.
func (t *retryTransport) attempt(req *http.Request, a *try, i int, body sendBody) (*http.Response, error) {
	ex, be := a.ex, a.be
	out := attemptRequest(a.ctx, req, be, ex.inURL, body)
	if t.tracer != nil {
		t.startAttempt(a, out, i)
	}
	if i > 0 || ex.guard.Backend() != be { // the pick attached the first
		ex.guard.Attach(be, ex.dec.Work[i], time.Now())
	}
	ex.sentAt = time.Now()
	var fb *time.Timer
	if ex.req.Stream && t.firstByte > 0 {
		fb = time.AfterFunc(t.firstByte, func() { a.cancel(errFirstByteTimeout) })
	}
	resp, err := t.base.RoundTrip(out)
	if fb != nil && !fb.Stop() && err == nil {
		// The headers came as the timer fired; its cancel may land
		// at any moment, so this answer cannot be streamed.
		resp.Body.Close()
		resp, err = nil, errFirstByteTimeout
	}
	return resp, err
}

// verdict judges what attempt a got back (resp or err): it tells passive
// health of a failure, and reports whether the request goes on to the next
// candidate, which the last never does. Otherwise the response or error is
// final; a response's body is wrapped by [retryTransport.answer]. Every
// path but the answer releases the attempt's context.
func (t *retryTransport) verdict(req *http.Request, a try, resp *http.Response, err error, last bool) (*http.Response, bool, error) {
	ctx, be := req.Context(), a.be
	if err != nil {
		firstByte := errors.Is(context.Cause(a.ctx), errFirstByteTimeout) || errors.Is(err, errFirstByteTimeout)
		endAttempt(a.span, 0, err)
		a.cancel(nil)
		if ctx.Err() != nil {
			return nil, false, err
		}
		kind := failKind(err)
		if firstByte {
			err = fmt.Errorf("backend %s sent no headers within %s: %w", be.ID, t.firstByte, errFirstByteTimeout)
		}
		if firstByte || isTimeout(err) {
			kind = balancer.FailFirstByte
		}
		t.bal.Failed(be, kind)
		// Nothing reached the client yet. A refused connection sent
		// nothing; a connection that broke before the response
		// headers (the server died or restarted) produced nothing; a
		// stream without headers after stream_first_byte_timeout is a
		// hung server. Each time the next candidate can take the
		// request. Another timeout is not retried: the request may be
		// what is slow.
		if !last && (isDialError(err) || firstByte || (t.retryBroken && !isTimeout(err))) {
			t.metrics.retries.WithLabelValues(be.ID).Inc()
			t.debug(ctx, "backend failed before answering, trying next", be, err)
			return nil, true, err
		}
		if isDialError(err) {
			return nil, false, &dialError{backend: be.ID, err: err}
		}
		return nil, false, err
	}
	failed, kind := resp.StatusCode >= 500, balancer.FailStatus
	if resp.StatusCode == http.StatusTooManyRequests {
		// The server is overloaded: it counts against it, and the
		// request goes to the next candidate (issue 17).
		failed, kind = true, balancer.FailOverloaded
	}
	if !last && (kind == balancer.FailOverloaded || slices.Contains(t.retryStatuses, resp.StatusCode)) {
		if failed {
			t.bal.Failed(be, kind)
		}
		t.metrics.retries.WithLabelValues(be.ID).Inc()
		t.debug(ctx, "backend answered retryable status, trying next", be, nil, "status", resp.StatusCode)
		// Drain a little so the connection can be reused, then drop it.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		resp.Body.Close()
		endAttempt(a.span, resp.StatusCode, nil)
		a.cancel(nil)
		return nil, true, nil
	}
	if failed {
		t.bal.Failed(be, kind)
	}
	if resp.StatusCode == http.StatusOK && a.ex.req.Kind.generates() && !isSSE(resp) && !encoded(resp) {
		if err := t.hold(a, resp); err != nil {
			// Cut short: nothing reached the client, so the next
			// candidate can answer whole.
			endAttempt(a.span, resp.StatusCode, err)
			a.cancel(nil)
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			t.bal.Failed(be, balancer.FailCut)
			err = fmt.Errorf("backend %s: %w", be.ID, err)
			if !last {
				t.metrics.retries.WithLabelValues(be.ID).Inc()
				t.debug(ctx, "backend's answer was cut short, trying next", be, err)
				return nil, true, err
			}
			return nil, false, err
		}
	}
	return t.answer(req, a, resp, !failed), false, nil
}

// errAnswerCut is an answer whose JSON ended before it was whole.
var errAnswerCut = errors.New("answer cut short")

// hold reads a JSON answer whole before any of it reaches the client, and
// hands it on only if it parses: an answer cut short can still go to the
// next candidate. An answer longer than maxJSONBody is passed on as it
// comes, unchecked.
func (t *retryTransport) hold(a try, resp *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody+1))
	switch {
	case err != nil:
		resp.Body.Close()
		return fmt.Errorf("%w: %w", errAnswerCut, err)
	case len(body) > maxJSONBody:
		resp.Body = &heldAnswer{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), src: resp.Body}
		return nil
	case !json.Valid(body):
		resp.Body.Close()
		return fmt.Errorf("%w: %d bytes of JSON, not whole", errAnswerCut, len(body))
	}
	resp.Body = &heldAnswer{Reader: bytes.NewReader(body), src: resp.Body}
	resp.ContentLength = int64(len(body))
	a.ex.obs = answerUsage(stream.BodyUsage(streamAPI(a.ex.req.Kind), body))
	return nil
}

// heldAnswer is an answer read ahead: it reads from Reader and closes the
// backend's body.
type heldAnswer struct {
	io.Reader
	src io.Closer
}

func (h *heldAnswer) Close() error { return h.src.Close() }

// isSSE reports whether resp is an event stream.
func isSSE(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}

// encoded reports whether resp's body is compressed (a client's
// Accept-Encoding reaches the server): llmlb passes it on as it comes,
// unread, since its events and JSON are not the bytes it would read.
func encoded(resp *http.Response) bool {
	ce := resp.Header.Get("Content-Encoding")
	return ce != "" && !strings.EqualFold(ce, "identity")
}

// failKind is the passive-health failure of an attempt that got no
// response: err.
func failKind(err error) balancer.Failure {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return balancer.FailRefused
	}
	return balancer.FailConnect
}

// answer wraps the body of the response that goes to the client in an
// [attemptBody]. A good stream's is read by the stream pipeline
// ([Server.streamAnswer]), which judges it by its API's protocol and can
// continue it on another server through the exchange's resumer.
func (t *retryTransport) answer(req *http.Request, a try, resp *http.Response, judge bool) *http.Response {
	sb := t.attemptBody(a, resp, judge)
	resp.Body = sb
	if ex := a.ex; judge && ex.req.Stream && ex.req.Kind.generates() && isSSE(resp) && !encoded(resp) {
		sb.byProtocol = true
		ex.resumer = &resumer{t: t, req: req, ex: ex, cur: sb}
	}
	return resp
}

// attemptBody wraps an attempt's response body. A good answer counts as a
// success once its body has ended (judge): a stream cut after its headers
// is a failure (issue 17).
func (t *retryTransport) attemptBody(a try, resp *http.Response, judge bool) *attemptBody {
	sb := &attemptBody{ReadCloser: resp.Body, ctx: a.ctx, cancel: a.cancel, be: a.be, ex: a.ex, bal: t.bal, judge: judge,
		span: a.span, status: resp.StatusCode}
	if a.ex.req.Stream && t.idle > 0 {
		sb.idle = t.idle
		sb.timer = time.AfterFunc(t.idle, func() { a.cancel(errStreamStalled) })
		sb.timer.Stop() // runs only while a Read waits on the backend
	}
	return sb
}

func (t *retryTransport) debug(ctx context.Context, msg string, be *balancer.Backend, err error, attrs ...any) {
	if !t.logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs = append(attrs, "backend", be.ID)
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	t.logger.DebugContext(ctx, msg, attrs...)
}

// sendBody is what is sent to backends: head, the client's bytes (or a
// rewritten copy), then tail, what llmlb adds at the end (see
// [withUsage]). They are kept apart so that a long prompt is sent from the
// bytes read from the client, never copied, on every attempt.
type sendBody struct {
	head, tail []byte
	held       *heldBody // the pooled buffer head is in, nil if none
}

func (b sendBody) size() int64 { return int64(len(b.head) + len(b.tail)) }

// inlineBody is the largest body sent from a copy of its own: net/http's
// transport writes the headers and a body it knows is in memory (a
// bytes.Reader) in one write when both fit its 4 KB buffer, but flushes
// the headers alone before any other body. Below this size the copy costs
// less than the second write; above it the body is written in parts
// anyway.
const inlineBody = 4 << 10

// open returns a reader over the whole body, which holds the pooled
// buffer until it is closed, or, for a small body, reads a copy of it.
func (b sendBody) open() io.ReadCloser {
	if b.size() <= inlineBody {
		return io.NopCloser(bytes.NewReader(append(append(make([]byte, 0, b.size()), b.head...), b.tail...)))
	}
	b.held.hold()
	return &heldReader{head: b.head, tail: b.tail, held: b.held}
}

// attemptRequest returns req aimed at backend be, with a fresh reader over
// body so that every attempt sends the whole body. Attempts share req's
// header, which ReverseProxy made for them and nothing changes after
// Rewrite (a transport must not modify a request).
func attemptRequest(ctx context.Context, req *http.Request, be *balancer.Backend, in *url.URL, body sendBody) *http.Request {
	out := req.WithContext(ctx)
	u := *be.URL
	u.Path, u.RawPath = joinPath(be.URL, in)
	switch {
	case be.URL.RawQuery == "":
		u.RawQuery = in.RawQuery
	case in.RawQuery != "":
		u.RawQuery = be.URL.RawQuery + "&" + in.RawQuery
	}
	out.URL = &u
	out.Host = ""
	if be.Ranked {
		// The rank is this attempt's alone: attempts share req.Header, so
		// the header is set on a copy.
		out.Header = req.Header.Clone()
		out.Header.Set(balancer.HeaderDataParallelRank, strconv.Itoa(be.Rank))
	}
	if body.size() == 0 { // a GET or DELETE on a stored response
		out.Body, out.ContentLength, out.GetBody = http.NoBody, 0, nil
		return out
	}
	out.Body = body.open()
	out.ContentLength = body.size()
	out.GetBody = func() (io.ReadCloser, error) { return body.open(), nil }
	return out
}

// joinPath puts the client's path under the backend URL's path, with exactly
// one slash between them, keeping escapes as httputil does.
func joinPath(base, in *url.URL) (path, rawPath string) {
	if base.RawPath == "" && in.RawPath == "" {
		return singleJoin(base.Path, in.Path), ""
	}
	bp, ip := base.EscapedPath(), in.EscapedPath()
	return singleJoin(base.Path, in.Path), singleJoin(bp, ip)
}

func singleJoin(a, b string) string {
	as, bs := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/")
	switch {
	case as && bs:
		return a + b[1:]
	case !as && !bs:
		return a + "/" + b
	}
	return a + b
}

// Errors the stream timers cancel an attempt with; [errorFor] maps both to
// 504.
var (
	errFirstByteTimeout = errors.New("stream first byte timeout")
	errStreamStalled    = stream.ErrStalled
)

// attemptBody is the answering backend's response body. Closing it
// releases the attempt's context. On a stream with an idle limit, each Read
// runs a timer that cuts the stream when the backend sends nothing for
// that long; time spent outside Read (the client reading slowly) does not
// count. Its end tells passive health how the answer went: whole (a
// success), stalled, or cut by the backend; a client that left or
// llmlb's own request timeout says nothing of the backend. Read and
// Close run on the handler's goroutine; only the timer's cancel runs
// elsewhere.
type attemptBody struct {
	io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	be     *balancer.Backend
	ex     *exchange
	bal    *balancer.Balancer
	judge  bool // the status was not a failure already counted; cleared once judged
	idle   time.Duration
	timer  *time.Timer // nil without an idle limit
	span   trace.Span  // the attempt's, ended on Close; nil without tracing
	status int
	first  bool // a byte was read
	end    error
	// byProtocol: the stream pipeline judges the stream's end by its
	// API's terminator ([attemptBody.Ended]), not the body's EOF.
	byProtocol bool
}

var _ stream.Judged = (*attemptBody)(nil)

// Ended tells passive health how the stream ended by its API's protocol:
// whole (reason ""), or broken. A cut or a stall was judged as it was
// read; an error event counts as a failed answer, a body that ended
// before its terminator as a cut, and an eviction as nothing.
func (b *attemptBody) Ended(reason string) {
	if reason != "" && b.end == nil {
		b.end = fmt.Errorf("stream broke (%s)", reason) // the attempt's span says so
	}
	if !b.judge {
		return
	}
	b.judge = false
	switch reason {
	case "":
		b.bal.Succeeded(b.be)
	case stream.BreakEvicted: // llmlb ended it: nothing of the backend's
	case stream.BreakError:
		b.bal.Failed(b.be, balancer.FailStatus)
	default:
		b.bal.Failed(b.be, balancer.FailCut)
	}
}

func (b *attemptBody) Read(p []byte) (int, error) {
	if b.timer != nil {
		b.timer.Reset(b.idle)
	}
	n, err := b.ReadCloser.Read(p)
	if b.timer != nil {
		b.timer.Stop()
	}
	if n > 0 && !b.first {
		b.first = true
		if b.span != nil {
			b.span.AddEvent("first byte")
		}
	}
	if err == nil {
		return n, nil
	}
	if err != io.EOF && b.end == nil {
		b.end = err
	}
	stalled := errors.Is(context.Cause(b.ctx), errStreamStalled)
	if stalled && b.ex.streamErr == nil {
		b.ex.streamErr = fmt.Errorf("backend %s sent nothing for %s: %w", b.be.ID, b.idle, errStreamStalled)
	}
	if b.judge && !(err == io.EOF && b.byProtocol) {
		b.judge = false
		switch {
		case err == io.EOF:
			b.bal.Succeeded(b.be)
		case stalled:
			b.bal.Failed(b.be, balancer.FailStall)
		case b.ctx.Err() == nil: // not our cancel nor the client's: the backend cut it
			b.bal.Failed(b.be, balancer.FailCut)
		}
	}
	if stalled {
		return n, b.ex.streamErr
	}
	return n, err
}

func (b *attemptBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.span != nil {
		endAttempt(b.span, b.status, b.end)
		b.span = nil
	}
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// firstByteBody reports the first non-empty read of a response body: for a
// stream, the first token reaching the proxy.
type firstByteBody struct {
	io.ReadCloser
	once    sync.Once
	onFirst func()
}

func (b *firstByteBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.once.Do(b.onFirst)
	}
	return n, err
}

// bufferPool lends ReverseProxy its copy buffers. A stream holds its
// buffer from its first byte to its last, so the size is paid by every
// open stream: 16 KB, half io.Copy's 32 KB, holds dozens of events, and
// a long JSON answer takes twice the reads of a buffer it hardly needed.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}}
}

func (bp *bufferPool) Get() []byte  { return *(bp.p.Get().(*[]byte)) }
func (bp *bufferPool) Put(b []byte) { bp.p.Put(&b) }
