package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"
)

// HeaderRequestID carries a request's ID: taken from the client when it
// sends a usable one, generated otherwise, passed to the backend and
// returned to the client.
const HeaderRequestID = "X-Request-Id"

// maxRequestID bounds a client's request ID; a longer one is replaced.
const maxRequestID = 128

// access is what one request's access line says. The handlers that know a
// field fill it in; the access middleware writes the line once the handler
// has returned, whatever path it took.
type access struct {
	id             string
	model, target  string
	backend        string
	reason         string
	status         int // 0: what the response writer saw
	stream         bool
	attempts       int
	waited         time.Duration
	ttft           time.Duration // streams: to the first token event; 0 if none
	usage          Usage
	promptForDebug []byte // the prompt's canonical text, kept only when prompts are logged
}

type accessKey struct{}

func accessFrom(ctx context.Context) *access {
	a, _ := ctx.Value(accessKey{}).(*access)
	if a == nil {
		return new(access) // a handler called without the middleware: written nowhere
	}
	return a
}

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

// withAccess gives every request an ID and, for every route but the health
// and readiness probes, writes exactly one access line when it ends.
func (s *Server) withAccess(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestID(r.Header.Get(HeaderRequestID))
		r.Header.Set(HeaderRequestID, id) // forwarded to the backend with the other headers
		w.Header().Set(HeaderRequestID, id)
		if r.URL.Path == "/health" || r.URL.Path == "/ready" || !s.accessLog {
			next.ServeHTTP(w, r)
			return
		}
		a := &access{id: id}
		rec := &statusRecorder{ResponseWriter: w}
		start := time.Now()
		defer func() {
			status := a.status
			if status == 0 {
				status = rec.status
			}
			if status == 0 {
				status = http.StatusInternalServerError // a panic before any answer
			}
			attrs := []slog.Attr{
				slog.String("id", id),
				slog.String("method", r.Method),
				slog.String("path", r.URL.Path),
				slog.Int("status", status),
				slog.Float64("duration_s", time.Since(start).Seconds()),
			}
			if a.model != "" {
				attrs = append(attrs, slog.String("model", a.model))
				if a.target != a.model && a.target != "" {
					attrs = append(attrs, slog.String("target_model", a.target))
				}
				attrs = append(attrs, slog.Bool("stream", a.stream))
			}
			if a.backend != "" {
				attrs = append(attrs, slog.String("backend", a.backend), slog.String("reason", a.reason), slog.Int("attempts", a.attempts))
			}
			if a.waited > 0 {
				attrs = append(attrs, slog.Float64("queued_s", a.waited.Seconds()))
			}
			if a.ttft > 0 {
				attrs = append(attrs, slog.Float64("ttft_s", a.ttft.Seconds()))
			}
			if a.usage.Known {
				attrs = append(attrs, slog.Int("prompt_tokens", a.usage.Prompt), slog.Int("completion_tokens", a.usage.Completion))
				if a.usage.CachedKnown {
					attrs = append(attrs, slog.Int("cached_tokens", a.usage.Cached))
				}
			}
			if a.promptForDebug != nil {
				attrs = append(attrs, slog.String("prompt", string(a.promptForDebug)))
			}
			s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
		}()
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), accessKey{}, a)))
	})
}
