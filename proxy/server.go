package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
)

// Header names llmlb sets on every proxied response.
const (
	HeaderBackend = "X-Llmlb-Backend"
	HeaderReason  = "X-Llmlb-Reason"
)

// Server serves the OpenAI API in front of the balancer's backends. Its
// handlers may be called concurrently.
type Server struct {
	// immutable after New
	cfg     Config
	bal     *balancer.Balancer
	logger  *slog.Logger
	metrics *metrics
	rp      *httputil.ReverseProxy
	started time.Time
	picks   *pickLog

	accessLog, logPrompts bool // set by SetLogging before serving
}

// SetLogging turns the access log (one line per request, at info) on or
// off, and with prompts the prompt text on it, at debug level only. Call
// it before the handlers serve.
func (s *Server) SetLogging(access, prompts bool) {
	s.accessLog, s.logPrompts = access, prompts
}

// New returns a Server forwarding to the backends bal picks. Its metrics are
// registered on reg. A nil logger discards.
func New(cfg Config, bal *balancer.Balancer, reg prometheus.Registerer, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, bal: bal, logger: logger, started: time.Now(), picks: newPickLog()}
	s.metrics = newMetrics(reg, bal)
	dialer := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	base := &http.Transport{
		Proxy:                 nil, // backends are reached directly, never through HTTP_PROXY
		DialContext:           dialer.DialContext,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerBackend,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		ExpectContinueTimeout: 0,
		ForceAttemptHTTP2:     false, // model servers speak HTTP/1.1; h2c is not negotiated
		DisableCompression:    true,  // pass Content-Encoding through untouched
	}
	s.rp = &httputil.ReverseProxy{
		Rewrite: s.rewrite,
		Transport: &retryTransport{base: base, maxAttempts: cfg.MaxAttempts, retryStatuses: cfg.RetryStatuses, retryBroken: cfg.RetryBrokenConnections,
			firstByte: cfg.StreamFirstByteTimeout, idle: cfg.StreamIdleTimeout, logger: logger, metrics: s.metrics},
		FlushInterval:  -1, // every write reaches the client at once: SSE events are never held back
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.errorHandler,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		BufferPool:     newBufferPool(),
	}
	return s
}

// Handler returns the client-facing routes.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(s.limits, s.withAccess, s.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &HTTPError{Code: http.StatusNotFound, Type: "invalid_request_error", Msg: "Unknown route " + r.Method + " " + r.URL.Path + "."})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &HTTPError{Code: http.StatusMethodNotAllowed, Type: "invalid_request_error", Msg: "Method " + r.Method + " is not allowed on " + r.URL.Path + "."})
	})
	r.Post("/v1/completions", s.serveModel(KindCompletion))
	r.Post("/v1/chat/completions", s.serveModel(KindChat))
	r.Get("/v1/models", s.serveModels)
	// Only inference routes: anything else under /v1/ (LoRA loading, for
	// one) could change a server, and reaches one only when an operator
	// lists it (issue 17).
	for _, p := range InferenceRoutes() {
		r.Post(p, s.serveModel(KindOther))
	}
	for _, p := range s.cfg.ExtraRoutes {
		r.Post(p, s.serveModel(KindOther))
	}
	r.Get("/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/ready", s.serveReady)
	return r
}

