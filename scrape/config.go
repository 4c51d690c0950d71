package scrape

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// BackendConfig is one entry of `backends:` in config.yaml: one static
// backend (url), or every address a DNS name resolves to (dns with ports,
// or srv).
type BackendConfig struct {
	// URL is the model server's base URL, e.g. http://10.0.0.5:8000.
	URL string `mapstructure:"url"`
	// Name is what clients see of a url backend in x-llmlb-backend:
	// unique, 1 to 64 letters, digits, '.', '_' or '-', not b<digits>.
	// Metrics, logs and the admin pages keep naming it by its URL.
	// Empty means b1, b2, ... in the order backends first appear. Not
	// for dns or srv entries, whose backends are always numbered.
	// (default b<N>)
	Name string `mapstructure:"name"`
	// DNS is a name whose A and AAAA records are backends, each address
	// on each of Ports.
	DNS string `mapstructure:"dns"`
	// SRV is a name like _vllm._tcp.example.com whose SRV records give
	// the backends' hosts and ports.
	SRV string `mapstructure:"srv"`
	// Ports are the ports each DNS address serves on, one backend per port.
	Ports []int `mapstructure:"ports"`
	// ActivePorts narrows Ports per host (an address, or an SRV target
	// name): only those listed carry traffic. Hosts not listed use every
	// port.
	ActivePorts map[string][]int `mapstructure:"active_ports"`
	// Scheme is http or https for discovered backends. (default http)
	Scheme string `mapstructure:"scheme"`
	// RefreshInterval is how often DNS is asked again. (default
	// scrape.dns_interval)
	RefreshInterval time.Duration `mapstructure:"refresh_interval"`
	// Engine names the engine row the server is scraped with: vllm,
	// sglang, triton-tensorrt-llm, trtllm-serve, one from `engines:`, or
	// auto to tell it from the server's own metrics page (and, when the
	// page does not tell, its /v1/models). A declared engine that the
	// page contradicts is reported (log, llmlb_backend_engine_mismatch,
	// status page) and the page read as the engine it matches.
	// (default: default_engine)
	Engine string `mapstructure:"engine"`
	// Models are the model names the server answers to. Empty means learn
	// them, LoRA adapters included, from the server's GET /v1/models.
	Models []string `mapstructure:"models"`
	// HealthPath overrides scrape.health_path for this backend.
	HealthPath string `mapstructure:"health_path"`
	// KVEvents and KVEventsReplay override scrape.kv_events and
	// scrape.kv_events_replay for this entry's backends: servers that
	// share a host publish on ports of their own. ({host} is the
	// backend's host here too.)
	KVEvents       string `mapstructure:"kv_events"`
	KVEventsReplay string `mapstructure:"kv_events_replay"`
	// MetricsPath overrides the engine's metrics path; "none" turns
	// scraping off for this backend.
	MetricsPath string `mapstructure:"metrics_path"`
	// DataParallelSize is the number of data-parallel ranks the server
	// serves behind its one port (vllm serve --data-parallel-size, or
	// --data-parallel-size-local on a node of several): each rank is then
	// a backend of its own, named <name>/r<rank>, and requests to it carry
	// X-data-parallel-rank. 0 detects the ranks from the metrics page:
	// more than one value of vLLM's engine label or SGLang's dp_rank.
	// (default 0)
	DataParallelSize int `mapstructure:"data_parallel_size"`
	// DataParallelStartRank is the global rank of the server's first
	// rank (vllm serve --data-parallel-start-rank), for a node that is
	// not the first; vLLM reads the header as the global rank. Only with
	// data_parallel_size. (default 0)
	DataParallelStartRank int `mapstructure:"data_parallel_start_rank"`
	// Labels name the backend for operators, e.g. gpu: h100; they are
	// shown on the status page and in /debug/backends and change no
	// routing. Empty means none.
	Labels map[string]string `mapstructure:"labels"`
	// Role is the backend's part in a disaggregated prefill/decode fleet:
	// prefill, decode or both. A request whose prompt is long enough
	// (balancer.pd.min_uncached_tokens) is prefilled on a prefill server
	// and decoded on a decode server, by the engine's own protocol.
	// (default both)
	Role string `mapstructure:"role"`
	// BootstrapPort is an SGLang prefill server's bootstrap port
	// (--disaggregation-bootstrap-port), named to its decode peer in each
	// P/D request; only for role prefill or both. (default 8998, SGLang's)
	BootstrapPort int `mapstructure:"bootstrap_port"`
}

