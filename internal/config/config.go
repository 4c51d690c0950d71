package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"reflect"
	"slices"
	"sort"
	"strconv"
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
	// TLS serves HTTPS on Listen from certificate files reloaded when
	// they change.
	TLS proxy.TLSConfig `mapstructure:"tls"`
	// Admin is the operators' listener: /metrics, /debug/*.
	Admin AdminConfig `mapstructure:"admin"`
	// ShutdownGrace is how long in-flight requests, streams included, may
	// run after SIGINT or SIGTERM before they are cut. (default 30s)
	ShutdownGrace time.Duration `mapstructure:"shutdown_grace"`
	// DefaultEngine applies to backends that name no engine: an engine
	// row, or auto to tell each backend's engine from its own metrics
	// page. (default auto)
	DefaultEngine string `mapstructure:"default_engine"`
	// Log sets the log level and format.
	Log LogConfig `mapstructure:"log"`
	// Auth holds the API keys clients must present; none: no key asked.
	Auth proxy.AuthConfig `mapstructure:"auth"`
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
		DefaultEngine: scrape.Auto,
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
		c.Balancer.Validate(), c.Prefix.Validate(), balancer.ValidateModels(c.Models))
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

// Error lists every problem found in one config file.
type Error struct {
	File     string
	Problems []error
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s: %v", e.File, p)
	}
	return b.String()
}

// Environ is the process environment as [os.Environ] gives it, KEY=value
// entries. The program reads its LLMLB_* variables from it and nowhere else,
// so tests pass their own, and it can list them to refuse a misspelt one.
type Environ []string

// Get returns the value of key, or "" when it is not set; the first entry
// wins, as for [os.Getenv].
func (e Environ) Get(key string) string {
	for _, kv := range e {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// otherEnv are the LLMLB_* variables that are not config keys: each is
// read by a command or by the tests (which run this binary), so the
// environment that sets them must still load a config.
var otherEnv = []string{
	"LLMLB_REQUIRE_PROXIES",    // llmlb overhead: fail when HAProxy or nginx is missing
	"LLMLB_REQUIRE_CHROMIUM",   // tests: the status page test may not skip
	"LLMLB_REQUIRE_PROMETHEUS", // tests: the promtool and dashboard tests may not skip
	"LLMLB_REQUIRE_NODE",       // tests: the Node SDK test may not skip
	"LLMLB_REQUIRE_PYZMQ",      // tests: the libzmq KV-event publisher test may not skip
	"LLMLB_STATUS_SCREENSHOT",  // tests: where the status page test saves its screenshot
	"LLMLB_TEST_RUN_MAIN",      // tests: the test binary runs main
}

// envName is the environment variable that overrides key:
// LLMLB_PROXY_MAX_ATTEMPTS for proxy.max_attempts.
func envName(key string) string {
	return "LLMLB_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Load reads path with a private viper instance over the defaults,
// applies LLMLB_* overrides from env (LLMLB_PROXY_MAX_ATTEMPTS sets
// proxy.max_attempts), and decodes strictly: an unknown key, or an LLMLB_*
// variable that names no key, is an error naming it. It returns a
// [*Error] listing every problem: values of the wrong type do not
// hide the others, since they are left at their defaults while the rest is
// validated.
func Load(path string, env Environ) (Config, error) {
	v := viper.New()
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("no such file; name the config file with --config PATH (config.yaml in llmlb's repository runs against `llmlb sim --count 3`)")
		}
		return Config{}, &Error{File: path, Problems: []error{err}}
	}
	var problems []error
	problems = append(problems, unknownKeys(v.AllSettings(), reflect.TypeFor[Config](), "")...)

	def := DefaultConfig()
	leaves := map[string]any{}
	flatten(reflect.ValueOf(def), "", leaves)
	fromEnv := map[string]string{} // key -> variable that set it
	for key, val := range leaves {
		v.SetDefault(key, val)
		name := envName(key)
		if s := env.Get(name); s != "" {
			v.Set(key, s)
			fromEnv[key] = name
		}
	}
	problems = append(problems, unknownEnv(env, leaves)...)
	// Unknown keys were found above, with their paths and a suggestion;
	// decoding reports the values that do not fit their field. Decoding
	// over the defaults leaves such a field at its default, so Validate
	// below judges the rest of the file without tripping on it.
	cfg := def
	err := v.Unmarshal(&cfg, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		durationHook,
		commaListHook,
	)))
	problems = append(problems, decodeProblems(err, v.AllSettings(), fromEnv)...)
	for _, name := range decodeErrorKeys(err) {
		resetList(reflect.ValueOf(&cfg).Elem(), reflect.ValueOf(def), name)
	}
	cfg.Balancer.MaxCandidates = min(cfg.Proxy.MaxAttempts, 8)
	// A peer's preset scrapes as often as the peer does (the endpoint
	// picker every 50ms), unless the file or the environment says
	// otherwise.
	if pr, err := balancer.LookupPreset(cfg.Balancer.Policy); err == nil && pr.ScrapeInterval > 0 &&
		!v.InConfig("scrape.interval") && env.Get("LLMLB_SCRAPE_INTERVAL") == "" {
		cfg.Scrape.Interval = pr.ScrapeInterval
	}
	problems = append(problems, unjoin(cfg.Validate())...)
	if len(problems) > 0 {
		return Config{}, &Error{File: path, Problems: problems}
	}
	return cfg, nil
}

