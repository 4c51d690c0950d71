package proxy

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/proxy/stream"
)

// status is the request's status as counted and logged, decided here and
// nowhere else: what the client was answered, 499 when it left first, and
// for an answer that did not end (ReverseProxy aborted the stream) 429
// when eviction ended it, 504 when the proxy cut a stalled stream, 502
// when the backend cut it.
//
// A stream whose terminator the client was handed is whole even when the
// client left before the server's body ended: clients stop reading at
// `[DONE]`, and their answers are not failures.
func (s *Server) status(ex *exchange) int {
	whole := ex.ended || ex.delivered()
	switch {
	case ex.failure != nil && ex.failure.Status == StatusClientClosed, !whole && ex.client.Err() != nil:
		return StatusClientClosed
	case !whole && ex.evicted(): // ended mid-stream with an error event
		return s.errorFor(ex.client, balancer.ErrEvicted).Status
	case whole && ex.w.status == 0:
		return http.StatusOK // nothing written: net/http answers 200
	case whole:
		return ex.w.status
	case ex.streamErr != nil:
		return s.errorFor(ex.client, ex.streamErr).Status
	default:
		return http.StatusBadGateway
	}
}

// finish releases the exchange's place in the balancer's ledger and
// records the request: metrics and the status page for model routes, the
// access line for all but the health and readiness probes.
func (s *Server) finish(ex *exchange, r *http.Request) {
	ex.endEviction() // first: a request that has ended is not evicted
	s.dropCanonical(ex)
	status := s.status(ex)
	if ex.inference {
		s.account(ex, status)
		s.finishCapture(ex, status)
	}
	if ex.span != nil {
		s.endSpan(ex, status)
	}
	if s.accessLog && r.URL.Path != "/health" && r.URL.Path != "/ready" {
		s.logAccess(ex, r, status)
	}
	// Nothing reads the request's bytes from here on; an attempt's
	// transport still writing them holds the body until it closes it.
	ex.body.held.release()
}

// dropCanonical gives the canonical prompt's buffer back, keeping what
// the later stages read of it. The pick is its only reader: given back
// then, a long prompt's copy is not held for the whole answer.
func (s *Server) dropCanonical(ex *exchange) {
	if ex.canon == nil {
		return
	}
	if ex.req != nil { // nil when the body did not parse
		ex.promptTokens = ex.req.PromptTokens()
		s.sampleCapture(ex)
		if s.logPrompts && s.logger.Enabled(ex.client, slog.LevelDebug) {
			c := ex.req.Canonical.AppendTo(nil)
			ex.prompt = string(c[:min(len(c), maxLoggedPrompt)])
		}
		ex.req.Canonical = prefix.Parts{}
	}
	s.buffers.put(ex.canon)
	ex.canon = nil
}

// account releases the exchange's guard and counts the request.
func (s *Server) account(ex *exchange, status int) {
	backendLabel, backendName := "none", ""
	if ex.forwarded {
		if be := ex.guard.Backend(); be != nil { // read before Release detaches it
			backendLabel, backendName = be.ID, be.Name
		}
	}
	if ex.guard != nil {
		if ex.forwarded && ex.obs != nil {
			if u := ex.obs.Usage(); u.Known {
				ex.guard.Usage(balancer.Usage{PromptTokens: u.Prompt, CachedTokens: u.Cached, CachedKnown: u.CachedKnown})
			}
		}
		ex.guard.Release()
	}
	took := time.Since(ex.start)
	model, target := s.labels(ex)
	if backendLabel == "none" && status != StatusClientClosed { // llmlb answered itself: list it too
		reason := "rejected by llmlb"
		if ex.forwarded {
			reason = "no backend answered"
		}
		s.picks.add(pickEntry{At: time.Now(), ID: ex.id, Model: ex.model(), Backend: "-", Reason: reason, Status: status, Duration: took}, stream.Usage{}, estimates{})
	}
	s.metrics.requests.WithLabelValues(model, target, backendLabel, statusLabel(status)).Inc()
	if backendLabel != "none" {
		s.metrics.duration.WithLabelValues(backendLabel, model).Observe(took.Seconds())
	}
	if ex.forwarded {
		s.observed(ex, backendLabel, backendName, model, status, took)
	}
	s.judgeDeadlines(ex, model)
	if t := ex.tenant; t != nil {
		s.authMetrics.requests.WithLabelValues(t.name, statusLabel(status)).Inc()
		used := ex.admitted // the estimate stands when the backend reported no usage
		if !ex.forwarded {
			used = 0 // refused before any backend had it: the tokens come back
		}
		if ex.usage.Known {
			used = ex.usage.Prompt + ex.usage.Completion
			s.authMetrics.tokens.WithLabelValues(t.name, "prompt").Add(float64(ex.usage.Prompt))
			s.authMetrics.tokens.WithLabelValues(t.name, "completion").Add(float64(ex.usage.Completion))
		}
		switch {
		case ex.admitted == 0 && used == 0:
		case ex.fleetAdmitted:
			rpm, tpm := t.limiter.limits()
			s.fleet.Charge(t.name, rpm, tpm, used-ex.admitted)
		default:
			t.limiter.charge(time.Now(), used-ex.admitted)
		}
	}
}

// model is the model the client asked for, "" before it was read.
func (ex *exchange) model() string {
	if ex.req == nil {
		return ""
	}
	return ex.req.Model
}

