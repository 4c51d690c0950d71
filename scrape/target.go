package scrape

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
)

// maxPageBytes bounds a metrics page. Real pages are tens to hundreds of
// KiB; a larger one is treated as unreadable.
const maxPageBytes = 32 << 20

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

	engine       *Engine // the row the page is read with; nil until detected
	metricsURL   string  // engine's page; empty: scraping off
	spec         balancer.Spec
	ledger       *balancer.Ledger
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
		spec: balancer.Spec{
			ID:     id,
			Name:   bc.Name,
			URL:    u,
			Engine: Auto,
			State:  balancer.StateUnknown,
			Labels: maps.Clone(bc.Labels),
		},
	}
	if t.metricsPath == "none" {
		t.metricsPath = ""
	}
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
	t.ledger = t.bal.Ledger(t.spec.ID)
	if t.kv != nil && t.kvEndpoint != "" {
		stop := t.followKVEvents(ctx)
		defer stop()
	}
	t.probeRound(ctx)
	t.scrape(ctx)
	if ctx.Err() != nil {
		return
	}
	t.publish()
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
	}
}

// publish hands the backend's state to the balancer.
func (t *Target) publish() {
	t.bal.Update(t.spec)
}

// probeRound runs one health probe and, when due, a model refresh.
func (t *Target) probeRound(ctx context.Context) {
	err := t.probe(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		t.failures = 0
		if !t.configured && (t.spec.Models == nil || t.now().Sub(t.modelsAt) >= t.cfg.ModelsInterval) {
			t.refreshModels(ctx)
		}
		if t.spec.State != balancer.StateReady {
			t.logger.Info("backend up", "backend", t.spec.ID)
		}
		t.spec.State, t.spec.Reason = balancer.StateReady, ""
		return
	}
	t.failures++
	if t.failures >= t.cfg.UnhealthyAfter && t.spec.State != balancer.StateDown {
		t.spec.State, t.spec.Reason = balancer.StateDown, "health check failed: "+err.Error()
		t.logger.Warn("backend down", "backend", t.spec.ID, "err", err)
	}
}

// readmit probes a backend that passive health ejected, once its ejection
// time is over, and tells the balancer whether it answers: its health
// check, then a short streaming completion that must end whole. It runs on
// the scrape tick, so a backend returns within a scrape interval of its
// time.
func (t *Target) readmit(ctx context.Context) {
	if !t.ledger.ReadmitDue(t.now()) {
		return
	}
	err := t.probe(ctx)
	if err == nil {
		t.failures = 0
		err = t.probeGeneration(ctx)
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.logger.Debug("ejected backend not readmitted", "backend", t.spec.ID, "err", err)
	}
	t.bal.Probed(t.spec.ID, err == nil)
}

// probeGeneration asks the backend for a streaming completion of
// ReadmitTokens tokens and reads it to its [DONE]: what users get, not
// what the health route says. A backend whose models are not known yet,
// or with ReadmitTokens 0, is not asked.
func (t *Target) probeGeneration(ctx context.Context) error {
	if t.cfg.ReadmitTokens == 0 || len(t.spec.Models) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.ReadmitTimeout)
	defer cancel()
	u := t.spec.URL.JoinPath("/v1/completions")
	body, _ := json.Marshal(map[string]any{"model": t.spec.Models[0], "prompt": "ping", "max_tokens": t.cfg.ReadmitTokens,
		"stream": true, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readmission completion %s: status %d", u, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for sc.Scan() {
		if bytes.Equal(bytes.TrimSpace(sc.Bytes()), []byte("data: [DONE]")) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("readmission completion %s: %w", u, err)
	}
	return fmt.Errorf("readmission completion %s: stream ended without [DONE]", u)
}

// probe GETs the health path.
func (t *Target) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	u := t.spec.URL.JoinPath(t.healthPath)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("health %s: status %d", u, resp.StatusCode)
	}
	return nil
}

