package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// HeaderRequestID carries a request's ID: taken from the client when it
// sends a usable one, generated otherwise, passed to the backend and
// returned to the client.
const HeaderRequestID = "X-Request-Id"

// maxRequestID bounds a client's request ID; a longer one is replaced.
const maxRequestID = 128

// requestID returns the client's ID when it is short printable ASCII,
// else a new random one.
func requestID(h string) string {
	ok := h != "" && len(h) <= maxRequestID
	for i := 0; ok && i < len(h); i++ {
		ok = h[i] > ' ' && h[i] < 0x7f
	}
	if ok {
		return h
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxLoggedPrompt bounds the prompt text a debug access line carries.
const maxLoggedPrompt = 2 << 10

// logAccess writes the exchange's one access line, at info.
func (s *Server) logAccess(ex *exchange, r *http.Request, status int) {
	attrs := []slog.Attr{
		slog.String("id", ex.id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.Float64("duration_s", time.Since(ex.start).Seconds()),
	}
	if ex.tenant != nil {
		attrs = append(attrs, slog.String("key", ex.tenant.name)) // the key's name: never the key
	}
	if ex.span != nil && ex.span.SpanContext().HasTraceID() {
		attrs = append(attrs, slog.String("trace_id", ex.span.SpanContext().TraceID().String()))
	}
	if m := ex.model(); m != "" {
		attrs = append(attrs, slog.String("model", m))
		if ex.target != m && ex.target != "" {
			attrs = append(attrs, slog.String("target_model", ex.target))
		}
		attrs = append(attrs, slog.Bool("stream", ex.req.Stream))
	}
	if ex.backend != "" {
		attrs = append(attrs, slog.String("backend", ex.backend), slog.String("reason", ex.reason()), slog.Int("attempts", ex.attempts))
		if ex.continuations > 0 {
			attrs = append(attrs, slog.Int("continuations", ex.continuations))
		}
	}
	if status >= 500 {
		// Why llmlb failed it: a transport error, a timeout, a stream
		// that broke. Errors of 4xx come from the client's own input and
		// are not echoed.
		switch f := ex.failure; {
		case f != nil && f.Err != nil:
			attrs = append(attrs, slog.String("error", f.Err.Error()))
		case ex.streamErr != nil:
			attrs = append(attrs, slog.String("error", ex.streamErr.Error()))
		}
	}
	if ex.evicted() {
		attrs = append(attrs, slog.Bool("evicted", true))
	}
	if ex.pd != nil && ex.pd.prefill != "" {
		attrs = append(attrs, slog.String("prefill_backend", ex.pd.prefill))
	}
	if ex.dec.Waited > 0 {
		attrs = append(attrs, slog.Float64("queued_s", ex.dec.Waited.Seconds()))
	}
	if ex.ttft > 0 {
		attrs = append(attrs, slog.Float64("ttft_s", ex.ttft.Seconds()))
	}
	if d := ex.deadlines; d.ttft > 0 || d.tpot > 0 {
		if d.ttft > 0 {
			attrs = append(attrs, slog.Int64("slo_ttft_ms", d.ttft.Milliseconds()))
		}
		if d.tpot > 0 {
			attrs = append(attrs, slog.Float64("slo_tpot_ms", float64(d.tpot)/float64(time.Millisecond)))
		}
		attrs = append(attrs, slog.String("slo", strings.Join(ex.sloResults, ",")))
	}
	if ex.usage.Known {
		attrs = append(attrs, slog.Int("prompt_tokens", ex.usage.Prompt), slog.Int("completion_tokens", ex.usage.Completion))
		if ex.usage.CachedKnown {
			attrs = append(attrs, slog.Int("cached_tokens", ex.usage.Cached))
		}
	}
	if s.logPrompts && ex.target != "" && s.logger.Enabled(r.Context(), slog.LevelDebug) {
		attrs = append(attrs, slog.String("prompt", ex.prompt))
	}
	s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}
