// Package scrape watches the backends: which exist (static list), whether
// each is alive (active health checks) and what each serves (configured, or
// learned from its /v1/models). It hands complete backend states to
// [balancer.Balancer.Update].
package scrape

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// BackendConfig is one entry of `backends:` in config.yaml.
type BackendConfig struct {
	// URL is the model server's base URL, e.g. http://10.0.0.5:8000. Required.
	URL string `mapstructure:"url"`
	// Engine names the engine the server runs: vllm, sglang,
	// triton-tensorrt-llm or trtllm-serve. (default: default_engine)
	Engine string `mapstructure:"engine"`
	// Models are the model names the server answers to. Empty means learn
	// them, LoRA adapters included, from the server's GET /v1/models.
	Models []string `mapstructure:"models"`
	// HealthPath overrides scrape.health_path for this backend.
	HealthPath string `mapstructure:"health_path"`
}

// Config is the `scrape:` section of config.yaml.
type Config struct {
	// HealthPath is the path probed with GET; any 2xx means alive.
	// (default /health)
	HealthPath string `mapstructure:"health_path"`
	// HealthInterval is the time between health probes of one backend.
	// (default 2s)
	HealthInterval time.Duration `mapstructure:"health_interval"`
	// Timeout bounds each probe and each /v1/models request. (default 1s)
	Timeout time.Duration `mapstructure:"timeout"`
	// UnhealthyAfter is the number of consecutive failed probes that take a
	// backend out of rotation; one good probe brings it back. (default 2)
	UnhealthyAfter int `mapstructure:"unhealthy_after"`
	// ModelsInterval is the time between refreshes of a backend's
	// /v1/models, for backends with no models configured. (default 30s)
	ModelsInterval time.Duration `mapstructure:"models_interval"`
}

// DefaultConfig returns the scrape defaults.
func DefaultConfig() Config {
	return Config{
		HealthPath:     "/health",
		HealthInterval: 2 * time.Second,
		Timeout:        time.Second,
		UnhealthyAfter: 2,
		ModelsInterval: 30 * time.Second,
	}
}

// Engines are the engine names llmlb knows.
var Engines = []string{"vllm", "sglang", "triton-tensorrt-llm", "trtllm-serve"}

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	if !strings.HasPrefix(c.HealthPath, "/") {
		errs = append(errs, fmt.Errorf("scrape.health_path: must start with /, got %q", c.HealthPath))
	}
	if c.HealthInterval <= 0 {
		errs = append(errs, fmt.Errorf("scrape.health_interval: must be positive, got %s", c.HealthInterval))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("scrape.timeout: must be positive, got %s", c.Timeout))
	}
	if c.UnhealthyAfter < 1 {
		errs = append(errs, fmt.Errorf("scrape.unhealthy_after: must be at least 1, got %d", c.UnhealthyAfter))
	}
	if c.ModelsInterval <= 0 {
		errs = append(errs, fmt.Errorf("scrape.models_interval: must be positive, got %s", c.ModelsInterval))
	}
	return errors.Join(errs...)
}

// ValidateBackends reports every problem in the backends list at once.
func ValidateBackends(bs []BackendConfig) error {
	var errs []error
	seen := map[string]int{}
	for i, b := range bs {
		field := fmt.Sprintf("backends[%d]", i)
		if b.URL == "" {
			errs = append(errs, fmt.Errorf("%s.url: required", field))
		} else if u, err := url.Parse(b.URL); err != nil {
			errs = append(errs, fmt.Errorf("%s.url: %w", field, err))
		} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s.url: %q must be an http:// or https:// URL with a host", field, b.URL))
		} else if j, dup := seen[normalizeURL(u)]; dup {
			errs = append(errs, fmt.Errorf("%s.url: %q is the same backend as backends[%d]", field, b.URL, j))
		} else {
			seen[normalizeURL(u)] = i
		}
		if b.Engine != "" && !isEngine(b.Engine) {
			errs = append(errs, fmt.Errorf("%s.engine: unknown engine %q (known: %s)", field, b.Engine, strings.Join(Engines, ", ")))
		}
		for j, m := range b.Models {
			if m == "" {
				errs = append(errs, fmt.Errorf("%s.models[%d]: must not be empty", field, j))
			}
		}
		if b.HealthPath != "" && !strings.HasPrefix(b.HealthPath, "/") {
			errs = append(errs, fmt.Errorf("%s.health_path: must start with /, got %q", field, b.HealthPath))
		}
	}
	return errors.Join(errs...)
}

func isEngine(e string) bool {
	for _, k := range Engines {
		if k == e {
			return true
		}
	}
	return false
}

func normalizeURL(u *url.URL) string {
	return strings.ToLower(u.Scheme+"://"+u.Host) + strings.TrimSuffix(u.Path, "/")
}
