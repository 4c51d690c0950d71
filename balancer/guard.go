package balancer

import (
	"sync"
	"time"
)

// Guard accounts one request in the in-flight ledger. The proxy makes one
// Guard per request, attaches it to each backend it tries in turn, and
// releases it when the request ends, whatever the path: success, upstream
// error, retry, client gone, timeout or panic. Release is idempotent, so a
// deferred Release is always safe. A Guard is safe for concurrent use.
type Guard struct {
	mu       sync.Mutex
	backend  *Backend  // guarded by mu; nil when not attached
	attached time.Time // guarded by mu
}

// NewGuard returns a guard attached to no backend.
func NewGuard() *Guard { return new(Guard) }

// Attach moves the request onto be: it releases the backend the guard held, if
// any, and counts the request in be's ledger.
func (g *Guard) Attach(be *Backend, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
	be.Ledger.inFlight.Add(1)
	be.Ledger.total.Add(1)
	g.backend = be
	g.attached = now
}

// Backend returns the backend the guard is attached to, or nil.
func (g *Guard) Backend() *Backend {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.backend
}

// FirstByte records that the attached backend's response began at now,
// feeding its time-to-first-byte estimate. It returns the time since Attach.
func (g *Guard) FirstByte(now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.backend == nil {
		return 0
	}
	d := now.Sub(g.attached)
	g.backend.Ledger.ObserveTTFB(d)
	return d
}

// Release ends the request's accounting. Calling it again does nothing.
func (g *Guard) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
}

// releaseLocked drops the request from its backend's ledger. Caller must hold
// g.mu.
func (g *Guard) releaseLocked() {
	if g.backend != nil {
		g.backend.Ledger.inFlight.Add(-1)
		g.backend = nil
	}
}