// serveModel handles a POST whose body names a model: parse, pick, forward.
func (s *Server) serveModel(k Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		a := accessFrom(r.Context())
		modelLabel, targetLabel, backendLabel := "", "", "none"
		rec := &statusRecorder{ResponseWriter: w}
		completed := false
		var ex *exchange
		defer func() {
			status := rec.status
			switch {
			case r.Context().Err() != nil && !completed, status == StatusClientClosed:
				status = StatusClientClosed
			case !completed && ex != nil && ex.streamErr != nil:
				status = errorFor(r.Context(), ex.streamErr).Code // a stall: cut by us
			case !completed:
				status = http.StatusBadGateway // the stream was cut by the backend after the header
			}
			a.status = status
			if backendLabel == "none" && status != StatusClientClosed { // llmlb answered itself: list it too
				reason := "rejected by llmlb"
				if ex != nil {
					reason = "no backend answered"
				}
				s.picks.add(pickEntry{At: time.Now(), ID: a.id, Model: a.model, Backend: "-", Reason: reason, Status: status, Duration: time.Since(start)}, Usage{})
			}
			s.metrics.requests.WithLabelValues(modelLabel, targetLabel, backendLabel, statusLabel(status)).Inc()
			if backendLabel != "none" {
				s.metrics.duration.WithLabelValues(backendLabel, modelLabel).Observe(time.Since(start).Seconds())
			}
			if ex != nil {
				s.observed(ex, a, backendLabel, modelLabel, time.Since(start))
			}
		}()

		req, herr := s.readRequest(rec, r, k)
		if req != nil {
			a.model = req.Model
			modelLabel, targetLabel = s.modelLabel(req.Model), s.modelLabel(req.Model)
		}
		if herr != nil {
			writeError(rec, herr)
			completed = true
			return
		}
		a.stream = req.Stream
		breq, herr := s.balancerRequest(r, req)
		if herr != nil {
			writeError(rec, herr)
			completed = true
			return
		}
		target := breq.Model
		a.model, a.target = req.Model, target
		if s.logPrompts && s.logger.Enabled(r.Context(), slog.LevelDebug) {
			a.promptForDebug = req.Canonical[:min(len(req.Canonical), maxLoggedPrompt)]
		}
		guard := s.bal.NewGuard()
		defer guard.Release()
		breq.Guard = guard
		dec, err := s.bal.PickWait(r.Context(), breq, make([]*balancer.Backend, 0, 4))
		a.waited = dec.Waited
		if dec.Waited > 0 {
			s.metrics.queueWait.Observe(dec.Waited.Seconds())
		}
		if err != nil {
			if !errors.Is(err, balancer.ErrUnknownModel) {
				modelLabel, targetLabel = req.Model, target
			}
			if errors.Is(err, balancer.ErrUnknownModel) {
				modelLabel, targetLabel = unknownModel, unknownModel
			}
			he := errorFor(r.Context(), err)
			switch {
			case errors.Is(err, balancer.ErrUnknownModel):
				he.Msg = "The model " + quote(req.Model) + " does not exist."
			case errors.Is(err, balancer.ErrQueueFull), errors.Is(err, balancer.ErrShed):
				he.RetryAfter = s.bal.RetryAfter()
			}
			if he.Code == StatusClientClosed {
				rec.status = StatusClientClosed
				return
			}
			writeError(rec, he)
			completed = true
			return
		}
		modelLabel, targetLabel = req.Model, target
		s.metrics.picks.WithLabelValues(dec.Candidates[0].ID, dec.Reason).Inc()
		if target != req.Model {
			body, err := setModel(req.Body, target)
			if err != nil {
				writeError(rec, badRequest("model", "The request body could not be rewritten for model %s: %v.", quote(target), err))
				completed = true
				return
			}
			req.Body = body
		}
		injected := false
		if s.cfg.RequestUsage && req.Stream && !req.IncludeUsage && k != KindOther {
			if body, err := withUsage(req.Body, req.StreamOptions); err == nil {
				req.Body, injected = body, true
			}
		}

		ex = &exchange{req: req, target: target, guard: guard, dec: dec, clientCtx: r.Context(), inURL: r.URL, stripUsage: injected}
		ctx := context.WithValue(r.Context(), exchangeKey{}, ex)
		if s.cfg.RequestTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
			defer cancel()
		}
		defer func() {
			if be := guard.Backend(); be != nil {
				backendLabel = be.ID
			}
		}()
		s.rp.ServeHTTP(rec, r.WithContext(ctx))
		completed = true
	}
}

// unknownModel is the model label of requests for a name no backend has
// ever offered: the names clients send are unbounded, a label's values
// must not be (each is a series kept for ever).
const unknownModel = "unknown"

// modelLabel is the model label of a request for name that llmlb refused
// before routing it (400, 413, 415): the name when a backend offers it or
// it is a configured alias, else [unknownModel].
func (s *Server) modelLabel(name string) string {
	if s.bal.Snapshot().Offered(name) || s.bal.RouteTargets(name) != nil {
		return name
	}
	return unknownModel
}

// maxLoggedPrompt bounds the prompt text a debug access line carries.
const maxLoggedPrompt = 2 << 10