// unknownEnv reports each LLMLB_* variable in env that overrides no config
// key and is none of [otherEnv], with the nearest known name: a typo
// (LLMLB_PROXY_MAX_ATTEMPT) would otherwise leave the default in force
// without a word.
func unknownEnv(env Environ, leaves map[string]any) []error {
	known := make([]string, 0, len(leaves)+len(otherEnv))
	for key := range leaves {
		known = append(known, envName(key))
	}
	known = append(known, otherEnv...)
	sort.Strings(known)
	var names []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "LLMLB_") && !slices.Contains(known, name) && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	errs := make([]error, 0, len(names))
	for _, name := range names {
		msg := fmt.Sprintf("environment: unknown variable %s", name)
		if near := nearestName(name, known); near != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", near)
		}
		errs = append(errs, errors.New(msg))
	}
	return errs
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
	return nearestName(k, slices.Sorted(maps.Keys(fields)))
}

// nearestName returns the name in sorted names closest to k by edit
// distance, if close.
func nearestName(k string, names []string) string {
	best, bestD := "", 3
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
// named by its key path and repeating the value that does not fit, with an
// example of one that does. settings is what viper decoded (the file over
// the defaults, with the environment's overrides); fromEnv maps each key an
// LLMLB_* variable set to that variable's name.
func decodeProblems(err error, settings map[string]any, fromEnv map[string]string) []error {
	if err == nil {
		return nil
	}
	leaves := decodeLeaves(err)
	out := make([]error, 0, len(leaves))
	for _, l := range leaves {
		var de *mapstructure.DecodeError
		if !errors.As(l, &de) {
			out = append(out, l)
			continue
		}
		name := de.Name()
		val, found := lookupSetting(settings, name)
		ft, typed := fieldType(reflect.TypeFor[Config](), name)
		if !found || !typed {
			out = append(out, fmt.Errorf("%s: %w", name, de.Unwrap()))
			continue
		}
		where := ""
		if env, ok := fromEnv[name]; ok {
			where = " (from " + env + ")"
		}
		out = append(out, fmt.Errorf("%s: %s%s %s", name, showValue(val), where, expected(ft)))
	}
	return out
}

// decodeLeaves returns the errors viper's decoding joined, one a field,
// from under the message it wraps them in.
func decodeLeaves(err error) []error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		return unjoin(joined.(error))
	}
	return []error{err}
}

// decodeErrorKeys returns the key path of each field decoding failed on.
func decodeErrorKeys(err error) []string {
	if err == nil {
		return nil
	}
	var names []string
	for _, l := range decodeLeaves(err) {
		var de *mapstructure.DecodeError
		if errors.As(l, &de) {
			names = append(names, de.Name())
		}
	}
	return names
}

