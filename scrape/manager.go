package scrape

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
)

// Setup is what [NewManager] needs.
type Setup struct {
	Config   Config
	Backends []BackendConfig
	Engines  EngineSet
	// DefaultEngine is the engine of backends that name none; "" is
	// [Auto].
	DefaultEngine string
	Balancer      *balancer.Balancer
	// Registerer takes scrape's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger nil discards.
	Logger *slog.Logger
	// Client is used for every probe and scrape; nil means a client that
	// never goes through an HTTP proxy.
	Client *http.Client
	// TLS verifies HTTPS backends, and gives the client certificate they
	// may ask for, when Client is nil; nil means the system roots.
	TLS *tls.Config
	// Resolver answers DNS discovery; nil means net.DefaultResolver.
	Resolver Resolver
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// KVEvents takes the backends' KV-cache events when
	// Config.KVEvents names where they are published; nil takes none.
	KVEvents *kvevents.Store
}

// deps are what every target shares.
type deps struct {
	client  *http.Client
	bal     *balancer.Balancer
	logger  *slog.Logger
	metrics *metrics
	now     func() time.Time
	kv      *kvevents.Store // nil: no KV-event subscriptions
}

// Manager runs discovery and one [Target] per backend. Static backends are
// published to the balancer at once in [balancer.StateUnknown], so requests
// can be routed before the first probe answers; discovered backends are
// published only after their first probe and scrape. A backend that leaves
// discovery is drained: marked [balancer.StateDraining], then removed once
// its requests in flight have finished.
type Manager struct {
	// immutable after NewManager
	cfg      Config
	deps     deps
	resolver Resolver

	mu        sync.Mutex
	running   map[string]*member // guarded by mu; by backend ID
	groups    []*group           // guarded by mu; the `backends:` entries in force
	nextGroup int                // guarded by mu
	runCtx    context.Context    // guarded by mu; set by Run
	started   chan struct{}      // closed once Run has set runCtx
	loops     sync.WaitGroup     // discovery loops
}

// group is one `backends:` entry.
type group struct {
	index    int // unique over the manager's life, so a reload never reuses one
	bc       BackendConfig
	declared string             // the engine name in force, Auto to detect
	engine   *Engine            // the declared row; nil for Auto
	engines  EngineSet          // every row, for detection
	static   *url.URL           // nil for dns and srv entries
	cancel   context.CancelFunc // stops its discovery loop; nil for static
}

// member is one backend the manager runs, and the group that found it.
type member struct {
	group    int
	target   *Target
	cancel   context.CancelFunc
	done     chan struct{}
	draining bool
}

// NewManager checks the setup and publishes the static backends.
func NewManager(s Setup) (*Manager, error) {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Client == nil {
		s.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, TLSClientConfig: s.TLS}}
	}
	if s.Resolver == nil {
		s.Resolver = net.DefaultResolver
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Engines == nil {
		set, err := NewEngineSet(nil)
		if err != nil {
			return nil, err
		}
		s.Engines = set
	}
	m := &Manager{
		cfg:      s.Config,
		resolver: s.Resolver,
		running:  map[string]*member{},
		started:  make(chan struct{}),
		deps: deps{
			client:  s.Client,
			bal:     s.Balancer,
			logger:  s.Logger,
			metrics: newMetrics(s.Registerer, s.Balancer, s.Now),
			now:     s.Now,
			kv:      s.KVEvents,
		},
	}
	groups, err := m.buildGroups(s.Backends, s.Engines, s.DefaultEngine)
	if err != nil {
		return nil, err
	}
	var specs []balancer.Spec
	for _, g := range groups {
		g.index = m.nextGroup
		m.nextGroup++
		if g.static != nil {
			t := newTarget(m.cfg, g.bc.URL, g.static, g, m.deps)
			m.running[g.bc.URL] = &member{group: g.index, target: t}
			specs = append(specs, t.specs()...)
		}
	}
	m.groups = groups
	s.Balancer.Update(specs...)
	return m, nil
}

