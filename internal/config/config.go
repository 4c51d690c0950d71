package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/capture"
	"github.com/llmlb/llmlb/cluster"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/tracing"
)

// Config is the whole of config.yaml.
//
// Each section's `reload` tag says what a reload of the file does with a
// change to it ([Sections]): "apply" applies it to the running balancer
// at once, "restart" leaves it for the next start and the reload warns.
// A section without the tag (log) has it on each of its fields.
type Config struct {
	// Listen is the address clients reach. (default 127.0.0.1:8080)
	Listen string `mapstructure:"listen" reload:"restart"`
	// TLS serves HTTPS on Listen from certificate files reloaded when
	// they change.
	TLS proxy.TLSConfig `mapstructure:"tls" reload:"restart"`
	// Admin is the operators' listener: /metrics, /debug/*.
	Admin AdminConfig `mapstructure:"admin" reload:"restart"`
	// ShutdownGrace is how long in-flight requests, streams included, may
	// run after SIGINT or SIGTERM before they are cut. (default 30s)
	ShutdownGrace time.Duration `mapstructure:"shutdown_grace" reload:"restart"`
	// DefaultEngine applies to backends that name no engine: an engine
	// row, or auto to tell each backend's engine from its own metrics
	// page. (default auto)
	DefaultEngine string `mapstructure:"default_engine" reload:"apply"`
	// Log sets the log level and format.
	Log LogConfig `mapstructure:"log"`
	// Auth holds the API keys clients must present; none: no key asked.
	Auth proxy.AuthConfig `mapstructure:"auth" reload:"apply"`
	// Proxy tunes forwarding: body limit, retries, timeouts.
	Proxy proxy.Config `mapstructure:"proxy" reload:"restart"`
	// Scrape tunes health checks and model discovery.
	Scrape scrape.Config `mapstructure:"scrape" reload:"restart"`
	// Balancer chooses the routing policy and tunes saturation, admission
	// and session affinity.
	Balancer balancer.Config `mapstructure:"balancer" reload:"restart"`
	// Prefix tunes prompt block hashing and the prefix-cache index.
	Prefix prefix.Config `mapstructure:"prefix" reload:"restart"`
	// Models are aliases and weighted splits of public model names.
	Models []balancer.ModelRoute `mapstructure:"models" reload:"apply"`
	// Engines adds engine rows or overrides fields of the built-in ones.
	Engines map[string]scrape.EngineConfig `mapstructure:"engines" reload:"apply"`
	// Backends are the model servers.
	Backends []scrape.BackendConfig `mapstructure:"backends" reload:"apply"`
	// Tracing exports OpenTelemetry spans and propagates trace context.
	Tracing tracing.Config `mapstructure:"tracing" reload:"restart"`
	// Cluster is the state replicas share in Redis: limits, sessions,
	// load; without cluster.redis.address, none.
	Cluster cluster.Config `mapstructure:"cluster" reload:"restart"`
	// Capture writes a sample of the requests served as a trace the
	// bench replays; without capture.path, none. A reload applies it: a
	// change of sample alone goes on in the same file, any other change
	// starts a new capture.
	Capture capture.Config `mapstructure:"capture" reload:"apply"`
}

// AdminConfig is the `admin:` section.
type AdminConfig struct {
	// Listen is the admin address; keep it off the clients' network.
	// Empty disables the admin listener. (default 127.0.0.1:9090)
	Listen string `mapstructure:"listen"`
	// Token is the SHA-256 of the bearer token every admin route asks
	// for (/, /metrics, /debug/*), "sha256:" and 64 hex digits as `llmlb
	// hash-key` prints it; a request without the token gets 401. Empty
	// means no token: the admin listener is open to whoever reaches it.
	// (default empty)
	Token string `mapstructure:"token"`
}

// LogConfig is the `log:` section.
type LogConfig struct {
	// Level is debug, info, warn or error. (default info)
	Level string `mapstructure:"level" reload:"apply"`
	// Format is text or json. (default text)
	Format string `mapstructure:"format" reload:"restart"`
	// Access writes one line per client request (health and readiness
	// probes excepted): request id, model, backend, status, TTFT,
	// duration, tokens, pick reason. (default true)
	Access bool `mapstructure:"access" reload:"restart"`
	// Prompts adds the prompt text (its first 2 KiB) to access lines, only
	// when level is debug too. Prompts are never logged otherwise.
	// (default false)
	Prompts bool `mapstructure:"prompts" reload:"restart"`
}

// DefaultConfig returns every default; config.yaml overrides them.
func DefaultConfig() Config {
	return Config{
		Listen:        "127.0.0.1:8080",
		Admin:         AdminConfig{Listen: "127.0.0.1:9090"},
		ShutdownGrace: 30 * time.Second,
		DefaultEngine: scrape.Auto,
		Log:           LogConfig{Level: "info", Format: "text", Access: true},
		Proxy:         proxy.DefaultConfig(),
		Scrape:        scrape.DefaultConfig(),
		Balancer:      balancer.DefaultConfig(),
		Prefix:        prefix.DefaultConfig(),
		Tracing:       tracing.DefaultConfig(),
		Cluster:       cluster.DefaultConfig(),
		Capture:       capture.DefaultConfig(),
	}
}

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen: %q is not host:port", c.Listen))
	}
	if c.Admin.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Admin.Listen); err != nil {
			errs = append(errs, fmt.Errorf("admin.listen: %q is not host:port", c.Admin.Listen))
		} else if c.Admin.Listen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
			errs = append(errs, fmt.Errorf("admin.listen: must differ from listen (%q)", c.Listen))
		}
	}
	if c.Admin.Token != "" {
		if _, err := proxy.ParseKeyHash(c.Admin.Token); err != nil {
			errs = append(errs, fmt.Errorf("admin.token: %w", err))
		}
	}
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("shutdown_grace: must not be negative, got %s", c.ShutdownGrace))
	}
	engines, err := scrape.NewEngineSet(c.Engines)
	errs = append(errs, err)
	names := append(engines.Names(), scrape.Auto) // auto: detected per backend
	slices.Sort(names)
	if !slices.Contains(names, c.DefaultEngine) {
		errs = append(errs, fmt.Errorf("default_engine: unknown engine %q (known: %s)", c.DefaultEngine, strings.Join(names, ", ")))
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		errs = append(errs, err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format: must be text or json, got %q", c.Log.Format))
	}
	if len(c.Backends) == 0 {
		errs = append(errs, errors.New("backends: at least one backend is required"))
	}
	errs = append(errs, c.TLS.Validate(), c.Auth.Validate(), c.Proxy.Validate(), c.Scrape.Validate(), scrape.ValidateBackends(c.Backends, names),
		c.Balancer.Validate(), c.Prefix.Validate(), balancer.ValidateModels(c.Models), c.Tracing.Validate(), c.Cluster.Validate(), c.Capture.Validate())
	return errors.Join(errs...)
}

// ParseLevel reads a log.level value: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil || !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(s)) {
		return 0, fmt.Errorf("log.level: must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}