// observed records what the observer saw of the answering backend's
// response: time to first token, tokens from usage, and the prefix match
// the balancer predicted against the cache hits the backend reported.
func (s *Server) observed(ex *exchange, a *access, backend, model string, took time.Duration) {
	if backend == "none" || ex.attempts == 0 {
		return
	}
	a.backend, a.reason, a.attempts = backend, ex.reason(), ex.attempts
	var u Usage
	if ex.obs != nil {
		u = ex.obs.Usage()
	}
	a.usage = u
	if !u.FirstToken.IsZero() && ex.req.Stream {
		a.ttft = u.FirstToken.Sub(ex.sentAt)
		s.metrics.ttft.WithLabelValues(backend, model).Observe(a.ttft.Seconds())
	}
	s.picks.add(pickEntry{At: time.Now(), ID: a.id, Model: model, Backend: backend, Reason: a.reason, Status: a.status, TTFT: a.ttft, Duration: took}, u)
	if !u.Known {
		return
	}
	s.metrics.tokens[0].WithLabelValues(backend, model).Add(float64(u.Prompt))
	s.metrics.tokens[1].WithLabelValues(backend, model).Add(float64(u.Completion))
	if !u.CachedKnown {
		return
	}
	s.metrics.tokens[2].WithLabelValues(backend, model).Add(float64(u.Cached))
	// The balancer counts in its own estimate of tokens (bytes/4); scale its
	// predicted share of the prompt to the backend's real prompt tokens.
	if est := ex.req.PromptTokens(); est > 0 && ex.attempts <= len(ex.dec.Work) {
		w := ex.dec.Work[ex.attempts-1]
		share := float64(max(0, est-w.UncachedTokens)) / float64(est)
		s.metrics.predicted.WithLabelValues(backend).Add(share * float64(u.Prompt))
		s.metrics.reported.WithLabelValues(backend).Add(float64(u.Cached))
	}
}

// balancerRequest resolves the request's model (aliases and weighted
// splits) and reads the routing headers into what the picker needs.
func (s *Server) balancerRequest(r *http.Request, req *Request) (*balancer.Request, *HTTPError) {
	target, prio := s.bal.Route(req.Model)
	bcfg := s.bal.Config()
	if h := r.Header.Get(bcfg.Admission.PriorityHeader); h != "" {
		p, err := strconv.Atoi(strings.TrimSpace(h))
		if err != nil {
			return nil, badRequest("", "The %s header must be an integer, got %s.", bcfg.Admission.PriorityHeader, quote(h))
		}
		prio = p
	}
	breq := &balancer.Request{
		Model:        target,
		Prompt:       req.Canonical,
		Seed:         prefix.Seed(target, req.CacheSalt),
		PromptTokens: req.PromptTokens(),
		MaxTokens:    req.MaxTokens,
		Priority:     prio,
	}
	if bcfg.Session.Header != "" {
		breq.Session = r.Header.Get(bcfg.Session.Header)
	}
	if req.Kind == KindChat && s.bal.UserKeyed() {
		breq.UserText = prefix.FirstUserText(req.Messages, bcfg.ConsistentHash.PrefixBytes)
	}
	return breq, nil
}

// readRequest reads and parses the body, bounded by MaxBodyBytes.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, k Kind) (*Request, *HTTPError) {
	if herr := checkContentType(r.Header); herr != nil {
		return nil, herr
	}
	tooLarge := &HTTPError{Code: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Msg: "The request body is larger than the limit of " + itoa(s.cfg.MaxBodyBytes) + " bytes (proxy.max_body_bytes)."}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, tooLarge
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, tooLarge
		case isTimeout(err):
			w.Header().Set("Connection", "close")
			return nil, &HTTPError{Code: http.StatusRequestTimeout, Type: "invalid_request_error", Kind: "request_timeout",
				Msg: "The request body did not arrive within " + s.cfg.BodyReadTimeout.String() + " (proxy.body_read_timeout).", Err: err}
		}
		return nil, &HTTPError{Code: http.StatusBadRequest, Type: "invalid_request_error", Msg: "The request body could not be read.", Err: err}
	}
	// The body is in: lift the limits middleware's read deadline, which
	// would otherwise end the connection's background read mid-stream.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	req, err := ParseRequest(k, buf.Bytes())
	if err != nil {
		var he *HTTPError
		if errors.As(err, &he) {
			return req, he // req carries the model when it was read
		}
		return nil, badRequest("", "%s", err.Error())
	}
	return req, nil
}

func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	ex := exchangeFrom(pr.In.Context())
	// The retry transport aims each attempt at its backend; this first aim
	// keeps ReverseProxy's own bookkeeping (Host, X-Forwarded-*) right.
	stripClientHeaders(pr.Out.Header)
	pr.SetURL(ex.dec.Candidates[0].URL)
	pr.SetXForwarded()
}