// scrapeError is a failed scrape with the reason our metrics count it by.
type scrapeError struct {
	reason string // connect, status, read, parse, empty
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

// scrape reads the metrics page once. A readable page replaces the
// backend's metrics; an unreadable one (garbage, empty, too large) marks
// them stale at once; a page that could not be fetched leaves the last
// reading until it is older than StaleAfter. A backend whose engine is not
// known yet is detected instead, and one whose row reads nothing from its
// page (or whose page is JSON) is checked against the other rows.
func (t *Target) scrape(ctx context.Context) {
	if t.scrapeOff {
		return
	}
	if t.engine == nil {
		t.detect(ctx)
		return
	}
	if t.metricsURL == "" {
		return
	}
	start := t.now()
	r, err := fetchReading(ctx, t.client, t.metricsURL, t.engine, t.cfg.ScrapeTimeout, t.now)
	if ctx.Err() != nil {
		return
	}
	t.metrics.duration.WithLabelValues(t.spec.ID).Observe(t.now().Sub(start).Seconds())
	if err != nil {
		t.failed(err)
		if errors.Is(err, errJSONPage) {
			_ = t.recheck(ctx)
		}
		return
	}
	if len(r.Used) == 0 && t.recheck(ctx) {
		return
	}
	t.accept(r)
}

// failed records a scrape that did not give a reading.
func (t *Target) failed(err error) {
	var se *scrapeError
	reason := "connect"
	if errors.As(err, &se) {
		reason = se.reason
	}
	t.metrics.errors.WithLabelValues(t.spec.ID, reason).Inc()
	if t.scrapeErr == "" {
		t.logger.Warn("metrics scrape failing", "backend", t.spec.ID, "err", err)
	}
	t.scrapeErr = err.Error()
	if reason != "connect" {
		t.lastGood = time.Time{} // what the server says cannot be read: do not trust the old reading
	}
	t.spec.Stale = t.lastGood.IsZero() || t.now().Sub(t.lastGood) > t.cfg.StaleAfter
}

// accept makes r the backend's metrics.
func (t *Target) accept(r Reading) {
	if t.scrapeErr != "" {
		t.logger.Info("metrics scrape recovered", "backend", t.spec.ID)
	}
	t.scrapeErr = ""
	t.lastGood = r.Metrics.At
	t.spec.Metrics = r.Metrics
	t.spec.Stale = false
	t.reportMissing(r)
}

// detectDue reports whether a detection may run now: the first at once,
// then at most one a health interval, so a page that names no engine is
// not fetched at every path on every scrape.
func (t *Target) detectDue() bool {
	if !t.detectedAt.IsZero() && t.now().Sub(t.detectedAt) < t.cfg.HealthInterval {
		return false
	}
	t.detectedAt = t.now()
	return true
}

// runDetect fetches the backend's pages at every row's metrics path and
// ranks the rows on them (see [EngineSet.Detect]); the model list's owners
// decide when the pages do not.
func (t *Target) runDetect(ctx context.Context) (Detection, error) {
	pages, err := t.engines.fetchPages(ctx, t.client, t.spec.URL, t.metricsPath, t.cfg.ScrapeTimeout)
	if err != nil {
		return Detection{}, err
	}
	return t.engines.detect(pages, t.metricsPath, t.owners, t.now()), nil
}

// detect chooses the engine of a backend declared auto.
func (t *Target) detect(ctx context.Context) {
	if !t.detectDue() {
		return
	}
	d, err := t.runDetect(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.failed(fmt.Errorf("detect engine: %w", err))
		return
	}
	if d.Engine == nil {
		if !t.undetected {
			t.logger.Warn("backend engine not detected; name it with engine: in the backend's entry", "backend", t.spec.ID, "err", errNotDetected)
		}
		t.undetected = true
		t.spec.Warning = "engine not detected: " + errNotDetected.Error()
		return
	}
	t.undetected = false
	t.spec.Warning = ""
	t.setEngine(d.Engine)
	t.logger.Info("backend engine detected", "backend", t.spec.ID, "engine", d.Engine.Name, "by", d.By)
	if d.By != "models" {
		t.accept(d.Reading)
	}
}

// recheck runs when the backend's row reads nothing from its page. A
// backend declared auto takes the row that now reads its page (the server
// behind the address changed). A declared engine that the page
// contradicts is reported once, loudly (log, metric, status page), and the
// page is read with the row it matches until the config is fixed: reading
// it with the declared row would leave every signal unknown and the
// backend looking idle (issue 18). A mismatch by the model list alone is
// not reported: owned_by is a weaker witness than the metrics. It reports
// whether the backend now has another row, its page already read.
func (t *Target) recheck(ctx context.Context) bool {
	if !t.detectDue() {
		return false
	}
	d, err := t.runDetect(ctx)
	if ctx.Err() != nil || err != nil || d.Engine == nil || d.Engine == t.engine {
		return false
	}
	switch {
	case t.declared == Auto:
		t.logger.Info("backend engine changed", "backend", t.spec.ID, "from", t.engine.Name, "to", d.Engine.Name, "by", d.By)
	case d.Engine.Name == t.declared: // the server is what config says again
		t.clearMismatch()
		t.logger.Info("backend engine matches its declaration again", "backend", t.spec.ID, "engine", t.declared)
	case d.By == "models":
		return false
	default:
		t.clearMismatch()
		t.mismatch = d.Engine.Name
		t.metrics.mismatch.WithLabelValues(t.spec.ID, t.declared, d.Engine.Name).Set(1)
		t.spec.Warning = fmt.Sprintf("declared engine %s, but the server exposes %s's metrics (%s); read as %s: set engine: %s or auto",
			t.declared, d.Engine.Name, d.By, d.Engine.Name, d.Engine.Name)
		t.logger.Error("backend engine contradicts its metrics; reading them as the engine they match", "backend", t.spec.ID,
			"declared", t.declared, "detected", d.Engine.Name, "by", d.By)
	}
	t.resetMissing()
	t.setEngine(d.Engine)
	if d.By == "models" {
		return false
	}
	t.accept(d.Reading)
	return true
}

// clearMismatch withdraws a reported engine mismatch.
func (t *Target) clearMismatch() {
	if t.mismatch == "" {
		return
	}
	t.metrics.mismatch.DeleteLabelValues(t.spec.ID, t.declared, t.mismatch)
	t.mismatch, t.spec.Warning = "", ""
}

// resetMissing forgets the signals reported missing, for a new engine row.
func (t *Target) resetMissing() {
	for _, s := range t.missing {
		t.metrics.missing.WithLabelValues(t.spec.ID, s).Set(0)
	}
	t.missing = nil
}

// reportMissing logs, once per change, signals the engine row names that
// the page lacks and the backend should have (see
// [Reading.MissingExpected]), and keeps llmlb_scrape_signal_missing
// current.
func (t *Target) reportMissing(r Reading) {
	missing := r.MissingExpected(len(t.spec.Adapters) > 0)
	if slices.Equal(missing, t.missing) {
		return
	}
	for _, s := range missing {
		if !slices.Contains(t.missing, s) {
			t.metrics.missing.WithLabelValues(t.spec.ID, s).Set(1)
			t.logger.Warn("backend metrics lack a signal; check the engine row or the backend's engine", "backend", t.spec.ID,
				"engine", t.engine.Name, "signal", s, "spec", t.engine.spec(s))
		}
	}
	for _, s := range t.missing {
		if !slices.Contains(missing, s) {
			t.metrics.missing.WithLabelValues(t.spec.ID, s).Set(0)
			if !slices.Contains(r.Missing, s) { // else no longer expected: the adapters went
				t.logger.Info("backend metrics signal present again", "backend", t.spec.ID, "signal", s)
			}
		}
	}
	t.missing = slices.Clone(missing)
}

// Fetch GETs the metrics page at u and extracts e's signals from it, as a
// backend's scrape loop does; `llmlb probe` uses it.
func Fetch(ctx context.Context, client *http.Client, u string, e *Engine, timeout time.Duration) (Reading, error) {
	return fetchReading(ctx, client, u, e, timeout, time.Now)
}

// fetchReading GETs a metrics page and extracts e's signals from it.
func fetchReading(ctx context.Context, client *http.Client, u string, e *Engine, timeout time.Duration, now func() time.Time) (Reading, error) {
	page, err := fetchPage(ctx, client, u, timeout)
	if err != nil {
		return Reading{}, err
	}
	r, err := e.Extract(page, now())
	if errors.Is(err, ErrNoData) {
		return Reading{}, &scrapeError{"empty", fmt.Errorf("metrics %s: %w", u, err)}
	}
	if err != nil {
		return Reading{}, &scrapeError{"parse", fmt.Errorf("metrics %s: %w", u, err)}
	}
	return r, nil
}

// errJSONPage is a metrics page answered as JSON.
var errJSONPage = errors.New("answered JSON, not Prometheus text")

// fetchPage GETs a Prometheus text page. A page answered as JSON is an
// error: trtllm-serve's /metrics is JSON, its Prometheus text lives at
// /prometheus/metrics.
func fetchPage(ctx context.Context, client *http.Client, u string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, &scrapeError{"connect", err}
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, &scrapeError{"connect", err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &scrapeError{"status", fmt.Errorf("metrics %s: status %d", u, resp.StatusCode)}
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, maxPageBytes+1))
	if err != nil {
		return nil, &scrapeError{"read", fmt.Errorf("metrics %s: %w", u, err)}
	}
	if len(page) > maxPageBytes {
		return nil, &scrapeError{"read", fmt.Errorf("metrics %s: page larger than %d MiB", u, maxPageBytes>>20)}
	}
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		return nil, &scrapeError{"parse", fmt.Errorf("metrics %s: %w (trtllm-serve serves Prometheus at /prometheus/metrics)", u, errJSONPage)}
	}
	return page, nil
}

