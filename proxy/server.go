package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/capture"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/proxy/stream"
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
	base    *http.Transport // the connections to backends, under rp's retries
	started time.Time
	picks   *pickLog
	buffers *sizedPool // request bodies and canonical prompts

	auth        auth // the API keys in force; see SetAuth
	authMetrics *authMetrics

	accessLog, logPrompts bool
	tok                   *tokenizer   // nil tokenizes nothing
	tracer                trace.Tracer // nil makes no spans
	dropTrace             bool
	fleet                 Fleet  // nil: an llmlb alone
	sessionHeader         string // balancer.session.header, read once: the balancer's config is fixed
	evicts                bool   // balancer.admission.evict_after is set: sheddable requests may be evicted

	capture atomic.Pointer[capture.Writer] // nil: no capture; see SetCapture
}

// Options are what a [Server] is built from. Only the API keys change
// after [New], through [Server.SetAuth].
type Options struct {
	// Config tunes forwarding: body limit, retries, timeouts.
	Config Config
	// Balancer picks the backends.
	Balancer *balancer.Balancer
	// Registerer takes the server's metrics.
	Registerer prometheus.Registerer
	// Logger logs; nil discards.
	Logger *slog.Logger
	// AccessLog writes one line per request at info; LogPrompts adds the
	// prompt text to it, at debug level only.
	AccessLog, LogPrompts bool
	// BackendTLS verifies HTTPS backends and presents the client
	// certificate to them ([Config.BackendTLS]); nil means the system
	// roots and no certificate.
	BackendTLS *tls.Config
	// KVEvents is the backends' KV-cache events, which the proxy
	// tokenizes prompts for; nil tokenizes nothing.
	KVEvents *kvevents.Store
	// Auth holds the API keys clients must present; none: no key asked.
	Auth AuthConfig
	// Tracer makes a span per request, its admission wait, its pick and
	// each upstream attempt, and tells each server its attempt's span as
	// its parent; nil makes none.
	Tracer trace.TracerProvider
	// DropTraceContext removes the client's W3C trace context
	// (traceparent, tracestate) instead of passing it to the servers.
	DropTraceContext bool
	// Fleet is the state shared with other replicas (cluster.redis): the
	// keys' limits and the sessions' homes; nil keeps both in this
	// process.
	Fleet Fleet
}

// New returns a Server forwarding to the backends o.Balancer picks, or an
// error when o.Auth is invalid.
func New(o Options) (*Server, error) {
	cfg, bal, logger := o.Config, o.Balancer, o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, bal: bal, logger: logger, started: time.Now(), picks: newPickLog(), buffers: &sizedPool{},
		accessLog: o.AccessLog, logPrompts: o.LogPrompts, dropTrace: o.DropTraceContext, fleet: o.Fleet,
		sessionHeader: bal.Config().Session.Header, evicts: bal.Config().Admission.EvictAfter > 0}
	if o.Tracer != nil {
		s.tracer = o.Tracer.Tracer("github.com/llmlb/llmlb/proxy")
	}
	reg := o.Registerer
	s.metrics = newMetrics(reg, bal)
	s.authMetrics = newAuthMetrics(reg)
	dialer := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	base := &http.Transport{
		Proxy:                 nil, // backends are reached directly, never through HTTP_PROXY
		DialContext:           dialBodyConn(dialer.DialContext),
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerBackend,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		ExpectContinueTimeout: 0,
		ForceAttemptHTTP2:     false, // model servers speak HTTP/1.1; h2c is not negotiated
		DisableCompression:    true,  // pass Content-Encoding through untouched
	}
	s.base = base
	s.rp = &httputil.ReverseProxy{
		Rewrite: s.rewrite,
		Transport: &retryTransport{base: base, maxAttempts: cfg.MaxAttempts, retryStatuses: cfg.RetryStatuses, retryBroken: cfg.RetryBrokenConnections,
			firstByte: cfg.StreamFirstByteTimeout, idle: cfg.StreamIdleTimeout, continuations: cfg.StreamContinuations, bal: bal, logger: logger, metrics: s.metrics, tracer: s.tracer},
		// 0: ReverseProxy flushes every write of an event stream or a body
		// of unknown length at once (its own rule), and a body of known
		// length once, at its end: with -1 every JSON answer cost a timer
		// goroutine flushing the headers alone, then a second write.
		FlushInterval:  0,
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.errorHandler,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		BufferPool:     newBufferPool(),
	}
	base.TLSClientConfig = o.BackendTLS
	if o.KVEvents != nil {
		s.tok = &tokenizer{store: o.KVEvents, client: &http.Client{Transport: base}}
	}
	if err := s.SetAuth(o.Auth); err != nil {
		return nil, err
	}
	return s, nil
}

