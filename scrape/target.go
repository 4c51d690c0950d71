package scrape

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// Manager runs one [Target] loop per configured backend. Create it with
// [NewManager] and call Run once.
type Manager struct {
	// immutable after NewManager
	cfg     Config
	targets []*Target
	bal     *balancer.Balancer
}

// NewManager returns a Manager for the static backends. Each backend is
// published to bal at once in [balancer.StateUnknown], so requests can be
// routed to it before its first probe answers. defaultEngine applies to
// backends that name none. client is used for every probe; nil means a
// client with no proxy.
func NewManager(cfg Config, backends []BackendConfig, defaultEngine string, bal *balancer.Balancer, client *http.Client, logger *slog.Logger) (*Manager, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2}}
	}
	m := &Manager{cfg: cfg, bal: bal}
	specs := make([]balancer.Spec, 0, len(backends))
	for _, bc := range backends {
		u, err := url.Parse(bc.URL)
		if err != nil {
			return nil, fmt.Errorf("backend %q: %w", bc.URL, err)
		}
		engine := bc.Engine
		if engine == "" {
			engine = defaultEngine
		}
		hp := bc.HealthPath
		if hp == "" {
			hp = cfg.HealthPath
		}
		t := &Target{
			cfg:        cfg,
			client:     client,
			bal:        bal,
			logger:     logger,
			healthPath: hp,
			configured: bc.Models != nil && len(bc.Models) > 0,
			spec: balancer.Spec{
				ID:     bc.URL,
				URL:    u,
				Engine: engine,
				State:  balancer.StateUnknown,
			},
		}
		if t.configured {
			t.spec.Models = slices.Clone(bc.Models)
		}
		m.targets = append(m.targets, t)
		specs = append(specs, t.spec)
	}
	bal.Update(specs...)
	return m, nil
}

// Run probes every backend until ctx ends. It returns nil when ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, t := range m.targets {
		wg.Go(func() { t.Run(ctx) })
	}
	wg.Wait()
	return nil
}

// Target watches one backend: health and, unless configured, its models.
// Its fields are owned by its Run goroutine.
type Target struct {
	cfg        Config
	client     *http.Client
	bal        *balancer.Balancer
	logger     *slog.Logger
	healthPath string
	configured bool // models come from config, not /v1/models

	spec         balancer.Spec
	failures     int       // consecutive failed probes
	modelsAt     time.Time // last successful /v1/models
	modelsFailed bool      // the last /v1/models failed (for logging transitions)
}

// offset spreads targets over the interval by a hash of their URL, as
// Prometheus spreads scrapes, so probes do not all fire at once.
func (t *Target) offset() time.Duration {
	h := fnv.New64a()
	h.Write([]byte(t.spec.ID))
	return time.Duration(h.Sum64() % uint64(t.cfg.HealthInterval))
}

// Run probes the backend at once, then every health interval, until ctx
// ends.
func (t *Target) Run(ctx context.Context) {
	t.round(ctx)
	select {
	case <-ctx.Done():
		return
	case <-time.After(t.offset()):
	}
	tick := time.NewTicker(t.cfg.HealthInterval)
	defer tick.Stop()
	for {
		t.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// round runs one health probe and, when due, a model refresh, and publishes
// the backend's state if it changed.
func (t *Target) round(ctx context.Context) {
	before := t.spec
	err := t.probe(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		t.failures = 0
		if !t.configured && (t.spec.Models == nil || time.Since(t.modelsAt) >= t.cfg.ModelsInterval) {
			t.refreshModels(ctx)
		}
		t.spec.State = balancer.StateReady
	} else {
		t.failures++
		if t.failures >= t.cfg.UnhealthyAfter && t.spec.State != balancer.StateDown {
			t.spec.State = balancer.StateDown
			t.logger.Warn("backend down", "backend", t.spec.ID, "err", err)
		}
	}
	if !sameSpec(before, t.spec) {
		t.bal.Update(t.spec)
	}
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

// modelList is the body of GET /v1/models as vLLM, SGLang and trtllm-serve
// answer it. vLLM lists each LoRA adapter with its base model in parent.
type modelList struct {
	Data []struct {
		ID     string  `json:"id"`
		Parent *string `json:"parent"`
	} `json:"data"`
}

// refreshModels learns the backend's models and adapters. On failure the
// last known lists are kept.
func (t *Target) refreshModels(ctx context.Context) {
	models, adapters, err := fetchModels(ctx, t.client, t.spec.URL, t.cfg.Timeout)
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
	t.modelsAt = time.Now()
	t.spec.Models, t.spec.Adapters = models, adapters
}

// fetchModels GETs base/v1/models and splits it into base models and
// adapters, each sorted.
func fetchModels(ctx context.Context, client *http.Client, base *url.URL, timeout time.Duration) ([]string, []balancer.Adapter, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := base.JoinPath("/v1/models")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("models %s: status %d", u, resp.StatusCode)
	}
	models, adapters, err := parseModelList(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("models %s: %w", u, err)
	}
	return models, adapters, nil
}

// parseModelList reads a /v1/models body and splits it into base models and
// adapters (entries with a parent), each sorted. Entries without an id are
// skipped.
func parseModelList(r io.Reader) ([]string, []balancer.Adapter, error) {
	var ml modelList
	if err := json.NewDecoder(r).Decode(&ml); err != nil {
		return nil, nil, err
	}
	models := []string{}
	var adapters []balancer.Adapter
	for _, d := range ml.Data {
		if d.ID == "" {
			continue
		}
		if d.Parent != nil && *d.Parent != "" {
			adapters = append(adapters, balancer.Adapter{Name: d.ID, Parent: *d.Parent})
		} else {
			models = append(models, d.ID)
		}
	}
	slices.Sort(models)
	slices.SortFunc(adapters, func(a, b balancer.Adapter) int { return strings.Compare(a.Name, b.Name) })
	return models, adapters, nil
}

func sameSpec(a, b balancer.Spec) bool {
	return a.State == b.State && slices.Equal(a.Models, b.Models) && slices.Equal(a.Adapters, b.Adapters) &&
		(a.Models == nil) == (b.Models == nil)
}