// buildGroups checks backends against the engines and returns one group
// each, without starting anything.
func (m *Manager) buildGroups(backends []BackendConfig, engines EngineSet, defaultEngine string) ([]*group, error) {
	var groups []*group
	for i, bc := range backends {
		name := bc.Engine
		if name == "" {
			name = defaultEngine
		}
		if name == "" {
			name = Auto
		}
		e := engines[name]
		if e == nil && name != Auto {
			return nil, fmt.Errorf("backends[%d].engine: unknown engine %q", i, name)
		}
		g := &group{bc: bc, declared: name, engine: e, engines: engines}
		if bc.URL != "" {
			u, err := url.Parse(bc.URL)
			if err != nil {
				return nil, fmt.Errorf("backends[%d].url: %w", i, err)
			}
			g.static = u
		}
		groups = append(groups, g)
	}
	return groups, nil
}

// Reload makes backends the `backends:` entries in force, with engines
// for their rows. Entries that did not change (same settings, same engine
// row) keep running untouched, their backends and requests in flight
// with them. Backends of entries that went away are drained: no new
// requests, removed once their requests in flight finish. New entries
// start as at startup: static backends are published at once, discovered
// ones after their first probe. A static backend whose entry changed
// (say its engine) is restarted under the same ID, keeping its in-flight
// ledger. An error changes nothing. Reload must follow Run.
func (m *Manager) Reload(backends []BackendConfig, engines EngineSet, defaultEngine string) error {
	next, err := m.buildGroups(backends, engines, defaultEngine)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runCtx == nil {
		return errors.New("scrape: Reload before Run")
	}
	kept := map[*group]bool{}
	for i, g := range next {
		for _, old := range m.groups {
			if !kept[old] && sameGroup(old, g) {
				next[i] = old
				kept[old] = true
				break
			}
		}
	}
	live := map[int]bool{}
	newStatic := map[string]bool{}
	for _, g := range next {
		if !kept[g] {
			g.index = m.nextGroup
			m.nextGroup++
			if g.static != nil {
				newStatic[g.bc.URL] = true
			}
		}
		live[g.index] = true
	}
	for _, old := range m.groups {
		if !kept[old] && old.cancel != nil {
			old.cancel()
		}
	}
	m.groups = next
	stopping := map[string]<-chan struct{}{} // IDs restarted below: the old watcher's end
	for id, mb := range m.running {
		if live[mb.group] || mb.draining {
			continue
		}
		if newStatic[id] { // restarted below under the same ID
			mb.cancel()
			stopping[id] = mb.done
			delete(m.running, id)
			continue
		}
		m.drainLocked(m.runCtx, id, mb, reasonLeftConfig)
	}
	for _, g := range next {
		switch {
		case kept[g]:
		case g.static == nil:
			m.startGroupLocked(g)
		default:
			id := g.bc.URL
			after := stopping[id]
			if old := m.running[id]; old != nil {
				if !old.draining {
					continue // a kept entry serves it already
				}
				old.cancel() // came back while draining: stop the drain
				after = old.done
			}
			t := newTarget(m.cfg, id, g.static, g, m.deps)
			mb := &member{group: g.index, target: t}
			m.running[id] = mb
			if after == nil {
				m.deps.bal.Update(t.specs()...)
			}
			m.startLocked(m.runCtx, mb, after, after != nil)
		}
	}
	return nil
}

// Started is closed once Run is under way and Reload may be called.
func (m *Manager) Started() <-chan struct{} { return m.started }

// sameGroup reports whether two entries would watch the same backends the
// same way.
func sameGroup(a, b *group) bool {
	return reflect.DeepEqual(a.bc, b.bc) && a.declared == b.declared && reflect.DeepEqual(a.engines, b.engines)
}

// startGroupLocked runs g's discovery loop. Caller must hold m.mu.
func (m *Manager) startGroupLocked(g *group) {
	ctx, cancel := context.WithCancel(m.runCtx)
	g.cancel = cancel
	m.loops.Go(func() { m.discover(ctx, g) })
}

// Run watches every backend until ctx ends, then waits for every loop to
// stop. It returns nil.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.runCtx = ctx
	close(m.started)
	for _, mb := range m.running {
		m.startLocked(ctx, mb, nil, false)
	}
	for _, g := range m.groups {
		if g.static == nil {
			m.startGroupLocked(g)
		}
	}
	m.mu.Unlock()
	<-ctx.Done()
	m.loops.Wait()
	m.mu.Lock()
	dones := make([]chan struct{}, 0, len(m.running))
	for _, mb := range m.running {
		if mb.done != nil {
			dones = append(dones, mb.done)
		}
	}
	m.mu.Unlock()
	for _, d := range dones {
		<-d
	}
	return nil
}