// clientRoute is one route of the client listener.
type clientRoute struct {
	method, path string
	handler      func(s *Server) http.HandlerFunc
}

// clientRoutes is the client listener's route table, the one list that
// Handler serves, extra_routes may not name again and docs/http-api.md
// documents. Only inference routes: anything else under /v1/ (LoRA
// loading, for one) could change a server, and reaches one only when an
// operator lists it (issue 17).
func clientRoutes() []clientRoute {
	model := func(k Kind) func(*Server) http.HandlerFunc {
		return func(s *Server) http.HandlerFunc { return s.serveModel(k) }
	}
	stored := func(suffix string) func(*Server) http.HandlerFunc {
		return func(s *Server) http.HandlerFunc { return s.serveStored(suffix) }
	}
	rs := []clientRoute{
		{http.MethodPost, "/v1/completions", model(KindCompletion)},
		{http.MethodPost, "/v1/chat/completions", model(KindChat)},
		{http.MethodPost, "/v1/responses", model(KindResponses)},
		{http.MethodGet, "/v1/responses/{id}", stored("")},
		{http.MethodDelete, "/v1/responses/{id}", stored("")},
		{http.MethodPost, "/v1/responses/{id}/cancel", stored("/cancel")},
		{http.MethodGet, "/v1/responses/{id}/input_items", stored("/input_items")},
		{http.MethodPost, "/v1/messages", model(KindMessages)},
		{http.MethodPost, "/v1/messages/count_tokens", model(KindCountTokens)},
		{http.MethodGet, "/v1/models", func(s *Server) http.HandlerFunc { return s.serveModels }},
	}
	for _, p := range InferenceRoutes() {
		rs = append(rs, clientRoute{http.MethodPost, p, model(KindOther)})
	}
	return append(rs,
		clientRoute{http.MethodGet, "/health", func(*Server) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
			}
		}},
		clientRoute{http.MethodGet, "/ready", func(s *Server) http.HandlerFunc { return s.serveReady }},
	)
}

// Handler returns the client-facing routes.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(s.limits, s.withExchange)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Msg: "Unknown route " + r.Method + " " + r.URL.Path + "."})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &HTTPError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Msg: "Method " + r.Method + " is not allowed on " + r.URL.Path + "."})
	})
	for _, rt := range clientRoutes() {
		r.Method(rt.method, rt.path, rt.handler(s))
	}
	for _, p := range s.cfg.ExtraRoutes {
		r.Post(p, s.serveModel(KindOther))
	}
	return r
}