// DefaultBootstrapPort is SGLang's default --disaggregation-bootstrap-port.
const DefaultBootstrapPort = 8998

// Config is the `scrape:` section of config.yaml.
type Config struct {
	// HealthPath is the path probed with GET; any 2xx means alive.
	// (default /health)
	HealthPath string `mapstructure:"health_path"`
	// HealthInterval is the time between health probes of one backend.
	// (default 2s)
	HealthInterval time.Duration `mapstructure:"health_interval"`
	// Timeout bounds each health probe and each /v1/models request.
	// (default 1s)
	Timeout time.Duration `mapstructure:"timeout"`
	// UnhealthyAfter is the number of consecutive failed probes that take a
	// backend out of rotation; one good probe brings it back. (default 2)
	UnhealthyAfter int `mapstructure:"unhealthy_after"`
	// ModelsInterval is the time between refreshes of a backend's
	// /v1/models, for backends with no models configured. (default 30s)
	ModelsInterval time.Duration `mapstructure:"models_interval"`
	// Interval is the time between two scrapes of a backend's metrics,
	// jittered by up to 10% either way. (default 100ms)
	Interval time.Duration `mapstructure:"interval"`
	// ScrapeTimeout bounds one metrics scrape. (default 500ms)
	ScrapeTimeout time.Duration `mapstructure:"scrape_timeout"`
	// StaleAfter is the age past which a backend's metrics are not
	// trusted: it gets requests only when no backend with fresh metrics
	// can serve. A scrape whose connection is refused, or whose page
	// cannot be read, makes them stale at once. (default 2s)
	StaleAfter time.Duration `mapstructure:"stale_after"`
	// DNSInterval is how often DNS names in `backends:` are resolved again.
	// (default 10s)
	DNSInterval time.Duration `mapstructure:"dns_interval"`
	// ReadmitTokens is the length of the streaming completion a backend
	// that passive health ejected must answer whole, after its health
	// check, before it returns: a health check answers while the engine
	// behind it cuts, stalls or refuses every generation (issue 17). 0
	// readmits on the health check alone. (default 4)
	ReadmitTokens int `mapstructure:"readmit_tokens"`
	// ReadmitTimeout bounds that completion, first token to [DONE].
	// (default 5s)
	ReadmitTimeout time.Duration `mapstructure:"readmit_timeout"`
	// KVEvents is where each backend publishes its KV-cache events (vLLM
	// started with --kv-events-config '{"enable_kv_cache_events": true,
	// "publisher": "zmq", "endpoint": "tcp://*:5557"}'), as a ZeroMQ
	// endpoint in which {host} stands for the backend's host, for example
	// "tcp://{host}:5557". The default policy then knows what every
	// backend's prefix cache holds, whoever sent the prompts there. ""
	// subscribes to none. (default "")
	KVEvents string `mapstructure:"kv_events"`
	// KVEventsReplay is the backends' replay socket (vLLM's
	// replay_endpoint, for example "tcp://{host}:5558"), asked for
	// batches a subscription missed; "" has none, and a missed batch
	// forgets what that backend holds. (default "")
	KVEventsReplay string `mapstructure:"kv_events_replay"`
	// KVEventsTopic is the topic subscribed to (vLLM's topic); "" is
	// every topic. (default "")
	KVEventsTopic string `mapstructure:"kv_events_topic"`
}

// checkKVEvents checks a kv_events and kv_events_replay pair under key.
func checkKVEvents(key, events, replay string) []error {
	var errs []error
	for _, e := range []struct{ key, v string }{{"kv_events", events}, {"kv_events_replay", replay}} {
		if e.v != "" && !strings.HasPrefix(e.v, "tcp://") && !strings.HasPrefix(e.v, "ipc://") {
			errs = append(errs, fmt.Errorf("%s.%s: must be a ZeroMQ endpoint, tcp://host:port or ipc://path, got %q", key, e.key, e.v))
		}
	}
	if replay != "" && events == "" {
		errs = append(errs, fmt.Errorf("%s.kv_events_replay: set without %s.kv_events", key, key))
	}
	return errs
}

// WantsKVEvents reports whether any backend's KV-cache events are to be
// followed, by scrape.kv_events or a backend's own kv_events.
func WantsKVEvents(c Config, backends []BackendConfig) bool {
	if c.KVEvents != "" {
		return true
	}
	for _, b := range backends {
		if b.KVEvents != "" {
			return true
		}
	}
	return false
}

