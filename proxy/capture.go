package proxy

import (
	"time"

	"github.com/llmlb/llmlb/capture"
)

// SetCapture makes w the capture that sampled requests are written to
// from their next arrival on; nil stops capturing. Requests already
// sampled finish into the capture they were sampled for. Safe to call
// while serving (a reload does).
func (s *Server) SetCapture(w *capture.Writer) { s.capture.Store(w) }

// captured is a sampled request's capture line, filled in as it goes.
type captured struct {
	w    *capture.Writer
	line capture.Line
}

// sampleCapture decides whether the exchange is captured and, if so,
// hashes its prompt into the line's block ids while the canonical prompt
// is still held (before [Server.dropCanonical] gives it back). Only the
// routes that generate tokens are captured, once routed.
func (s *Server) sampleCapture(ex *exchange) {
	w := s.capture.Load()
	if w == nil || ex.capture != nil || ex.req == nil || ex.breq == nil || !ex.req.Kind.generates() || !w.Sampled() {
		return
	}
	c := &captured{w: w}
	w.Hash(&c.line, &ex.req.Canonical, ex.breq.Seed)
	c.line.Session = w.Key(ex.breq.Session)
	ex.capture = c
}

// finishCapture hands a sampled exchange's line to its capture, once
// [Server.account] has read what the backend reported.
func (s *Server) finishCapture(ex *exchange, status int) {
	c := ex.capture
	if c == nil {
		return
	}
	ex.capture = nil
	l := &c.line
	req := ex.req
	l.Arrived, l.Duration, l.Status = ex.start, time.Since(ex.start), status
	// The names as metrics label them: a model no backend offers is
	// "unknown", so a client's made-up name is not written.
	model, target := s.labels(ex)
	l.Model, l.API, l.Stream, l.MaxTokens = model, captureAPI(req.Kind), req.Stream, req.MaxTokens
	if target != model {
		l.Target = target
	}
	l.Priority = ex.breq.Priority
	l.InputLength = max(1, ex.promptTokens)
	if u := ex.usage; u.Known {
		l.Usage, l.PromptTokens, l.OutputLength = true, u.Prompt, u.Completion
		l.CachedKnown, l.CachedTokens = u.CachedKnown, u.Cached
		if u.Prompt > 0 {
			l.InputLength = u.Prompt
		}
	}
	l.Backend, l.TTFT = ex.backend, ex.ttft
	c.w.Add(*l)
}

// captureAPI names the API of a request kind in a capture line.
func captureAPI(k Kind) string {
	switch k {
	case KindChat:
		return "chat"
	case KindResponses:
		return "responses"
	case KindMessages:
		return "messages"
	}
	return "completions"
}
