package proxy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/tracing"
)

// HeaderPrefillBackend names the server that prefilled a disaggregated
// request (x-llmlb-backend names the one that decoded it); absent when the
// request took no prefill leg.
const HeaderPrefillBackend = "X-Llmlb-Prefill-Backend"

// The decisions of llmlb_pd_requests_total and the legs of
// llmlb_pd_leg_ttfb_seconds.
const (
	pdSplit    = "pd"
	pdLocal    = "local"
	legPrefill = "prefill"
	legDecode  = "decode"
)

// maxPrefillAnswer bounds the prefill leg's JSON answer read for its
// kv_transfer_params: one token and the connector's block ids.
const maxPrefillAnswer = 8 << 20

// errLegDone cancels an SGLang prefill leg still open once its decode leg
// has ended: the KV cache was handed over, or is no longer wanted.
var errLegDone = errors.New("decode leg ended")

// pdPlan is a disaggregated request's prefill leg: the prefill pick and
// the guard that accounts the leg on its backend.
type pdPlan struct {
	dec    balancer.Decision // prefill candidates, best first
	guard  *balancer.Guard   // attached to the prefill backend tried; released when the leg ends
	sglang bool              // SGLang's bootstrap protocol; vLLM's two legs otherwise
	// decodeFields are added to the decode leg's body as it is sent
	// ([pdPlan.apply]), and only there: the client's request, which a
	// stream's continuation resends, stays without them.
	decodeFields []pdField
	// prefill is the ID of the prefill server that answered or, for
	// SGLang, was sent the leg; "" before.
	prefill string

	// SGLang only, set before the legs start: legDone is closed when
	// the prefill leg has ended, and legErr, written before, is the
	// client's answer if it failed; abort ends the prefill leg.
	legDone chan struct{}
	legErr  *HTTPError
	abort   context.CancelCauseFunc
}

// pdFailureGrace is how long a failed SGLang decode leg waits for its
// prefill leg's answer before ending it: a decode server fails a room
// whose prefill failed, often just before the prefill server's own error
// answer arrives, and that answer is the one the client should see.
const pdFailureGrace = time.Second

// pdField is one top-level field a leg's body gets.
type pdField struct {
	key string
	val []byte
}

// apply adds the decode leg's fields to body, the bytes each attempt of
// the decode leg sends.
func (pd *pdPlan) apply(body *sendBody) error {
	if len(pd.decodeFields) == 0 {
		return nil
	}
	b := append(append(make([]byte, 0, body.size()), body.head...), body.tail...)
	b, err := setFields(b, pd.decodeFields)
	if err != nil {
		return err
	}
	body.head, body.tail = b, nil
	return nil
}