// KVEventsEndpoint returns template with {host} replaced by u's host (a
// bare IPv6 address in brackets); "" for an empty template.
func KVEventsEndpoint(template string, u *url.URL) string {
	if template == "" {
		return ""
	}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return strings.ReplaceAll(template, "{host}", host)
}

// DefaultConfig returns the scrape defaults.
func DefaultConfig() Config {
	return Config{
		HealthPath:     "/health",
		HealthInterval: 2 * time.Second,
		Timeout:        time.Second,
		UnhealthyAfter: 2,
		ModelsInterval: 30 * time.Second,
		Interval:       100 * time.Millisecond,
		ScrapeTimeout:  500 * time.Millisecond,
		StaleAfter:     2 * time.Second,
		DNSInterval:    10 * time.Second,
		ReadmitTokens:  4,
		ReadmitTimeout: 5 * time.Second,
	}
}

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
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"interval", c.Interval}, {"scrape_timeout", c.ScrapeTimeout}, {"dns_interval", c.DNSInterval}, {"readmit_timeout", c.ReadmitTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("scrape.%s: must be positive, got %s", d.key, d.v))
		}
	}
	if c.ReadmitTokens < 0 {
		errs = append(errs, fmt.Errorf("scrape.readmit_tokens: must not be negative, got %d", c.ReadmitTokens))
	}
	errs = append(errs, checkKVEvents("scrape", c.KVEvents, c.KVEventsReplay)...)
	if c.StaleAfter <= c.Interval {
		errs = append(errs, fmt.Errorf("scrape.stale_after: must be longer than scrape.interval (%s), got %s", c.Interval, c.StaleAfter))
	}
	return errors.Join(errs...)
}