// serveModel handles a POST whose body names a model, in stages on the
// request's exchange: authorize, parse, admit (the key's models and
// limits), route, tokenize (for a policy that reads KV-cache events),
// pick, forward (under the context eviction may cancel, for a sheddable
// request: [Server.evictable]). Each stage either fills the exchange in
// or ends it with an error; [Server.withExchange] finishes it whatever
// the path. The key is checked before the body is read, so a client
// without one costs no body read, and every refusal of the key's comes
// before a backend is picked.
func (s *Server) serveModel(k Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ex := exchangeFrom(r.Context())
		ex.inference, ex.anthropic = true, k.anthropic()
		if err := s.authorize(ex, r); err != nil {
			s.fail(ex, err)
			return
		}
		if err := s.parse(ex, r, k); err != nil {
			s.fail(ex, err)
			return
		}
		if err := s.admit(ex, r); err != nil {
			s.fail(ex, err)
			return
		}
		breq, err := s.route(ex, r)
		if err != nil {
			s.fail(ex, err)
			return
		}
		s.tokenize(r.Context(), ex, breq)
		if err := s.pick(ex, breq); err != nil {
			s.fail(ex, err)
			return
		}
		r = s.evictable(ex, r)
		if ex.pd != nil {
			s.forwardPD(ex, r)
			return
		}
		s.forward(ex, r)
	}
}

// authorize finds the tenant whose key the request bears; with no keys
// configured there is none, and nothing to check.
func (s *Server) authorize(ex *exchange, r *http.Request) error {
	t, err := s.authenticate(r)
	ex.tenant = t
	return err
}

// admit checks that the key may use the requested model, answering the
// same 404 as for a model that does not exist when it may not, and takes
// the request and its prompt's estimated tokens from the key's limits.
// The limits' state goes to the client in x-ratelimit-* headers whatever
// the outcome. With a fleet, the same round trip to it finds the
// session's home.
func (s *Server) admit(ex *exchange, r *http.Request) error {
	t := ex.tenant
	if t != nil && !t.allows(ex.req.Model) {
		return &unknownModelError{model: ex.req.Model, err: errModelNotAllowed}
	}
	est := ex.req.PromptTokens()
	switch ex.req.Kind {
	case KindOther: // no prompt read, and no usage will be: the body's bytes stand
		est = prefix.Tokens(len(ex.req.Body))
	case KindCountTokens: // counted, not computed: no tokens spent
		est = 0
	}
	if s.fleet != nil {
		if done, err := s.admitFleet(ex, r, t, est); done {
			return err
		}
	}
	if t == nil {
		return nil
	}
	q, err := t.limiter.admit(time.Now(), est)
	q.setHeaders(ex.w.Header())
	if err != nil {
		return err
	}
	ex.admitted = est
	return nil
}

// parse reads and parses the body. On an error after the model was read,
// ex.req still carries the model.
func (s *Server) parse(ex *exchange, r *http.Request, k Kind) error {
	req, err := s.readRequest(ex, r, k)
	ex.req = req
	return err
}

// route resolves the request's model and reads the routing headers.
func (s *Server) route(ex *exchange, r *http.Request) (*balancer.Request, error) {
	breq, dl, err := s.balancerRequest(r, ex.req, ex.tenant)
	if err != nil {
		return nil, err
	}
	breq.Arrived, ex.deadlines = ex.start, dl
	ex.target = breq.Model
	ex.breq = breq
	s.findHome(ex, breq)
	if ex.req.PreviousResponseID != "" {
		if err := s.followResponse(ex, breq); err != nil {
			return nil, err
		}
	}
	return breq, nil
}

// pick asks the balancer for the request's backends, waiting in the
// admission queue when every one is saturated. The guard it creates is
// released by [Server.finish].
func (s *Server) pick(ex *exchange, breq *balancer.Request) error {
	ex.guard = s.bal.NewGuard()
	if ex.req.Stream {
		ex.guard.Stream()
	}
	breq.Guard = ex.guard
	start := time.Now()
	dec, err := s.bal.PickWait(ex.client, breq, make([]*balancer.Backend, 0, 4))
	ex.dec, ex.picked = dec, true
	if s.tracer != nil {
		s.pickSpans(ex, breq, start, err)
	}
	defer s.dropCanonical(ex)
	if dec.Waited > 0 {
		s.metrics.queueWait.Observe(dec.Waited.Seconds())
	}
	if errors.Is(err, balancer.ErrUnknownModel) {
		return &unknownModelError{model: ex.req.Model, err: err}
	}
	if ex.holder != nil && errors.Is(err, balancer.ErrNoBackend) {
		return responseIDError("previous_response_id", ex.req.PreviousResponseID, "is stored by server "+quote(ex.holder.Name)+", which is not available now; try again shortly.", http.StatusServiceUnavailable)
	}
	if err != nil {
		return err
	}
	s.metrics.picks.WithLabelValues(dec.Candidates[0].ID, string(dec.Reason)).Inc()
	s.keepHome(breq, dec)
	return s.planPD(ex, breq) // before the canonical prompt is given back: the prefill pick matches it
}