// labels are the exchange's model and target_model metric labels: the
// names as routed once the balancer was asked, [unknownModel] for a model
// nobody serves or one not read, and for a request refused before that
// the name when it is known here (see [Server.modelLabel]).
func (s *Server) labels(ex *exchange) (model, target string) {
	switch {
	case ex.req == nil: // refused before its model was read (401, 413, 415, a body that is not JSON)
		return unknownModel, unknownModel
	case ex.failure != nil && errors.Is(ex.failure, balancer.ErrUnknownModel):
		return unknownModel, unknownModel
	case ex.picked:
		return ex.req.Model, ex.target
	}
	m := s.modelLabel(ex.req.Model)
	return m, m
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

// observed records what the stream pipeline or the held answer saw of the
// answering backend's response: time to first token, tokens from usage,
// and the prefix match the balancer predicted against the cache hits the
// backend reported.
func (s *Server) observed(ex *exchange, backend, name, model string, status int, took time.Duration) {
	if backend == "none" || ex.attempts == 0 {
		return
	}
	ex.backend = backend
	var u stream.Usage
	if ex.obs != nil {
		u = ex.obs.Usage()
	}
	ex.usage = u
	// The picks' estimates against what came: TTFT seconds, then cached
	// tokens, predicted and observed, for the metrics and the status page.
	var est estimates
	if !u.FirstToken.IsZero() && ex.req.Stream {
		ex.ttft = u.FirstToken.Sub(ex.sentAt)
		s.metrics.ttft.WithLabelValues(backend, model).Observe(ex.ttft.Seconds())
		// The pick's estimate was of its first candidate, answering alone.
		if ex.dec.TTFT > 0 && ex.attempts == 1 && ex.continuations == 0 && ex.pd == nil {
			est.ttft, est.sums[0], est.sums[1] = true, ex.dec.TTFT, ex.ttft.Seconds()
		}
	}
	// The balancer counts in its own estimate of tokens ([prefix.Tokens]); scale its
	// predicted share of the prompt to the backend's real prompt tokens. A
	// continued stream's usage mixes two servers': it predicts nothing.
	if n := ex.promptTokens; u.Known && u.CachedKnown && n > 0 && ex.continuations == 0 && ex.attempts <= len(ex.dec.Work) {
		w := ex.dec.Work[ex.attempts-1]
		share := float64(max(0, n-w.UncachedTokens)) / float64(n)
		est.cached, est.sums[2], est.sums[3] = true, share*float64(u.Prompt), float64(u.Cached)
	}
	s.picks.add(pickEntry{At: time.Now(), ID: ex.id, Model: model, Backend: backend, BackendName: name, Reason: ex.reason(), Status: status, TTFT: ex.ttft, Duration: took}, u, est)
	if est.ttft {
		s.metrics.ttftPredicted.WithLabelValues(backend).Add(est.sums[0])
		s.metrics.ttftObserved.WithLabelValues(backend).Add(est.sums[1])
	}
	if !u.Known {
		return
	}
	s.metrics.promptTokens.WithLabelValues(backend, model).Add(float64(u.Prompt))
	s.metrics.completionTokens.WithLabelValues(backend, model).Add(float64(u.Completion))
	if !u.CachedKnown {
		return
	}
	s.metrics.cachedTokens.WithLabelValues(backend, model).Add(float64(u.Cached))
	if est.cached {
		s.metrics.predicted.WithLabelValues(backend).Add(est.sums[2])
		s.metrics.reported.WithLabelValues(backend).Add(est.sums[3])
	}
}

// judgeDeadlines counts whether the request met its deadlines, each from
// its arrival as its client sees it: the first token for TTFT, and for
// TPOT the mean time between its tokens after the first. Only a stream's
// tokens are seen as they come.
func (s *Server) judgeDeadlines(ex *exchange, model string) {
	d := ex.deadlines
	if d.ttft == 0 && d.tpot == 0 {
		return
	}
	prio := "zero"
	if ex.breq != nil {
		switch p := ex.breq.Priority; {
		case p < 0:
			prio = "negative"
		case p > 0:
			prio = "positive"
		}
	}
	refused := ex.failure != nil && errors.Is(ex.failure, balancer.ErrDeadline)
	u := ex.usage
	streamed := ex.req != nil && ex.req.Stream && !u.FirstToken.IsZero()
	judge := func(slo string, target, got time.Duration, seen bool) {
		if target == 0 {
			return
		}
		result := "unobserved"
		switch {
		case refused:
			result = "refused"
		case seen && got <= target:
			result = "met"
		case seen:
			result = "missed"
		}
		ex.sloResults = append(ex.sloResults, slo+"="+result)
		s.metrics.slo.WithLabelValues(model, prio, slo, result).Inc()
	}
	judge("ttft", d.ttft, u.FirstToken.Sub(ex.start), streamed)
	var tpot time.Duration
	if streamed && u.Known && u.Completion > 1 && u.LastSeen.After(u.FirstToken) {
		tpot = u.LastSeen.Sub(u.FirstToken) / time.Duration(u.Completion-1)
	}
	judge("tpot", d.tpot, tpot, tpot > 0)
}

// delivered reports whether the exchange's stream handed the client its
// terminator, every write to the client succeeding.
func (ex *exchange) delivered() bool {
	r, ok := ex.obs.(*stream.Reader)
	return ok && r.Delivered() && !ex.w.failed
}