// startLocked runs mb's target in its own goroutine. When after is not
// nil the target first waits for it to close (the watcher it replaces has
// stopped), then publishes its spec if publish says so, so two watchers
// of one backend never overlap and no one waits while holding m.mu.
// Caller must hold m.mu.
func (m *Manager) startLocked(ctx context.Context, mb *member, after <-chan struct{}, publish bool) {
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	mb.cancel, mb.done = cancel, done
	go func() {
		defer close(done)
		if after != nil {
			select {
			case <-after:
			case <-tctx.Done():
				return
			}
		}
		if publish {
			m.deps.bal.Update(mb.target.specs()...)
		}
		mb.target.Run(tctx)
	}()
}

// reconcile makes g's running backends the set urls: new ones are started
// (and published after their first probe), vanished ones drained.
func (m *Manager) reconcile(ctx context.Context, g *group, urls []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ctx.Err() != nil {
		return // a reload retired g while it looked up its name
	}
	for _, id := range urls {
		mb := m.running[id]
		if mb != nil && mb.group != g.index {
			continue // another entry found it first
		}
		if mb != nil && !mb.draining {
			continue
		}
		var after <-chan struct{}
		if mb != nil { // came back while draining: stop the drain, watch it again
			mb.cancel()
			after = mb.done
		}
		u, err := url.Parse(id)
		if err != nil {
			continue
		}
		t := newTarget(m.cfg, id, u, g, m.deps)
		nm := &member{group: g.index, target: t}
		m.running[id] = nm
		m.startLocked(ctx, nm, after, false)
		m.deps.logger.Info("backend discovered", "backend", id, "name", g.bc.DNS+g.bc.SRV)
	}
	for id, mb := range m.running {
		if mb.group != g.index || mb.draining || slices.Contains(urls, id) {
			continue
		}
		m.drainLocked(ctx, id, mb, reasonLeftDiscovery)
	}
}

// Why a backend drains, as /debug/backends gives its reason.
const (
	// reasonLeftDiscovery: its DNS or SRV name no longer gives it.
	reasonLeftDiscovery = "left discovery"
	// reasonLeftConfig: a reload dropped its `backends:` entry, a url: or
	// the dns: or srv: entry that found it.
	reasonLeftConfig = "left the config"
)

// drainLocked stops watching a backend that left discovery or the config
// (reason says which), marks it draining so it takes no new requests, and
// removes it once its requests in flight are done; the balancer logs the
// removal. It waits for nothing itself: the drain runs in a goroutine of
// its own, once the backend's watcher has stopped. Caller must hold m.mu.
func (m *Manager) drainLocked(ctx context.Context, id string, mb *member, reason string) {
	mb.cancel()
	watcher := mb.done
	mb.draining = true
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	mb.cancel, mb.done = cancel, done
	go func() {
		defer close(done)
		select {
		case <-watcher: // it stops promptly once cancelled
		case <-dctx.Done():
			<-watcher
			return
		}
		if dctx.Err() != nil {
			return // it came back before the drain began
		}
		specs := mb.target.specs() // the watcher, their only writer, has stopped
		ids := make([]string, len(specs))
		ledgers := make([]*balancer.Ledger, len(specs))
		for i := range specs {
			specs[i].State, specs[i].Reason = balancer.StateDraining, reason
			ids[i], ledgers[i] = specs[i].ID, m.deps.bal.Ledger(specs[i].ID)
		}
		m.deps.bal.Update(specs...)
		inFlight := func() int64 {
			var n int64
			for _, l := range ledgers {
				n += l.InFlight()
			}
			return n
		}
		m.deps.logger.Info("backend draining", "backend", id, "in_flight", inFlight())
		for inFlight() > 0 {
			select {
			case <-dctx.Done():
				return
			case <-time.After(m.cfg.Interval):
			}
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.running[id] == mb && dctx.Err() == nil {
			delete(m.running, id)
			m.deps.bal.Remove(ids...) // which logs "backend removed" for each
		}
	}()
}