// forward sends the request to the picked backends through ReverseProxy,
// which retries before the first byte and streams the answer.
func (s *Server) forward(ex *exchange, r *http.Request) {
	req := ex.req
	if ex.target != req.Model {
		body, err := setModel(req.Body, ex.target)
		if err != nil {
			s.fail(ex, badRequest("model", "The request body could not be rewritten for model %s: %v.", quote(ex.target), err))
			return
		}
		req.Body = body
	}
	ex.body.head = req.Body
	if s.cfg.RequestUsage && req.Stream && !req.IncludeUsage && (req.Kind == KindCompletion || req.Kind == KindChat) {
		if body, err := withUsage(req.Body, req.StreamOptions); err == nil {
			ex.body.head, ex.body.tail, ex.stripUsage = body.head, body.tail, true
		}
	}
	if ex.pd != nil {
		if err := ex.pd.apply(&ex.body); err != nil {
			s.fail(ex, badRequest("", "The request body could not be rewritten for the decode leg: %v.", err))
			return
		}
	}
	ex.forwarded = true
	ctx := r.Context()
	if s.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
		defer cancel()
	}
	s.rp.ServeHTTP(ex.w, r.WithContext(ctx))
}

// balancerRequest resolves the request's model (aliases and weighted
// splits) and reads the routing headers into what the picker needs. The
// priority is the model's, or the key's when it sets one; the priority
// header is read without keys configured (t nil) or when the key allows
// it, and ignored otherwise.
func (s *Server) balancerRequest(r *http.Request, req *Request, t *tenant) (*balancer.Request, deadlines, error) {
	target, prio := s.bal.Route(req.Model)
	if t != nil && t.priority != nil {
		prio = *t.priority
	}
	bcfg := s.bal.Config()
	// The deadlines: the header's, trusted as the priority is (from any
	// client without keys, and with keys from those allowed to set a
	// priority), else the key's, else the model's.
	var dl deadlines
	dl.ttft, dl.tpot = s.bal.Deadlines(req.Model)
	if t != nil {
		dl.ttft, dl.tpot = cmp.Or(t.deadlines.ttft, dl.ttft), cmp.Or(t.deadlines.tpot, dl.tpot)
	}
	if trusted := t == nil || t.allowPriorityHeader; trusted {
		if h := r.Header.Get(bcfg.Admission.PriorityHeader); h != "" {
			p, err := strconv.Atoi(strings.TrimSpace(h))
			if err != nil {
				return nil, deadlines{}, badRequest("", "The %s header must be an integer, got %s.", bcfg.Admission.PriorityHeader, quote(h))
			}
			prio = p
		}
		h, err := readDeadlines(r.Header)
		if err != nil {
			return nil, deadlines{}, err
		}
		dl.ttft, dl.tpot = cmp.Or(h.ttft, dl.ttft), cmp.Or(h.tpot, dl.tpot)
	}
	breq := &balancer.Request{
		Model:        target,
		Seed:         prefix.Seed(target, req.CacheSalt),
		PromptTokens: req.PromptTokens(),
		MaxTokens:    req.MaxTokens,
		Priority:     prio,
		TTFTDeadline: dl.ttft,
	}
	c := &req.Canonical
	breq.FirstUser, breq.FirstTurn = c.FirstUser, c.FirstTurn
	switch {
	case req.Kind == KindCountTokens:
		// Counting computes no KV cache: matched against the index, and
		// recorded in it, the prompt would claim a cache nobody holds.
		breq.FirstUser, breq.FirstTurn = 0, 0
	case len(c.Refs) == 0:
		breq.Prompt = c.Glue
	case s.bal.PromptInParts(): // hashed where it lies
		breq.Parts = c
	default: // a policy that reads the prompt's bytes
		breq.Prompt = c.AppendTo(nil)
	}
	if bcfg.Session.Header != "" {
		breq.Session = r.Header.Get(bcfg.Session.Header)
	}
	// The tenant shares the admission queue fairly with the others: the
	// key's name, or without keys the operator's tenant header (which the
	// client sets, so it only separates clients that do not lie).
	switch {
	case t != nil:
		breq.Tenant = "key:" + t.name
	case bcfg.Admission.TenantHeader != "":
		breq.Tenant = r.Header.Get(bcfg.Admission.TenantHeader)
	}
	if req.Kind == KindChat && s.bal.UserKeyed() {
		breq.UserText = prefix.FirstUserText(req.Messages, bcfg.ConsistentHash.PrefixBytes)
	}
	return breq, dl, nil
}

