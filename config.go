package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
)

// Config is the whole of config.yaml.
type Config struct {
	// Listen is the address clients reach. (default 127.0.0.1:8080)
	Listen string `mapstructure:"listen"`
	// Admin is the operators' listener: /metrics, /debug/*.
	Admin AdminConfig `mapstructure:"admin"`
	// ShutdownGrace is how long in-flight requests, streams included, may
	// run after SIGINT or SIGTERM before they are cut. (default 30s)
	ShutdownGrace time.Duration `mapstructure:"shutdown_grace"`
	// DefaultEngine applies to backends that name no engine. (default vllm)
	DefaultEngine string `mapstructure:"default_engine"`
	// Log sets the log level and format.
	Log LogConfig `mapstructure:"log"`
	// Proxy tunes forwarding: body limit, retries, timeouts.
	Proxy proxy.Config `mapstructure:"proxy"`
	// Scrape tunes health checks and model discovery.
	Scrape scrape.Config `mapstructure:"scrape"`
	// Balancer chooses the routing policy and tunes saturation, admission
	// and session affinity.
	Balancer balancer.Config `mapstructure:"balancer"`
	// Prefix tunes prompt block hashing and the prefix-cache index.
	Prefix prefix.Config `mapstructure:"prefix"`
	// Models are aliases and weighted splits of public model names.
	Models []balancer.ModelRoute `mapstructure:"models"`
	// Engines adds engine rows or overrides fields of the built-in ones.
	Engines map[string]scrape.EngineConfig `mapstructure:"engines"`
	// Backends are the model servers.
	Backends []scrape.BackendConfig `mapstructure:"backends"`
}

// AdminConfig is the `admin:` section.
type AdminConfig struct {
	// Listen is the admin address; keep it off the clients' network.
	// Empty disables the admin listener. (default 127.0.0.1:9090)
	Listen string `mapstructure:"listen"`
}

// LogConfig is the `log:` section.
type LogConfig struct {
	// Level is debug, info, warn or error. (default info)
	Level string `mapstructure:"level"`
	// Format is text or json. (default text)
	Format string `mapstructure:"format"`
	// Access writes one line per client request (health and readiness
	// probes excepted): request id, model, backend, status, TTFT,
	// duration, tokens, pick reason. (default true)
	Access bool `mapstructure:"access"`
	// Prompts adds the prompt text (its first 2 KiB) to access lines, only
	// when level is debug too. Prompts are never logged otherwise.
	// (default false)
	Prompts bool `mapstructure:"prompts"`
}

// DefaultConfig returns every default; config.yaml overrides them.
func DefaultConfig() Config {
	return Config{
		Listen:        "127.0.0.1:8080",
		Admin:         AdminConfig{Listen: "127.0.0.1:9090"},
		ShutdownGrace: 30 * time.Second,
		DefaultEngine: "vllm",
		Log:           LogConfig{Level: "info", Format: "text", Access: true},
		Proxy:         proxy.DefaultConfig(),
		Scrape:        scrape.DefaultConfig(),
		Balancer:      balancer.DefaultConfig(),
		Prefix:        prefix.DefaultConfig(),
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
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("shutdown_grace: must not be negative, got %s", c.ShutdownGrace))
	}
	engines, err := scrape.NewEngineSet(c.Engines)
	errs = append(errs, err)
	if !slices.Contains(engines.Names(), c.DefaultEngine) {
		errs = append(errs, fmt.Errorf("default_engine: unknown engine %q (known: %s)", c.DefaultEngine, strings.Join(engines.Names(), ", ")))
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		errs = append(errs, err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format: must be text or json, got %q", c.Log.Format))
	}
	if len(c.Backends) == 0 {
		errs = append(errs, errors.New("backends: at least one backend is required"))
	}
	errs = append(errs, c.Proxy.Validate(), c.Scrape.Validate(), scrape.ValidateBackends(c.Backends, engines.Names()),
		c.Balancer.Validate(), c.Prefix.Validate(), balancer.ValidateModels(c.Models))
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil || !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(s)) {
		return 0, fmt.Errorf("log.level: must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// ConfigError lists every problem found in one config file.
type ConfigError struct {
	File     string
	Problems []error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s: %v", e.File, p)
	}
	return b.String()
}

// loadConfig reads path with a private viper instance over the defaults,
// applies LLMLB_* overrides from getenv (LLMLB_PROXY_MAX_ATTEMPTS sets
// proxy.max_attempts), and decodes strictly: an unknown key is an error naming
// the key and the file. It returns a [*ConfigError] listing every problem.
func loadConfig(path string, getenv func(string) string) (Config, error) {
	v := viper.New()
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return Config{}, &ConfigError{File: path, Problems: []error{err}}
	}
	var problems []error
	problems = append(problems, unknownKeys(v.AllSettings(), reflect.TypeFor[Config](), "")...)

	def := DefaultConfig()
	leaves := map[string]any{}
	flatten(reflect.ValueOf(def), "", leaves)
	for key, val := range leaves {
		v.SetDefault(key, val)
		env := "LLMLB_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
		if s := getenv(env); s != "" {
			v.Set(key, s)
		}
	}
	// Unknown keys were found above, with their paths and a suggestion;
	// decoding reports the values that do not fit their field.
	var cfg Config
	err := v.Unmarshal(&cfg, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		mapstructure.StringToTimeDurationHookFunc(),
		commaListHook,
	)))
	problems = append(problems, decodeProblems(err, leaves)...)
	if len(problems) > 0 {
		return Config{}, &ConfigError{File: path, Problems: problems}
	}
	cfg.Balancer.MaxCandidates = min(cfg.Proxy.MaxAttempts, 8)
	// A peer's preset scrapes as often as the peer does (the endpoint
	// picker every 50ms), unless the file or the environment says
	// otherwise.
	if pr, err := balancer.LookupPreset(cfg.Balancer.Policy); err == nil && pr.ScrapeInterval > 0 &&
		!v.InConfig("scrape.interval") && getenv("LLMLB_SCRAPE_INTERVAL") == "" {
		cfg.Scrape.Interval = pr.ScrapeInterval
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, &ConfigError{File: path, Problems: unjoin(err)}
	}
	return cfg, nil
}