// modelList is the body of GET /v1/models as vLLM, SGLang and trtllm-serve
// answer it. vLLM lists each LoRA adapter with its base model in parent;
// owned_by names the engine ("vllm", "sglang", "tensorrt_llm").
type modelList struct {
	Data []struct {
		ID      string  `json:"id"`
		Parent  *string `json:"parent"`
		OwnedBy string  `json:"owned_by"`
	} `json:"data"`
}

// served is what a /v1/models answer says a server serves.
type served struct {
	models   []string           // base models, sorted; never nil
	adapters []balancer.Adapter // entries with a parent, sorted by name
	owners   []string           // distinct owned_by values, sorted
}

// refreshModels learns the backend's models and adapters. On failure the
// last known lists are kept.
func (t *Target) refreshModels(ctx context.Context) {
	sv, err := fetchModels(ctx, t.client, t.spec.URL, t.cfg.Timeout)
	if err != nil {
		if !t.modelsFailed {
			t.logger.Warn("model discovery failing", "backend", t.spec.ID, "err", err)
		}
		t.modelsFailed = true
		return
	}
	if t.modelsFailed {
		t.logger.Info("model discovery recovered", "backend", t.spec.ID)
	}
	t.modelsFailed = false
	t.modelsAt = t.now()
	t.spec.Models, t.spec.Adapters, t.owners = sv.models, sv.adapters, sv.owners
}