// setFields is setField for each of fields in turn.
func setFields(body []byte, fields []pdField) ([]byte, error) {
	var err error
	for _, f := range fields {
		if body, _, err = setField(body, f.key, f.val); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// decodeFailed is called when the decode leg answers other than 200: the
// SGLang prefill leg is no longer wanted, and if it failed, its failure
// is the request's, returned as the error; nil otherwise.
func (pd *pdPlan) decodeFailed() error {
	if !pd.sglang {
		return nil
	}
	t := time.NewTimer(pdFailureGrace)
	select {
	case <-pd.legDone:
	case <-t.C:
	}
	t.Stop()
	pd.abort(errLegDone)
	<-pd.legDone
	if pd.legErr != nil {
		return pd.legErr
	}
	return nil
}

// planPD decides, by [balancer.Balancer.PlanPrefill], whether the picked
// request takes a prefill leg, and if so picks its prefill server into
// ex.pd. Only completions and chats on a fleet with declared roles
// qualify, and no request a stored response pins to its holder. A
// request that must split but cannot fails.
func (s *Server) planPD(ex *exchange, breq *balancer.Request) error {
	k := ex.req.Kind
	if k != KindCompletion && k != KindChat || ex.holder != nil || !s.bal.Snapshot().Disaggregated(breq.Model) {
		return nil
	}
	plan, err := s.bal.PlanPrefill(breq, &ex.dec)
	if err != nil {
		return err
	}
	if plan == nil {
		s.metrics.pdRequests.WithLabelValues(pdLocal).Inc()
		return nil
	}
	s.metrics.pdRequests.WithLabelValues(pdSplit).Inc()
	// The prefill candidates run the decode server's engine.
	ex.pd = &pdPlan{dec: plan.Decision, guard: plan.Guard, sglang: ex.dec.Candidates[0].Engine == "sglang"}
	return nil
}

// forwardPD runs a disaggregated request: its prefill leg, by the
// engine's protocol, then its decode leg through [Server.forward], so
// that streaming, usage, retries and metrics are those of any request.
// The prefill leg's guard is released on every path.
func (s *Server) forwardPD(ex *exchange, r *http.Request) {
	pd := ex.pd
	defer pd.guard.Release()
	body := ex.req.Body
	if ex.target != ex.req.Model {
		b, err := setModel(body, ex.target)
		if err != nil {
			s.fail(ex, badRequest("model", "The request body could not be rewritten for model %s: %v.", quote(ex.target), err))
			return
		}
		body = b
	}
	if pd.sglang {
		s.setPrefillHeader(ex, pd.dec.Candidates[0])
		s.forwardBootstrap(ex, r, body)
		return
	}
	kv, err := s.prefillVLLM(ex, r, body)
	if err == nil {
		s.setPrefillHeader(ex, pd.guard.Backend()) // the one that answered
	}
	pd.guard.Release()
	if err != nil {
		s.fail(ex, err)
		return
	}
	if kv != nil {
		pd.decodeFields = []pdField{{"kv_transfer_params", kv}}
	}
	decodeWork(ex)
	s.forward(ex, r)
}

// decodeWork makes the decode leg's work that of a request prefilled
// elsewhere ([balancer.Work.Prefilled]), for each decode candidate. The
// guard's clock restarts: the decode leg is sent now.
func decodeWork(ex *exchange) {
	for i := range ex.dec.Work {
		ex.dec.Work[i] = ex.dec.Work[i].Prefilled()
	}
	ex.guard.Rework(ex.dec.Work[0], time.Now())
}

// setPrefillHeader records be as the request's prefill server, for the
// access log, and names it to the client, as x-llmlb-backend names the
// decode server.
func (s *Server) setPrefillHeader(ex *exchange, be *balancer.Backend) {
	if be == nil {
		return
	}
	ex.pd.prefill = be.ID
	if s.cfg.BackendHeaders {
		ex.w.Header().Set(HeaderPrefillBackend, be.Name)
	}
}

// vllmPrefillParams are the kv_transfer_params of vLLM's prefill leg: the
// server is to keep the KV cache for a remote decoder (do_remote_decode),
// as vLLM's NixlConnector test proxy sends them
// (vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
// at 030ea52e).
var vllmPrefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// vllmPrefillBody is body made into vLLM's prefill leg: the prefill
// kv_transfer_params, stream false, max_tokens 1 (max_completion_tokens 1
// when the request has it), and none of stream_options, min_tokens and
// min_completion_tokens, which the prefill server does not take.
func vllmPrefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = vllmPrefillParams
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	return json.Marshal(m)
}

// prefillVLLM runs vLLM's prefill leg on the prefill candidates in turn,
// up to proxy.max_attempts, and returns the kv_transfer_params of the
// first that answers 200 (nil if its answer has none: the decoder then
// prefills itself, as vLLM's test proxy lets it). Every candidate failing
// is a 502: nothing has reached the client, and no decode leg was sent.
func (s *Server) prefillVLLM(ex *exchange, r *http.Request, body []byte) (json.RawMessage, error) {
	pd := ex.pd
	pbody, err := vllmPrefillBody(body)
	if err != nil {
		return nil, badRequest("", "The request body could not be rewritten for the prefill leg: %v.", err)
	}
	cands := pd.dec.Candidates[:min(len(pd.dec.Candidates), s.cfg.MaxAttempts)]
	var lastErr error
	for i, be := range cands {
		if i > 0 {
			pd.guard.Attach(be, pd.dec.Work[i], time.Now())
		}
		var answer struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		b, err := s.prefillLeg(r.Context(), ex, r, be, pbody)
		if err == nil {
			if err = json.Unmarshal(b, &answer); err != nil {
				err = fmt.Errorf("prefill answer of %s: %w", be.ID, err)
			}
		}
		if err == nil {
			if isNull(answer.KV) {
				return nil, nil
			}
			return answer.KV, nil
		}
		if r.Context().Err() != nil {
			return nil, err
		}
		if he := refused(err); he != nil {
			return nil, he
		}
		lastErr = err
		s.metrics.retries.WithLabelValues(be.ID).Inc()
	}
	return nil, prefillFailed(lastErr)
}

// prefillFailed is the client's answer to a prefill leg that failed.
func prefillFailed(err error) *HTTPError {
	return &HTTPError{Status: http.StatusBadGateway, Type: "server_error", Code: "prefill_failed",
		Msg: "The prefill server failed the request; try again.", Err: err}
}

// prefillLeg sends body to be as the prefill leg of the client's request
// r, with r's headers as any attempt sends them (X-Request-Id among
// them), and returns the answer's body, bounded. A failure, a connection
// or a status other than 200, is told to passive health.
func (s *Server) prefillLeg(ctx context.Context, ex *exchange, r *http.Request, be *balancer.Backend, body []byte) ([]byte, error) {
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, be.URL.String(), nil)
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	s.backendHeader(out.Header, ex)
	out.Header.Del("Content-Length")
	out.Header.Del("Accept-Encoding") // the answer is read here, not passed on
	out.Header.Set("Content-Type", "application/json")
	out = attemptRequest(ctx, out, be, ex.inURL, sendBody{head: body})
	var span trace.Span
	if s.tracer != nil {
		var sctx context.Context
		sctx, span = s.tracer.Start(ctx, "llmlb.prefill_leg", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("llmlb.backend", be.Name), attribute.String("server.address", out.URL.Host)))
		if !s.dropTrace {
			tracing.Propagator.Inject(sctx, propagation.HeaderCarrier(out.Header))
		}
	}
	sent := time.Now()
	resp, err := s.base.RoundTrip(out)
	if err != nil {
		endAttempt(span, 0, err)
		if ctx.Err() == nil {
			s.bal.Failed(be, balancer.FailConnect)
		}
		return nil, fmt.Errorf("prefill leg to %s: %w", be.ID, err)
	}
	defer resp.Body.Close()
	s.metrics.pdLegTTFB.WithLabelValues(legPrefill).Observe(time.Since(sent).Seconds())
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
	endAttempt(span, resp.StatusCode, err)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = &legStatusError{backend: be.ID, status: resp.StatusCode, body: b}
	}
	switch {
	case err == nil || ctx.Err() != nil:
	case resp.StatusCode == http.StatusTooManyRequests:
		s.bal.Failed(be, balancer.FailOverloaded)
	case resp.StatusCode >= 500:
		s.bal.Failed(be, balancer.FailStatus)
	case resp.StatusCode == http.StatusOK: // the answer broke off
		s.bal.Failed(be, balancer.FailConnect)
	}
	return b, err
}