// unjoin flattens an errors.Join tree into its leaves.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

// flatten records every leaf of the struct v under its dotted mapstructure
// key. Slices and maps are leaves.
func flatten(v reflect.Value, prefix string, out map[string]any) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("mapstructure")
		if tag == "" || tag == "-" {
			continue
		}
		key := tag
		if prefix != "" {
			key = prefix + "." + tag
		}
		if f.Type.Kind() == reflect.Struct {
			flatten(v.Field(i), key, out)
			continue
		}
		out[key] = v.Field(i).Interface()
	}
}

// unknownKeys walks what the file holds against the struct type t and
// reports each key no field takes, with its full path and the nearest known
// key.
func unknownKeys(m map[string]any, t reflect.Type, path string) []error {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if tag := f.Tag.Get("mapstructure"); tag != "" && tag != "-" {
			fields[tag] = f.Type
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		full := k
		if path != "" {
			full = path + "." + k
		}
		ft, ok := fields[k]
		if !ok {
			msg := fmt.Sprintf("unknown key %q", full)
			if near := nearest(k, fields); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			errs = append(errs, errors.New(msg))
			continue
		}
		switch {
		case ft.Kind() == reflect.Struct:
			if sub, ok := m[k].(map[string]any); ok {
				errs = append(errs, unknownKeys(sub, ft, full)...)
			}
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			if sub, ok := m[k].(map[string]any); ok {
				for _, name := range slices.Sorted(maps.Keys(sub)) {
					if entry, ok := sub[name].(map[string]any); ok {
						errs = append(errs, unknownKeys(entry, ft.Elem(), full+"."+name)...)
					}
				}
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			if list, ok := m[k].([]any); ok {
				for i, item := range list {
					if sub, ok := item.(map[string]any); ok {
						errs = append(errs, unknownKeys(lowerKeys(sub), ft.Elem(), fmt.Sprintf("%s[%d]", full, i))...)
					}
				}
			}
		}
	}
	return errs
}

// lowerKeys lower-cases map keys as viper does for nested maps but not for
// maps inside lists.
func lowerKeys(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out
}

// nearest returns the known key closest to k by edit distance, if close.
func nearest(k string, fields map[string]reflect.Type) string {
	best, bestD := "", 3
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if d := editDistance(k, f); d < bestD {
			best, bestD = f, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeProblems splits a decoding error into one problem per field, each
// named by its key path, with a hint for durations. defaults maps each key
// to its default value, which gives the field's type.
func decodeProblems(err error, defaults map[string]any) []error {
	if err == nil {
		return nil
	}
	leaves := []error{err}
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		leaves = unjoin(joined.(error))
	}
	out := make([]error, 0, len(leaves))
	for _, l := range leaves {
		var de *mapstructure.DecodeError
		if !errors.As(l, &de) {
			out = append(out, l)
			continue
		}
		key := de.Name()
		if i := strings.IndexByte(key, '['); i >= 0 && !strings.HasPrefix(key, "backends") {
			key = key[:i]
		}
		if _, ok := defaults[key].(time.Duration); ok {
			out = append(out, fmt.Errorf("%s: not a duration (write it like 500ms, 5s or 10m): %w", de.Name(), de.Unwrap()))
			continue
		}
		out = append(out, fmt.Errorf("%s: %w", de.Name(), de.Unwrap()))
	}
	return out
}

// commaListHook lets a string fill a list field as comma-separated items, so
// LLMLB_PROXY_RETRY_STATUSES=502,503 works; the items are then converted to
// the element type.
func commaListHook(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Slice {
		return data, nil
	}
	s := strings.TrimSpace(data.(string))
	if s == "" {
		return []string{}, nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts, nil
}