// ValidateBackends reports every problem in the backends list at once.
// engines are the engine names a backend may use.
func ValidateBackends(bs []BackendConfig, engines []string) error {
	var errs []error
	seen, names := map[string]int{}, map[string]int{}
	for i, b := range bs {
		field := fmt.Sprintf("backends[%d]", i)
		sources := 0
		for _, s := range []string{b.URL, b.DNS, b.SRV} {
			if s != "" {
				sources++
			}
		}
		errs = append(errs, checkKVEvents(field, b.KVEvents, b.KVEventsReplay)...)
		switch {
		case sources == 0:
			errs = append(errs, fmt.Errorf("%s: needs one of url, dns or srv", field))
		case sources > 1:
			errs = append(errs, fmt.Errorf("%s: give only one of url, dns or srv", field))
		}
		if b.URL != "" {
			if u, err := checkBackendURL(b.URL); err != nil {
				errs = append(errs, fmt.Errorf("%s.url: %w", field, err))
			} else if j, dup := seen[normalizeURL(u)]; dup {
				errs = append(errs, fmt.Errorf("%s.url: %q is the same backend as backends[%d]", field, b.URL, j))
			} else {
				seen[normalizeURL(u)] = i
			}
			for _, k := range []struct {
				key string
				set bool
			}{{"ports", len(b.Ports) > 0}, {"active_ports", len(b.ActivePorts) > 0}, {"scheme", b.Scheme != ""}, {"refresh_interval", b.RefreshInterval != 0}} {
				if k.set {
					errs = append(errs, fmt.Errorf("%s.%s: only for dns or srv backends", field, k.key))
				}
			}
		}
		switch {
		case b.Name == "":
		case b.URL == "":
			errs = append(errs, fmt.Errorf("%s.name: only for url backends; dns and srv backends are numbered", field))
		case !validName(b.Name):
			errs = append(errs, fmt.Errorf("%s.name: must be 1 to 64 letters, digits, '.', '_' or '-', and not b followed by digits (the default names), got %q", field, b.Name))
		default:
			if j, dup := names[b.Name]; dup {
				errs = append(errs, fmt.Errorf("%s.name: %q is backends[%d]'s name too", field, b.Name, j))
			}
			names[b.Name] = i
		}
		if b.DNS != "" && len(b.Ports) == 0 {
			errs = append(errs, fmt.Errorf("%s.ports: dns %q needs the ports its servers listen on", field, b.DNS))
		}
		if b.SRV != "" && len(b.Ports) > 0 {
			errs = append(errs, fmt.Errorf("%s.ports: srv records carry their own ports; use active_ports to narrow them", field))
		}
		for _, p := range b.Ports {
			if p < 1 || p > 65535 {
				errs = append(errs, fmt.Errorf("%s.ports: %d is not a port", field, p))
			}
		}
		hosts := make([]string, 0, len(b.ActivePorts))
		for h := range b.ActivePorts {
			hosts = append(hosts, h)
		}
		slices.Sort(hosts)
		for _, h := range hosts {
			for _, p := range b.ActivePorts[h] {
				if b.DNS != "" && !slices.Contains(b.Ports, p) {
					errs = append(errs, fmt.Errorf("%s.active_ports[%s]: %d is not one of ports %v", field, h, p, b.Ports))
				}
			}
		}
		if b.Scheme != "" && b.Scheme != "http" && b.Scheme != "https" {
			errs = append(errs, fmt.Errorf("%s.scheme: must be http or https, got %q", field, b.Scheme))
		}
		if b.RefreshInterval < 0 {
			errs = append(errs, fmt.Errorf("%s.refresh_interval: must not be negative, got %s", field, b.RefreshInterval))
		}
		if b.Engine != "" && !slices.Contains(engines, b.Engine) {
			errs = append(errs, fmt.Errorf("%s.engine: unknown engine %q (known: %s)", field, b.Engine, strings.Join(engines, ", ")))
		}
		for j, m := range b.Models {
			if m == "" {
				errs = append(errs, fmt.Errorf("%s.models[%d]: must not be empty", field, j))
			}
		}
		switch {
		case b.DataParallelSize < 0:
			errs = append(errs, fmt.Errorf("%s.data_parallel_size: must not be negative, got %d", field, b.DataParallelSize))
		case b.DataParallelStartRank < 0:
			errs = append(errs, fmt.Errorf("%s.data_parallel_start_rank: must not be negative, got %d", field, b.DataParallelStartRank))
		case b.DataParallelStartRank > 0 && b.DataParallelSize == 0:
			errs = append(errs, fmt.Errorf("%s.data_parallel_start_rank: set without data_parallel_size", field))
		}
		if b.HealthPath != "" && !strings.HasPrefix(b.HealthPath, "/") {
			errs = append(errs, fmt.Errorf("%s.health_path: must start with /, got %q", field, b.HealthPath))
		}
		if _, err := balancer.ParseRole(b.Role); err != nil {
			errs = append(errs, fmt.Errorf("%s.role: %w", field, err))
		}
		if b.BootstrapPort < 0 || b.BootstrapPort > 65535 {
			errs = append(errs, fmt.Errorf("%s.bootstrap_port: %d is not a port", field, b.BootstrapPort))
		}
		if b.MetricsPath != "" && b.MetricsPath != "none" && !strings.HasPrefix(b.MetricsPath, "/") {
			errs = append(errs, fmt.Errorf("%s.metrics_path: must start with / (or be none), got %q", field, b.MetricsPath))
		}
	}
	return errors.Join(errs...)
}

// validName reports whether s may name a backend: short, plain, and not
// one of the default names b1, b2, ....
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	digits := len(s) > 1 && s[0] == 'b'
	for i, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
		if i > 0 && (c < '0' || c > '9') {
			digits = false
		}
	}
	return !digits
}

// checkBackendURL parses a backend's base URL, explaining the usual
// mistakes in our words rather than url.Parse's: no scheme (which url.Parse
// reads as "first path segment in URL cannot contain colon", or as a scheme
// named after the host) and a path ending in /v1, the form OpenAI clients
// take, which llmlb would extend to /v1/v1/completions and a health probe
// of /v1/health (issue 18).
func checkBackendURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		return nil, fmt.Errorf("%q has no scheme; write it as %q", s, "http://"+s)
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%q is not a URL: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q must be an http:// or https:// URL with a host", s)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("%q has a fragment (#...), which a server never sees", s)
	}
	if p := strings.TrimRight(u.Path, "/"); p == "/v1" || strings.HasSuffix(p, "/v1") {
		base := *u
		base.Path, base.RawPath = strings.TrimSuffix(p, "/v1"), ""
		return nil, fmt.Errorf("%q ends in /v1: give the server's base URL, %q; llmlb adds /v1/... to each request and probes /health beside it", s, base.String())
	}
	return u, nil
}

func normalizeURL(u *url.URL) string {
	return strings.ToLower(u.Scheme+"://"+u.Host) + strings.TrimSuffix(u.Path, "/")
}