// refused is the client's answer to a prefill leg the server refused
// with a 4xx other than 429: the request's own fault (a prompt past the
// context length, a bad parameter), which another server would refuse
// too; nil for any other error.
func refused(err error) *HTTPError {
	var se *legStatusError
	if !errors.As(err, &se) || se.status < 400 || se.status >= 500 || se.status == http.StatusTooManyRequests {
		return nil
	}
	var body struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(se.body, &body)
	msg := cmp.Or(body.Error.Message, body.Message, http.StatusText(se.status))
	return &HTTPError{Status: se.status, Type: "invalid_request_error", Msg: "The prefill server refused the request: " + msg, Err: err}
}

// legStatusError is a prefill leg answered with a status other than 200.
type legStatusError struct {
	backend string
	status  int
	body    []byte
}

func (e *legStatusError) Error() string {
	return fmt.Sprintf("prefill leg to %s: status %d: %.200s", e.backend, e.status, e.body)
}

// bootstrapFields are SGLang's bootstrap fields: the prefill server's
// host and bootstrap port, and the room both servers meet in, as SGLang's
// mini load balancer adds them to both legs
// (sgl-project/sglang python/sglang/srt/disaggregation/mini_lb.py at
// 001c2ae0).
func bootstrapFields(prefill *balancer.Backend, room uint64) []pdField {
	host := prefill.URL.Hostname()
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		host = "[" + host + "]"
	}
	hv, _ := json.Marshal(host)
	return []pdField{{"bootstrap_host", hv}, {"bootstrap_port", []byte(strconv.Itoa(prefill.BootstrapPort))}, {"bootstrap_room", strconv.AppendUint(nil, room, 10)}}
}