func (s *Server) modifyResponse(resp *http.Response) error {
	ex := exchangeFrom(resp.Request.Context())
	be := ex.guard.Backend()
	stripBackendHeaders(resp.Header)
	if s.cfg.BackendHeaders {
		resp.Header.Set(HeaderBackend, be.ID)
		resp.Header.Set(HeaderReason, ex.reason())
	}
	if ex.target != ex.req.Model {
		resp.Body = newModelRewriter(resp.Body, ex.target, ex.req.Model)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	resp.Body = &firstByteBody{ReadCloser: resp.Body, onFirst: func() {
		d := ex.guard.FirstByte(time.Now())
		s.metrics.ttfb.WithLabelValues(be.ID).Observe(d.Seconds())
	}}
	if resp.StatusCode == http.StatusOK && ex.req.Kind != KindOther {
		sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		itl := s.metrics.itl.WithLabelValues(be.ID, ex.req.Model)
		ex.obs = newObserver(resp.Body, sse, sse && ex.stripUsage, time.Now, func(d time.Duration) { itl.Observe(d.Seconds()) })
		resp.Body = ex.obs
		if ex.stripUsage {
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	}
	return nil
}

func (s *Server) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	ex := exchangeFrom(r.Context())
	he := errorFor(ex.clientCtx, err)
	if he.Code == StatusClientClosed {
		if rec, ok := w.(*statusRecorder); ok {
			rec.status = StatusClientClosed
		}
		return // nobody to answer; not an error of ours
	}
	if be := ex.guard.Backend(); be != nil && s.cfg.BackendHeaders {
		w.Header().Set(HeaderBackend, be.ID)
		w.Header().Set(HeaderReason, ex.reason())
	}
	if s.logger.Enabled(r.Context(), slog.LevelDebug) {
		s.logger.DebugContext(r.Context(), "forward failed", "model", ex.req.Model, "status", he.Code, "err", err)
	}
	writeError(w, he)
}

// modelCard is one entry of GET /v1/models, in vLLM's shape.
type modelCard struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

// serveModels answers the models served by ready backends, each once, base
// models first, sorted by name.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	var cards []modelCard
	seen := map[string]bool{}
	var adapters []modelCard
	for _, be := range s.bal.Snapshot().Backends {
		if be.State != balancer.StateReady {
			continue
		}
		for _, m := range be.Models {
			if !seen[m] {
				seen[m] = true
				cards = append(cards, modelCard{ID: m, Object: "model", Created: s.started.Unix(), OwnedBy: "llmlb", Root: m})
			}
		}
		for _, a := range be.Adapters {
			if !seen[a.Name] {
				seen[a.Name] = true
				p := a.Parent
				adapters = append(adapters, modelCard{ID: a.Name, Object: "model", Created: s.started.Unix(), OwnedBy: "llmlb", Root: a.Name, Parent: &p})
			}
		}
	}
	byID := func(a, b modelCard) int { return strings.Compare(a.ID, b.ID) }
	for _, name := range s.bal.PublicModels() {
		if seen[name] {
			continue
		}
		for _, t := range s.bal.RouteTargets(name) {
			if seen[t] {
				seen[name] = true
				cards = append(cards, modelCard{ID: name, Object: "model", Created: s.started.Unix(), OwnedBy: "llmlb", Root: name})
				break
			}
		}
	}
	slices.SortFunc(cards, byID)
	slices.SortFunc(adapters, byID)
	cards = append(cards, adapters...)
	if cards == nil {
		cards = []modelCard{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": cards})
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ready := 0
	for _, be := range s.bal.Snapshot().Backends {
		if be.State == balancer.StateReady {
			ready++
		}
	}
	if ready == 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "ready_backends": 0})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "ready_backends": ready})
}

// recoverer turns a panic in a handler into a 500 and a log line with the
// stack. http.ErrAbortHandler, which ReverseProxy raises to cut a stream, is
// re-raised so that net/http aborts the connection, as chi's Recoverer does.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.logger.Error("handler panic", "panic", p, "stack", string(debug.Stack()))
			if !rec.wrote {
				writeError(rec, &HTTPError{Code: http.StatusInternalServerError, Type: "internal_error", Msg: "Internal error in the load balancer."})
			}
		}()
		next.ServeHTTP(rec, r)
	})
}

// statusRecorder remembers the status written through it. It unwraps for
// http.ResponseController, so flushing reaches the real writer.
type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.status = code
		r.wrote = code >= 200
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(p)
}

func (r *statusRecorder) Flush() {
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

var _ io.Reader = (*firstByteBody)(nil)
