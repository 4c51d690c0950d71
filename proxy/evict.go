package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/llmlb/llmlb/balancer"
)

// eviction is a sheddable request's registration with the balancer's
// eviction (balancer.admission.evict_after): a request of higher priority
// that waited too long may end it. The balancer calls evict from the
// waiting request's goroutine; the rest of the exchange reads fired.
type eviction struct {
	// immutable after [Server.evictable]
	cancel context.CancelCauseFunc // the context every leg and attempt of the request runs under
	done   func()                  // deregisters the request
	count  func()                  // counts the eviction (llmlb_evictions_total)

	fired atomic.Bool // set before cancel, so whoever sees the context end sees it
}

// evict ends the request: its backend request (and any continuation or
// prefill leg) is cancelled with [balancer.ErrEvicted] as the cause, and
// the handler's goroutine answers the client in its API's shape, an
// error event mid-stream ([stream.Options.Evicted]) or a 429 before
// anything was sent ([Server.fail]). It does not block.
func (e *eviction) evict() {
	e.fired.Store(true)
	e.count()
	e.cancel(balancer.ErrEvicted)
}

// evictable registers ex, a sheddable request just picked, for eviction
// when it is on, and returns r with the context eviction cancels: the
// prefill leg, the attempts and a stream's continuations all run under
// it. [Server.finish] deregisters it. Other requests are returned as
// they are.
func (s *Server) evictable(ex *exchange, r *http.Request) *http.Request {
	if !s.evicts || ex.breq.Priority >= 0 {
		return r
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	ev := &eviction{cancel: cancel}
	model, g := ex.req.Model, ex.guard
	ev.count = func() {
		backend := "none"
		if be := g.Backend(); be != nil { // a Guard is safe for concurrent use
			backend = be.ID
		}
		s.metrics.evictions.WithLabelValues(model, backend).Inc()
	}
	ev.done = s.bal.Evictable(ex.breq, ev.evict)
	ex.evict = ev
	return r.WithContext(ctx)
}

// evicted reports whether the exchange was ended by eviction. Safe from
// any goroutine.
func (ex *exchange) evicted() bool {
	return ex.evict != nil && ex.evict.fired.Load()
}

// endEviction deregisters the exchange from eviction, if it was
// registered: it has ended.
func (ex *exchange) endEviction() {
	if ev := ex.evict; ev != nil {
		ev.done()
		ev.cancel(nil)
	}
}

// evictedErr is err as the failure of an evicted exchange, so that
// [Server.errorFor] answers the eviction; err itself otherwise.
func (ex *exchange) evictedErr(err error) error {
	if !ex.evicted() || errors.Is(err, balancer.ErrEvicted) {
		return err
	}
	return fmt.Errorf("%w: %w", balancer.ErrEvicted, err)
}