// forwardBootstrap runs SGLang's protocol: both legs carry the bootstrap
// fields and go at once, the decode leg through [Server.forward]. A
// prefill leg that fails cancels the decode leg's context with the
// client's error as its cause ([Server.errorHandler] answers it), since
// the decode server would wait for KV cache that never comes (the failure
// AIBrix fixed in #2289 and #2746). The decode leg is not retried on
// another server: the room names this pair. The prefill leg is ended and
// waited for before the request finishes. A stream that breaks cannot
// be continued: its continuation carries no bootstrap room, which an
// SGLang decode server refuses.
func (s *Server) forwardBootstrap(ex *exchange, r *http.Request, body []byte) {
	pd := ex.pd
	prefill := pd.dec.Candidates[0]
	room := rand.Uint64() >> 1 // SGLang's rooms are 0..2^63-1
	pd.decodeFields = bootstrapFields(prefill, room)
	pbody, err := setFields(body, pd.decodeFields)
	if err != nil {
		s.fail(ex, badRequest("", "The request body could not be rewritten for disaggregation: %v.", err))
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	pd.legDone, pd.abort = make(chan struct{}), cancel
	go func() {
		defer close(pd.legDone)
		defer pd.guard.Release()
		_, err := s.prefillLeg(ctx, ex, r, prefill, pbody)
		// A prefill server's error answer fails the request even when
		// the decode leg, failed by its room, ended first.
		var se *legStatusError
		if err != nil && (errors.As(err, &se) || !errors.Is(context.Cause(ctx), errLegDone)) && r.Context().Err() == nil {
			pd.legErr = prefillFailed(err)
			cancel(pd.legErr)
		}
	}()
	ex.dec.Candidates = ex.dec.Candidates[:1]
	decodeWork(ex)
	s.forward(ex, r.WithContext(ctx))
	cancel(errLegDone)
	<-pd.legDone
}

// pdRoute is /debug/route's account of the P/D decision, as [Server.planPD]
// would make it.
type pdRoute struct {
	// Decision is pd (a prefill leg on Prefill's first choice, then the
	// decode leg) or local (the decode server alone).
	Decision          string                `json:"decision"`
	UncachedTokens    int                   `json:"uncached_tokens"` // on the decode server chosen
	MinUncachedTokens int                   `json:"min_uncached_tokens"`
	MinUncachedRatio  float64               `json:"min_uncached_ratio,omitempty"`
	Prefill           *balancer.Explanation `json:"prefill,omitempty"` // the prefill pick; absent when local for too few tokens
}

// explainPD is the P/D decision for breq, whose decode pick is decode;
// nil on a fleet without roles.
func (s *Server) explainPD(breq *balancer.Request, decode balancer.Explanation) *pdRoute {
	if len(decode.Chosen) == 0 || !s.bal.Snapshot().Disaggregated(breq.Model) {
		return nil
	}
	cfg := s.bal.Config().PD
	rt := &pdRoute{Decision: pdLocal, MinUncachedTokens: cfg.MinUncachedTokens, MinUncachedRatio: cfg.MinUncachedRatio}
	var pb balancer.Request
	split := false
	for _, bd := range decode.Backends {
		if bd.ID == decode.Chosen[0] && bd.Candidate != nil {
			rt.UncachedTokens, pb = bd.UncachedTokens, breq.PrefillLeg(bd.Backend)
			split, _ = cfg.Split(bd.Backend, bd.UncachedTokens, breq.PromptTokens)
		}
	}
	if !split {
		return rt
	}
	ex := s.bal.Explain(&pb)
	rt.Prefill = &ex
	if len(ex.Chosen) > 0 && ex.Chosen[0] != decode.Chosen[0] {
		rt.Decision = pdSplit
	}
	return rt
}