// resetList undoes what a failed decode of one list item (name ends in
// "[i]") left in cfg: the list holds a zero item in its place, which
// Validate would report as a second, made-up problem. The whole list goes
// back to its default in def, or to empty where def has none (inside a
// backend).
func resetList(cfg, def reflect.Value, name string) {
	parts := strings.Split(name, ".")
	last, _, indexed := strings.Cut(parts[len(parts)-1], "[")
	if !indexed {
		return // the field kept its default
	}
	for i, part := range parts {
		field, idx, indexed := strings.Cut(part, "[")
		if i == len(parts)-1 {
			field, indexed = last, false
		}
		cfg, def = structField(cfg, field), structField(def, field)
		if !cfg.IsValid() {
			return
		}
		if indexed {
			n, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
			if cfg.Kind() != reflect.Slice || err != nil || n >= cfg.Len() {
				return
			}
			cfg = cfg.Index(n)
			if def.IsValid() && def.Kind() == reflect.Slice && n < def.Len() {
				def = def.Index(n)
			} else {
				def = reflect.Value{}
			}
		}
	}
	if !cfg.CanSet() || (cfg.Kind() != reflect.Slice && cfg.Kind() != reflect.Map) {
		return
	}
	if def.IsValid() {
		cfg.Set(def)
	} else {
		cfg.SetZero()
	}
}

// structField returns the field of struct v tagged name, or the zero Value.
func structField(v reflect.Value, name string) reflect.Value {
	if !v.IsValid() || v.Kind() != reflect.Struct {
		return reflect.Value{}
	}
	for i := range v.NumField() {
		if v.Type().Field(i).Tag.Get("mapstructure") == strings.ToLower(name) {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}

// expected says what a field of type t takes, with an example.
func expected(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "is not a duration; write it with a unit, like 500ms, 5s or 10m"
	case t.Kind() == reflect.Bool:
		return "is not true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "is not a whole number; write it like 3"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "is not a number; write it like 0.5"
	case t.Kind() == reflect.String:
		return `is not a single value; write it like "text"`
	case t.Kind() == reflect.Slice:
		return "is not a list; write it like [a, b]"
	case t.Kind() == reflect.Map || t.Kind() == reflect.Struct:
		return "is not a section of keys; write it as key: value lines indented below"
	}
	return "does not fit a " + t.String()
}

// showValue prints a config value as the user wrote it, quoting strings.
func showValue(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// lookupSetting finds the value at a decoder key path such as
// "scrape.interval" or "backends[0].url" in viper's settings.
func lookupSetting(settings map[string]any, name string) (any, bool) {
	var cur any = settings
	for _, part := range strings.Split(name, ".") {
		field, idx, indexed := strings.Cut(part, "[")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[field]; !ok {
			if cur, ok = lowerKeys(m)[strings.ToLower(field)]; !ok {
				return nil, false
			}
		}
		if !indexed {
			continue
		}
		idx = strings.TrimSuffix(idx, "]")
		switch c := cur.(type) {
		case []any:
			i, err := strconv.Atoi(idx)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		case map[string]any:
			if cur, ok = c[idx]; !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return cur, true
}

// fieldType follows a decoder key path through t's mapstructure tags to the
// type of the field it names.
func fieldType(t reflect.Type, name string) (reflect.Type, bool) {
	for _, part := range strings.Split(name, ".") {
		field, _, indexed := strings.Cut(part, "[")
		if t.Kind() != reflect.Struct {
			return nil, false
		}
		found := false
		for i := range t.NumField() {
			if f := t.Field(i); f.Tag.Get("mapstructure") == strings.ToLower(field) {
				t, found = f.Type, true
				break
			}
		}
		if !found {
			return nil, false
		}
		if indexed {
			if t.Kind() != reflect.Slice && t.Kind() != reflect.Map {
				return nil, false
			}
			t = t.Elem()
		}
	}
	return t, true
}

// durationHook reads a duration from a string such as "5s", and refuses a
// bare number other than 0, which would be nanoseconds: `interval: 5` is
// meant as seconds or milliseconds, never 5ns.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || from == to {
		return data, nil
	}
	switch from.Kind() {
	case reflect.String:
		return time.ParseDuration(strings.TrimSpace(data.(string)))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		if reflect.ValueOf(data).IsZero() {
			return time.Duration(0), nil
		}
		return nil, errors.New("a number without a unit")
	}
	return data, nil
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
