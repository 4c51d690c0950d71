package scrape

import (
	"cmp"
	"context"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
)

// Target watches one backend: its health (active probes, and the probes
// that readmit a backend passive health ejected: the balancer decides
// ejections, as Caddy's passive health does at selection), its metrics
// page and, unless configured, its models. It publishes the backend's state to the balancer after every
// change. Its fields are owned by its Run goroutine.
type Target struct {
	// immutable after newTarget
	cfg         Config
	client      *http.Client
	bal         *balancer.Balancer
	logger      *slog.Logger
	metrics     *metrics
	engines     EngineSet // the rows detection chooses from
	declared    string    // the engine config names; Auto to detect it
	healthPath  string
	metricsPath string // the backend's own metrics_path; "" uses the engine's
	scrapeOff   bool   // metrics_path: none
	configured  bool   // models come from config, not /v1/models
	now         func() time.Time
	kv          *kvevents.Store // nil: no KV-event subscription
	kvEndpoint  string          // where the backend publishes them; "" none
	kvReplay    string

	fixedRanks   []int // the configured data-parallel ranks; nil: detect them
	ranks        []int // the ranks published, sorted; nil: the server is one backend
	rankMetrics  map[int]balancer.Metrics
	ledgers      map[string]*balancer.Ledger // by published ID
	kvSubs       map[string]func()           // KV-event subscriptions by published ID; their stop funcs
	swept        bool                        // publish has removed what an earlier watcher left
	engine       *Engine                     // the row the page is read with; nil until detected
	metricsURL   string                      // engine's page; empty: scraping off
	spec         balancer.Spec
	failures     int       // consecutive failed health probes
	modelsAt     time.Time // last successful /v1/models
	modelsFailed bool      // the last /v1/models failed (for logging transitions)
	owners       []string  // owned_by values of the last /v1/models
	lastGood     time.Time // last readable metrics page
	scrapeErr    string    // the last scrape's error, "" after a good one
	missing      []string  // signals reported missing, sorted
	detectedAt   time.Time // the last detection attempt
	mismatch     string    // the engine the page shows when it contradicts declared
	undetected   bool      // logged that no engine could be detected
}

func newTarget(cfg Config, id string, u *url.URL, g *group, d deps) *Target {
	bc := g.bc
	hp := bc.HealthPath
	if hp == "" {
		hp = cfg.HealthPath
	}
	t := &Target{
		cfg:         cfg,
		client:      d.client,
		bal:         d.bal,
		logger:      d.logger,
		metrics:     d.metrics,
		engines:     g.engines,
		declared:    g.declared,
		healthPath:  hp,
		metricsPath: bc.MetricsPath,
		scrapeOff:   bc.MetricsPath == "none",
		configured:  len(bc.Models) > 0,
		now:         d.now,
		kv:          d.kv,
		fixedRanks:  rankRange(bc.DataParallelStartRank, bc.DataParallelSize),
		ledgers:     map[string]*balancer.Ledger{},
		kvSubs:      map[string]func(){},
		spec: balancer.Spec{
			ID:     id,
			Name:   bc.Name,
			URL:    u,
			Engine: Auto,
			State:  balancer.StateUnknown,
			Labels: maps.Clone(bc.Labels),
		},
	}
	t.spec.Role, _ = balancer.ParseRole(bc.Role) // checked by ValidateBackends
	if t.spec.Role != balancer.RoleDecode {
		t.spec.BootstrapPort = cmp.Or(bc.BootstrapPort, DefaultBootstrapPort)
	}
	if t.metricsPath == "none" {
		t.metricsPath = ""
	}
	t.ranks = t.fixedRanks
	if d.kv != nil {
		ev, rp := cfg.KVEvents, cfg.KVEventsReplay
		if bc.KVEvents != "" {
			ev, rp = bc.KVEvents, bc.KVEventsReplay
		}
		t.kvEndpoint, t.kvReplay = KVEventsEndpoint(ev, u), KVEventsEndpoint(rp, u)
	}
	if g.engine != nil {
		t.setEngine(g.engine)
	}
	if !t.scrapeOff && (t.engine == nil || t.metricsURL != "") {
		t.spec.Stale = true // until the first reading
	}
	if t.configured {
		t.spec.Models = slices.Clone(bc.Models)
	}
	return t
}

