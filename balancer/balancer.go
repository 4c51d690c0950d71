package balancer

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoBackend is returned by [Balancer.Pick] when no backend can take the
// request: none serves the model, or none that does is up.
var ErrNoBackend = errors.New("no backend available")

// ErrUnknownModel is returned by [Balancer.Pick] when no backend serves the
// requested model and every backend's model list is known.
var ErrUnknownModel = errors.New("unknown model")

// Spec is what a writer knows about one backend: its identity and what it
// serves. [Balancer.Update] turns specs into snapshot entries.
type Spec struct {
	ID       string
	URL      *url.URL
	Engine   string
	Models   []string // nil: not known yet
	Adapters []Adapter
	State    State
	Reason   string  // why State, for /debug/backends
	Metrics  Metrics // last good reading; zero At before the first
	Stale    bool    // Metrics is too old to trust
}

// Snapshot is an immutable view of every backend. Readers may use it from any
// goroutine without locking.
type Snapshot struct {
	// Backends are sorted by ID.
	Backends []*Backend
	// Built is when the snapshot was published.
	Built time.Time
}

// Balancer publishes snapshots and picks backends. Pick and Snapshot may be
// called concurrently from any goroutine and never block; Update calls are
// serialised by an internal mutex.
type Balancer struct {
	logger *slog.Logger
	now    func() time.Time

	snap atomic.Pointer[Snapshot]

	mu      sync.Mutex          // serialises writers
	ledgers map[string]*Ledger  // guarded by mu; by backend ID, kept while the backend exists
	current map[string]*Backend // guarded by mu; the published backends by ID
}

// New returns a Balancer with an empty snapshot. A nil logger discards.
func New(logger *slog.Logger) *Balancer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	b := &Balancer{
		logger:  logger,
		now:     time.Now,
		ledgers: make(map[string]*Ledger),
		current: make(map[string]*Backend),
	}
	b.snap.Store(&Snapshot{Built: b.now()})
	return b
}

// Snapshot returns the current snapshot. Never nil.
func (b *Balancer) Snapshot() *Snapshot { return b.snap.Load() }

// Update replaces the state of the backends named in specs and publishes a new
// snapshot. Backends not named keep their state. A backend whose state changes
// is logged once.
func (b *Balancer) Update(specs ...Spec) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	for _, s := range specs {
		old := b.current[s.ID]
		l := b.ledgerLocked(s.ID)
		nb := &Backend{
			ID:       s.ID,
			URL:      s.URL,
			Engine:   s.Engine,
			Models:   s.Models,
			Adapters: s.Adapters,
			State:    s.State,
			Reason:   s.Reason,
			Metrics:  s.Metrics,
			Stale:    s.Stale,
			Since:    now,
			Ledger:   l,
		}
		if old != nil && old.State == s.State {
			nb.Since = old.Since
		} else if old == nil || old.State != s.State {
			b.logger.Debug("backend state", "backend", s.ID, "state", s.State.String())
		}
		b.current[s.ID] = nb
	}
	b.publishLocked(now)
}

// Ledger returns the ledger of the backend named id, making it if the
// backend has none yet. The same ledger is used by every snapshot entry of
// that backend until it is removed.
func (b *Balancer) Ledger(id string) *Ledger {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ledgerLocked(id)
}

// ledgerLocked is Ledger for callers that hold b.mu.
func (b *Balancer) ledgerLocked(id string) *Ledger {
	l := b.ledgers[id]
	if l == nil {
		l = new(Ledger)
		b.ledgers[id] = l
	}
	return l
}

// Remove drops backends from the set. Requests already in flight to them keep
// their ledger and finish normally. Callers that want in-flight requests to
// drain first mark the backend [StateDraining] and remove it when its
// in-flight count reaches zero.
func (b *Balancer) Remove(ids ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if _, ok := b.current[id]; ok {
			b.logger.Info("backend removed", "backend", id)
		}
		delete(b.current, id)
		delete(b.ledgers, id)
	}
	b.publishLocked(b.now())
}

// publishLocked builds and swaps in a snapshot of b.current. Caller must hold
// b.mu.
func (b *Balancer) publishLocked(now time.Time) {
	backends := make([]*Backend, 0, len(b.current))
	for _, be := range b.current {
		backends = append(backends, be)
	}
	slices.SortFunc(backends, func(x, y *Backend) int {
		switch {
		case x.ID < y.ID:
			return -1
		case x.ID > y.ID:
			return 1
		}
		return 0
	})
	b.snap.Store(&Snapshot{Backends: backends, Built: now})
}

// Request is what the picker needs to know about one request.
type Request struct {
	// Model is the model name the request asks for.
	Model string
}

// Decision is the outcome of [Balancer.Pick].
type Decision struct {
	// Candidates are the backends to try, best first. Never empty when Pick
	// returns a nil error.
	Candidates []*Backend
	// Reason says why the first candidate was chosen, for the
	// x-llmlb-reason header.
	Reason string
}

// Pick chooses the backends for req from the current snapshot: those that
// serve the model, are ready and have fresh metrics, ordered by fewest
// requests in flight (ties go to the backend that has served fewer requests
// in total, then by ID). When none has fresh metrics, ready backends with
// stale metrics are used ("stale-metrics"); when no backend is ready, those
// in an unknown state are tried ("fallback"), so that a fleet whose health is
// not known yet still serves. Down and draining backends are never picked.
// Pick appends to dst[:0] and returns it in the decision, so a caller that
// reuses dst does not allocate.
func (b *Balancer) Pick(req Request, dst []*Backend) (Decision, error) {
	snap := b.snap.Load()
	cands := dst[:0]
	known := false
	unknownModels := false
	stale := 0
	for _, be := range snap.Backends {
		// A backend that is up, or not probed yet, and whose models are
		// not known may serve the model; one that is down or draining
		// cannot serve it now, so it does not turn a 404 into a 503.
		if !be.ModelsKnown() && (be.State == StateReady || be.State == StateUnknown) {
			unknownModels = true
		}
		if !be.Serves(req.Model) {
			continue
		}
		known = true
		if be.State == StateReady {
			if be.Stale {
				stale++
				continue
			}
			cands = append(cands, be)
		}
	}
	reason := "least-load"
	if len(cands) == 0 && stale > 0 {
		for _, be := range snap.Backends {
			if be.State == StateReady && be.Stale && be.Serves(req.Model) {
				cands = append(cands, be)
			}
		}
		reason = "stale-metrics"
	}
	if len(cands) == 0 {
		for _, be := range snap.Backends {
			if be.State == StateUnknown && be.Serves(req.Model) {
				cands = append(cands, be)
			}
		}
		reason = "fallback"
	}
	if len(cands) == 0 {
		if !known && !unknownModels {
			return Decision{}, fmt.Errorf("model %q: %w", req.Model, ErrUnknownModel)
		}
		return Decision{}, fmt.Errorf("model %q: %w", req.Model, ErrNoBackend)
	}
	slices.SortStableFunc(cands, func(x, y *Backend) int {
		xi, yi := x.Ledger.InFlight(), y.Ledger.InFlight()
		if xi != yi {
			return int(xi - yi)
		}
		xt, yt := x.Ledger.Total(), y.Ledger.Total()
		if xt != yt {
			return int(xt - yt)
		}
		return 0 // stable: snapshot order is by ID
	})
	return Decision{Candidates: cands, Reason: reason}, nil
}