// FetchModels GETs base/v1/models and splits it into base models and
// adapters (entries with a parent, as vLLM lists them), each sorted. A
// backend's loop and `llmlb probe` use it.
func FetchModels(ctx context.Context, client *http.Client, base *url.URL, timeout time.Duration) ([]string, []balancer.Adapter, error) {
	sv, err := fetchModels(ctx, client, base, timeout)
	return sv.models, sv.adapters, err
}

func fetchModels(ctx context.Context, client *http.Client, base *url.URL, timeout time.Duration) (served, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := base.JoinPath("/v1/models")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return served{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return served{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return served{}, fmt.Errorf("models %s: status %d", u, resp.StatusCode)
	}
	sv, err := parseModelList(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return served{}, fmt.Errorf("models %s: %w", u, err)
	}
	return sv, nil
}

// parseModelList reads a /v1/models body and splits it into base models and
// adapters (entries with a parent), each sorted. Entries without an id are
// skipped.
func parseModelList(r io.Reader) (served, error) {
	var ml modelList
	if err := json.NewDecoder(r).Decode(&ml); err != nil {
		return served{}, err
	}
	sv := served{models: []string{}}
	for _, d := range ml.Data {
		if d.ID == "" {
			continue
		}
		if d.Parent != nil && *d.Parent != "" {
			sv.adapters = append(sv.adapters, balancer.Adapter{Name: d.ID, Parent: *d.Parent})
		} else {
			sv.models = append(sv.models, d.ID)
		}
		if d.OwnedBy != "" && !slices.Contains(sv.owners, d.OwnedBy) {
			sv.owners = append(sv.owners, d.OwnedBy)
		}
	}
	slices.Sort(sv.models)
	slices.Sort(sv.owners)
	slices.SortFunc(sv.adapters, func(a, b balancer.Adapter) int { return strings.Compare(a.Name, b.Name) })
	return sv, nil
}

// followKVEvents subscribes to the backend's KV-cache events for as long as
// ctx lasts; the returned func waits for the subscription to end and
// forgets what it learned, since a backend watched again (a reload, a
// rediscovery) starts from nothing.
func (t *Target) followKVEvents(ctx context.Context) (stop func()) {
	sub := &kvevents.Subscriber{
		ID:       t.spec.ID,
		Endpoint: t.kvEndpoint,
		Replay:   t.kvReplay,
		Topic:    t.cfg.KVEventsTopic,
		Store:    t.kv,
		Log:      t.logger.With("backend", t.spec.ID),
		OnBatch: func(int64, int) {
			t.metrics.kvBatches.WithLabelValues(t.spec.ID).Inc()
			t.metrics.kvBlocks.WithLabelValues(t.spec.ID).Set(float64(t.kv.Stats(t.spec.ID).Blocks))
		},
		OnReset: func(reason string) { t.metrics.kvResets.WithLabelValues(t.spec.ID, reason).Inc() },
	}
	// Said once, since a subscription that never connects is silent: no
	// batches (llmlb_kv_event_batches_total) is how it shows.
	t.logger.Info("kv events: subscribing", "backend", t.spec.ID, "endpoint", sub.Endpoint, "replay", sub.Replay)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sub.Run(ctx); err != nil && ctx.Err() == nil {
			t.logger.Warn("kv events: subscription ended", "backend", t.spec.ID, "err", err)
		}
	}()
	return func() {
		cancel()
		<-done
		t.kv.Forget(t.spec.ID)
		t.metrics.kvBlocks.DeleteLabelValues(t.spec.ID)
	}
}