// setEngine makes e the row the backend's page is read with.
func (t *Target) setEngine(e *Engine) {
	t.engine = e
	t.spec.Engine = e.Name
	mp := e.MetricsPath
	if t.metricsPath != "" {
		mp = t.metricsPath
	}
	t.metricsURL = ""
	if mp != "" && !t.scrapeOff {
		t.metricsURL = t.spec.URL.JoinPath(mp).String()
	}
}

// offset spreads targets over the interval by a hash of their URL, as
// Prometheus spreads scrapes, so probes do not all fire at once.
func (t *Target) offset(interval time.Duration) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(t.spec.ID))
	return time.Duration(h.Sum64() % uint64(interval))
}

// jitter returns the scrape interval shifted by up to 10% either way.
func (t *Target) jitter() time.Duration {
	d := t.cfg.Interval
	return d - d/10 + time.Duration(rand.Int64N(int64(d/5)+1))
}

// Run probes and scrapes the backend at once, publishes what it found,
// then keeps probing every health interval and scraping every (jittered)
// scrape interval until ctx ends.
func (t *Target) Run(ctx context.Context) {
	defer t.clearMismatch() // a reload restarts a changed backend under the same ID
	defer t.stopKVEvents()
	t.probeRound(ctx)
	t.scrape(ctx)
	if ctx.Err() != nil {
		return
	}
	t.publish()
	t.syncKVEvents(ctx)
	health := time.NewTimer(t.offset(t.cfg.HealthInterval))
	defer health.Stop()
	scrape := time.NewTimer(t.jitter())
	defer scrape.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-health.C:
			health.Reset(t.cfg.HealthInterval)
			t.probeRound(ctx)
		case <-scrape.C:
			scrape.Reset(t.jitter())
			t.scrape(ctx)
			t.readmit(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		t.publish()
		t.syncKVEvents(ctx)
	}
}

// publish hands the backend's state to the balancer: one spec, or one
// per data-parallel rank. The first time, it also removes what an earlier
// watcher of the same server published and this one does not (a reload
// that changed data_parallel_size), since no one else would.
func (t *Target) publish() {
	specs := t.specs()
	t.bal.Update(specs...)
	if t.swept {
		return
	}
	t.swept = true
	var gone []string
	for _, be := range t.bal.Snapshot().Backends {
		if balancer.RankServer(be.ID) == t.spec.ID && !slices.ContainsFunc(specs, func(s balancer.Spec) bool { return s.ID == be.ID }) {
			gone = append(gone, be.ID)
		}
	}
	if len(gone) > 0 {
		t.bal.Remove(gone...)
	}
}

// followKVEvents subscribes the published backend id to the KV-cache
// events published at endpoint (replay its replay socket) for as long as
// ctx lasts; the returned func ends the subscription, waits for it and
// forgets what it learned, since a backend watched again (a reload, a
// rediscovery) starts from nothing.
func (t *Target) followKVEvents(ctx context.Context, id, endpoint, replay string) (stop func()) {
	sub := &kvevents.Subscriber{
		ID:       id,
		Endpoint: endpoint,
		Replay:   replay,
		Topic:    t.cfg.KVEventsTopic,
		Store:    t.kv,
		Log:      t.logger.With("backend", id),
		OnBatch: func(int64, int) {
			t.metrics.kvBatches.WithLabelValues(id).Inc()
			t.metrics.kvBlocks.WithLabelValues(id).Set(float64(t.kv.Stats(id).Blocks))
		},
		OnReset: func(reason string) { t.metrics.kvResets.WithLabelValues(id, reason).Inc() },
	}
	// Said once, since a subscription that never connects is silent: no
	// batches (llmlb_kv_event_batches_total) is how it shows.
	t.logger.Info("kv events: subscribing", "backend", id, "endpoint", sub.Endpoint, "replay", sub.Replay)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sub.Run(ctx); err != nil && ctx.Err() == nil {
			t.logger.Warn("kv events: subscription ended", "backend", id, "err", err)
		}
	}()
	return func() {
		cancel()
		<-done
		t.kv.Forget(id)
		t.metrics.kvBlocks.DeleteLabelValues(id)
	}
}
