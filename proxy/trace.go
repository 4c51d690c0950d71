package proxy

import (
	"context"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/tracing"
)

// With a tracer, each request is a span (llmlb.request, continuing the
// client's W3C trace context) with children for its admission wait, its
// pick and each upstream attempt (continuations included); each server
// is told its attempt's span as its parent in traceparent, so that a
// server that traces (vLLM's --otlp-traces-endpoint) hangs its spans
// under it. Where the time to a first token went reads off the tree.

// startSpan starts r's request span under the client's trace context,
// and returns the context that carries it.
func (s *Server) startSpan(ctx context.Context, ex *exchange, r *http.Request) context.Context {
	ctx = tracing.Propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
	ctx, ex.span = s.tracer.Start(ctx, "llmlb.request", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
			attribute.String("llmlb.request_id", ex.id)))
	return ctx
}

// endSpan ends the request span with what the request came to.
func (s *Server) endSpan(ex *exchange, status int) {
	sp := ex.span
	attrs := []attribute.KeyValue{attribute.Int("http.response.status_code", status), attribute.Int("llmlb.attempts", ex.attempts),
		attribute.Int("llmlb.continuations", ex.continuations)}
	if m := ex.model(); m != "" {
		attrs = append(attrs, attribute.String("llmlb.model", m), attribute.String("llmlb.target_model", ex.target), attribute.Bool("llmlb.stream", ex.req.Stream))
	}
	if ex.tenant != nil {
		attrs = append(attrs, attribute.String("llmlb.key", ex.tenant.name))
	}
	if ex.backend != "" {
		attrs = append(attrs, attribute.String("llmlb.backend", ex.backend), attribute.String("llmlb.reason", ex.reason()))
	}
	if u := ex.usage; u.Known {
		attrs = append(attrs, attribute.Int("llmlb.prompt_tokens", u.Prompt), attribute.Int("llmlb.completion_tokens", u.Completion))
		if u.CachedKnown {
			attrs = append(attrs, attribute.Int("llmlb.cached_tokens", u.Cached))
		}
	}
	if ex.ttft > 0 {
		attrs = append(attrs, attribute.Float64("llmlb.ttft_seconds", ex.ttft.Seconds()))
	}
	if d := ex.deadlines; d.ttft > 0 {
		attrs = append(attrs, attribute.Int64("llmlb.slo_ttft_ms", d.ttft.Milliseconds()))
	}
	if d := ex.deadlines; d.tpot > 0 {
		attrs = append(attrs, attribute.Float64("llmlb.slo_tpot_ms", float64(d.tpot)/float64(time.Millisecond)))
	}
	if len(ex.sloResults) > 0 {
		attrs = append(attrs, attribute.String("llmlb.slo", strings.Join(ex.sloResults, ",")))
	}
	sp.SetAttributes(attrs...)
	if status >= 500 {
		sp.SetStatus(codes.Error, http.StatusText(status))
	}
	sp.End()
}

// pickSpans records the pick that began at start: the admission wait, if
// any, then the pick itself, both under the request span.
func (s *Server) pickSpans(ex *exchange, breq *balancer.Request, start time.Time, err error) {
	dec := ex.dec
	at := start
	if dec.Waited > 0 {
		_, w := s.tracer.Start(ex.traced, "llmlb.admission", trace.WithTimestamp(start),
			trace.WithAttributes(attribute.Int("llmlb.priority", breq.Priority), attribute.String("llmlb.tenant", breq.Tenant)))
		at = start.Add(dec.Waited)
		w.End(trace.WithTimestamp(at))
	}
	_, sp := s.tracer.Start(ex.traced, "llmlb.pick", trace.WithTimestamp(at))
	sp.SetAttributes(attribute.String("llmlb.policy", s.bal.Config().Policy), attribute.Int("llmlb.prompt_tokens_estimate", breq.PromptTokens))
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	} else {
		sp.SetAttributes(attribute.String("llmlb.backend", dec.Candidates[0].Name), attribute.String("llmlb.reason", string(dec.Reason)),
			attribute.Int("llmlb.matched_tokens", max(0, breq.PromptTokens-dec.Work[0].UncachedTokens)),
			attribute.Float64("llmlb.estimated_ttft_seconds", dec.TTFT), attribute.Int("llmlb.candidates", len(dec.Candidates)))
	}
	sp.End()
}

// startAttempt starts attempt a's span and tells the server it is its
// parent: out gets its own header, as attempts share the request's.
func (t *retryTransport) startAttempt(a *try, out *http.Request, i int) {
	ctx, sp := t.tracer.Start(a.ctx, "llmlb.attempt", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("llmlb.backend", a.be.Name), attribute.String("server.address", out.URL.Host), attribute.Int("llmlb.attempt", i+1)))
	a.span = sp
	out.Header = out.Header.Clone()
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(out.Header))
}

// endAttempt ends an attempt's span with the status the server answered
// (0: none) or the error that ended it; a nil span is no tracing.
func endAttempt(sp trace.Span, status int, err error) {
	if sp == nil {
		return
	}
	if status > 0 {
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	} else if status >= 500 {
		sp.SetStatus(codes.Error, http.StatusText(status))
	}
	sp.End()
}