// readRequest reads and parses the body, bounded by MaxBodyBytes, into
// buffers the exchange holds until it is finished.
func (s *Server) readRequest(ex *exchange, r *http.Request, k Kind) (*Request, error) {
	w := ex.w
	if herr := checkContentType(r.Header); herr != nil {
		return nil, herr
	}
	tooLarge := &HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Msg: "The request body is larger than the limit of " + itoa(s.cfg.MaxBodyBytes) + " bytes (proxy.max_body_bytes)."}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, tooLarge
	}
	buf, err := s.buffers.readAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength)
	ex.body.held = newHeldBody(s.buffers, buf)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, tooLarge
		case isTimeout(err):
			w.Header().Set("Connection", "close")
			return nil, &HTTPError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
				Msg: "The request body did not arrive within " + s.cfg.BodyReadTimeout.String() + " (proxy.body_read_timeout).", Err: err}
		}
		return nil, &HTTPError{Status: http.StatusBadRequest, Type: "invalid_request_error", Msg: "The request body could not be read.", Err: err}
	}
	// The body is in: lift the limits middleware's read deadline, which
	// would otherwise end the connection's background read mid-stream.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	body := *buf
	if k != KindOther {
		ex.canon = s.buffers.get(len(body))
	}
	var canon []byte
	if ex.canon != nil {
		canon = *ex.canon
	}
	req, err := parseRequest(k, body, canon)
	if ex.canon != nil && req != nil && cap(req.Canonical.Glue) > cap(*ex.canon) {
		*ex.canon = req.Canonical.Glue // grown: the larger buffer goes back
	}
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
	s.backendHeader(pr.Out.Header, ex)
	pr.SetURL(ex.dec.Candidates[0].URL)
	pr.SetXForwarded()
}

// backendHeader turns h, the client's header, into what a backend is
// sent: no client-supplied x-llmlb-* or forwarding headers, no Expect
// (the body is read and its 100 Continue sent: a backend's own would
// reach the client as a second one), with keys no llmlb key, and the
// trace context only if it is propagated.
func (s *Server) backendHeader(h http.Header, ex *exchange) {
	stripClientHeaders(h)
	h.Del("Expect")
	if ex.tenant != nil {
		h.Del("Authorization") // the client's llmlb key, not the backend's
		h.Del(HeaderAPIKey)
	}
	if s.dropTrace {
		h.Del("Traceparent")
		h.Del("Tracestate")
	}
}

func (s *Server) modifyResponse(resp *http.Response) error {
	ex := exchangeFrom(resp.Request.Context())
	if ex.pd != nil && resp.StatusCode != http.StatusOK {
		if err := ex.pd.decodeFailed(); err != nil {
			return err
		}
	}
	be := ex.guard.Backend()
	stripBackendHeaders(resp.Header, ex.tenant != nil)
	if s.cfg.BackendHeaders {
		resp.Header.Set(HeaderBackend, be.Name)
		resp.Header.Set(HeaderReason, ex.reason())
	}
	edit := s.responseEdit(ex, be)
	generated := resp.StatusCode == http.StatusOK && ex.req.Kind.generates() && !encoded(resp)
	switch {
	case generated && ex.resumer != nil:
		resp.Body = s.streamAnswer(ex, resp.Body, edit, be)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	case edit != nil && !encoded(resp): // compressed bytes are not the text to edit
		resp.Body = newLineRewriter(resp.Body, edit)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	resp.Body = &firstByteBody{ReadCloser: resp.Body, onFirst: func() {
		d := ex.guard.FirstByte(time.Now())
		s.metrics.ttfb.WithLabelValues(be.ID).Observe(d.Seconds())
		if ex.pd != nil {
			s.metrics.pdLegTTFB.WithLabelValues(legDecode).Observe(d.Seconds())
		}
	}}
	return nil
}

// streamAnswer is the stream pipeline of a good streamed answer: src's
// events go to the client whole, rewritten by edit, timed and counted, and
// a stream that breaks is continued on another server or ended with an
// error event in its API's shape.
func (s *Server) streamAnswer(ex *exchange, src io.ReadCloser, edit func(dst, seg []byte) []byte, be *balancer.Backend) io.ReadCloser {
	itl := s.metrics.itl.WithLabelValues(be.ID, ex.req.Model)
	c := ex.resumer
	r := stream.NewReader(src, stream.Options{
		API:           streamAPI(ex.req.Kind),
		Strip:         ex.stripUsage,
		Edit:          edit,
		Now:           time.Now,
		OnGap:         func(d time.Duration) { itl.Observe(d.Seconds()) },
		Resume:        c,
		Continuations: c.t.continuations,
		Uncontinuable: ex.req.Uncontinuable,
		Gone:          c.gone,
		Evicted:       ex.evicted,
		OnBreak:       c.broke,
	})
	ex.obs = r
	return r
}

// responseEdit is how the answer of backend be is edited on its way to
// the client, nil if it is not: the target model's name turned back into
// the client's, and on the Responses routes, every response id tagged
// with be (see respid.go).
func (s *Server) responseEdit(ex *exchange, be *balancer.Backend) func(dst, seg []byte) []byte {
	var model func(dst, seg []byte) []byte
	if ex.target != ex.req.Model {
		model = modelEdit(ex.target, ex.req.Model)
	}
	if ex.req.Kind != KindResponses && ex.req.Kind != KindStored {
		return model
	}
	tag := responseTag(be.ID)
	if model == nil {
		return func(dst, seg []byte) []byte { return tagResponseIDs(dst, seg, tag) }
	}
	var tmp []byte
	return func(dst, seg []byte) []byte {
		tmp = model(tmp[:0], seg)
		return tagResponseIDs(dst, tmp, tag)
	}
}

func (s *Server) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	ex := exchangeFrom(r.Context())
	var pdErr *HTTPError
	if errors.As(context.Cause(r.Context()), &pdErr) { // an SGLang prefill leg failed: its decode leg was aborted
		err = pdErr
	}
	err = ex.evictedErr(err)
	he := s.errorFor(ex.client, err)
	if he.Status != StatusClientClosed { // nobody to answer otherwise; not an error of ours
		if be := ex.guard.Backend(); be != nil && s.cfg.BackendHeaders {
			w.Header().Set(HeaderBackend, be.Name)
			w.Header().Set(HeaderReason, ex.reason())
		}
		if s.logger.Enabled(r.Context(), slog.LevelDebug) {
			s.logger.DebugContext(r.Context(), "forward failed", "model", ex.req.Model, "status", he.Status, "err", err)
		}
	}
	s.fail(ex, he)
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
