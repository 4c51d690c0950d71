package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
)

func TestValidateReportsEveryProblemWithFileAndKey(t *testing.T) {
	path := writeConfig(t, `
lisen: 127.0.0.1:8080
admin:
  listn: 127.0.0.1:9090
proxy:
  max_attempt: 2
  dial_timeout: 5 seconds
backends:
  - url: http://127.0.0.1:8001
    modles: [m]
`)
	stdout, stderr, err := validate(t, noEnv, path)
	if err == nil {
		t.Fatalf("validate accepted a bad file; stdout %q", stdout)
	}
	for _, want := range []string{
		`unknown key "lisen" (did you mean "listen"?)`,
		`unknown key "admin.listn" (did you mean "listen"?)`,
		`unknown key "proxy.max_attempt" (did you mean "max_attempts"?)`,
		`unknown key "backends[0].modles" (did you mean "models"?)`,
		`proxy.dial_timeout: "5 seconds" is not a duration; write it with a unit, like 500ms, 5s or 10m`,
	} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("missing %q prefixed by the file in:\n%s", want, stderr)
		}
	}
}

func TestValidateReportsBadValues(t *testing.T) {
	path := writeConfig(t, `
listen: nowhere
default_engine: tgi
log:
  level: loud
proxy:
  max_attempts: 0
  retry_statuses: [200]
scrape:
  health_path: health
balancer:
  ttft:
    copy_margin: 2
    cold_backlog: 1
    step_tokens: 0
backends:
  - url: 127.0.0.1:8001
    engine: vlm
`)
	_, stderr, err := validate(t, noEnv, path)
	if err == nil {
		t.Fatal("validate accepted bad values")
	}
	for _, want := range []string{"listen:", "default_engine:", "log.level:", "proxy.max_attempts:", "proxy.retry_statuses:",
		"scrape.health_path:", "balancer.ttft.copy_margin:", "balancer.ttft.cold_backlog: no longer a setting", "balancer.ttft.step_tokens:", "backends[0].url:", "backends[0].engine:"} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("no problem reported for %s in:\n%s", want, stderr)
		}
	}
}

// TestShippedConfigsValidate: config.yaml and every config in examples/
// load as written, and validate, files included, except
// keys-and-tls.yaml, whose certificate, key and CA files are the
// operator's: validate refuses it naming those three keys and nothing
// else.
func TestShippedConfigsValidate(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../config.yaml")
	n := 0
	for _, f := range files {
		if !isLLMLBConfig(t, f) {
			continue
		}
		n++
		if _, err := config.Load(f, noEnv); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		stdout, stderr, err := validate(t, noEnv, f)
		if filepath.Base(f) != "keys-and-tls.yaml" {
			if err != nil || !strings.Contains(stdout, f+": ok") {
				t.Errorf("%s: %v\n%s", f, err, stderr)
			}
			continue
		}
		var keys []string
		for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
			key, _, _ := strings.Cut(strings.TrimPrefix(line, f+": "), ":")
			keys = append(keys, key)
		}
		if want := []string{"tls.cert_file", "tls.key_file", "proxy.backend_ca_file"}; !slices.Equal(keys, want) {
			t.Errorf("validate %s names %q, want %q:\n%s", f, keys, want, stderr)
		}
	}
	if n < 3 {
		t.Errorf("only %d configs checked", n)
	}
}

// isLLMLBConfig tells llmlb configs from other YAML in examples/ (compose
// files, Kubernetes manifests): ours have a top-level backends key.
func isLLMLBConfig(t *testing.T, path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "backends:") {
			return true
		}
	}
	return false
}

func TestEnvOverrides(t *testing.T) {
	path := writeConfig(t, "backends:\n  - url: http://127.0.0.1:8001\nproxy:\n  max_attempts: 2\n")
	env := config.Environ{
		"LLMLB_LISTEN=0.0.0.0:8000",
		"LLMLB_PROXY_MAX_ATTEMPTS=5",
		"LLMLB_PROXY_RETRY_STATUSES=500,502",
		"LLMLB_SCRAPE_HEALTH_INTERVAL=250ms",
		"LLMLB_LOG_FORMAT=json",
		"LLMLB_REQUIRE_PROXIES=1", // not a key, but llmlb's own
		"HOME=/root",
	}
	cfg, err := config.Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "0.0.0.0:8000" || cfg.Proxy.MaxAttempts != 5 || !slices.Equal(cfg.Proxy.RetryStatuses, []int{500, 502}) ||
		cfg.Scrape.HealthInterval != 250*time.Millisecond || cfg.Log.Format != "json" {
		t.Errorf("overrides not applied: %+v", cfg)
	}
	if cfg.Admin.Listen != "127.0.0.1:9090" || cfg.ShutdownGrace != 30*time.Second {
		t.Errorf("defaults lost: %+v", cfg)
	}
	_, err = config.Load(path, config.Environ{"LLMLB_PROXY_DIAL_TIMEOUT=soon"})
	if want := `proxy.dial_timeout: "soon" (from LLMLB_PROXY_DIAL_TIMEOUT) is not a duration`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("bad env value: %v, want %q", err, want)
	}
}

// TestRedisPasswordOnlyFromTheEnvironment: cluster.redis.password is taken
// from LLMLB_CLUSTER_REDIS_PASSWORD and refused in the file, where it
// would end up in version control; the error does not repeat it.
func TestRedisPasswordOnlyFromTheEnvironment(t *testing.T) {
	base := "backends:\n  - url: http://127.0.0.1:8001\ncluster:\n  redis:\n    address: 127.0.0.1:6379\n"
	cfg, err := config.Load(writeConfig(t, base), config.Environ{"LLMLB_CLUSTER_REDIS_PASSWORD=s3cret-from-env"})
	if err != nil || cfg.Cluster.Redis.Password != "s3cret-from-env" {
		t.Fatalf("from the environment: %q, %v", cfg.Cluster.Redis.Password, err)
	}
	_, err = config.Load(writeConfig(t, base+"    password: s3cret-in-file\n"), noEnv)
	if err == nil || !strings.Contains(err.Error(), "cluster.redis.password: not in the config file") || strings.Contains(err.Error(), "s3cret-in-file") {
		t.Errorf("in the file: %v", err)
	}
}

// TestCaptureConfig: the capture's salt is taken from LLMLB_CAPTURE_SALT
// and refused in the file, without repeating it; a short salt, a sample
// outside 0..1 and a tiny rotation size are each named.
func TestCaptureConfig(t *testing.T) {
	base := "backends:\n  - url: http://127.0.0.1:8001\ncapture:\n  path: /tmp/capture.jsonl\n"
	cfg, err := config.Load(writeConfig(t, base), config.Environ{"LLMLB_CAPTURE_SALT=sixteen-bytes-salt!"})
	if err != nil || cfg.Capture.Salt != "sixteen-bytes-salt!" || cfg.Capture.Sample != 1 {
		t.Fatalf("from the environment: %+v, %v", cfg.Capture, err)
	}
	_, err = config.Load(writeConfig(t, base+"  salt: s3cret-in-the-file\n"), noEnv)
	if err == nil || !strings.Contains(err.Error(), "capture.salt: not in the config file") || strings.Contains(err.Error(), "s3cret-in-the-file") {
		t.Errorf("in the file: %v", err)
	}
	_, err = config.Load(writeConfig(t, base+"  sample: 1.5\n  max_bytes: 100\n  max_files: -1\n"), config.Environ{"LLMLB_CAPTURE_SALT=short"})
	for _, want := range []string{"capture.sample:", "capture.max_bytes:", "capture.max_files:", "capture.salt: must be at least 16 bytes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load = %v, want a problem %q", err, want)
		}
	}
}

// TestUnknownEnvIsAnError: a misspelt LLMLB_* variable used to leave the
// default in force without a word (issue 18, 6).
func TestUnknownEnvIsAnError(t *testing.T) {
	path := writeConfig(t, "backends:\n  - url: http://127.0.0.1:8001\n")
	_, stderr, err := validate(t, config.Environ{"LLMLB_PROXY_MAX_ATTEMPT=3", "LLMLB_LISTEN=127.0.0.1:8000"}, path)
	want := path + ": environment: unknown variable LLMLB_PROXY_MAX_ATTEMPT (did you mean LLMLB_PROXY_MAX_ATTEMPTS?)"
	if err == nil || !strings.Contains(stderr, want) {
		t.Errorf("validate with LLMLB_PROXY_MAX_ATTEMPT set: err %v, stderr %q, want %q", err, stderr, want)
	}
}

// TestRemovedKeysSaySo: a key that was a knob and is fixed now is refused
// by name, from the file and from the environment, not as a typo.
func TestRemovedKeysSaySo(t *testing.T) {
	path := writeConfig(t, "balancer:\n  ttft:\n    cold_room: 0.3\nbackends:\n  - url: http://127.0.0.1:8001\n")
	_, stderr, err := validate(t, config.Environ{"LLMLB_BALANCER_SATURATION_HOLDER_QUEUE=2"}, path)
	for _, want := range []string{
		path + ": balancer.ttft.cold_room: no longer a setting (fixed at 0.5",
		path + ": environment: LLMLB_BALANCER_SATURATION_HOLDER_QUEUE is no longer a setting (balancer.saturation.holder_queue: fixed at 4)",
	} {
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("err %v, stderr %q, want %q", err, stderr, want)
		}
	}
}

// TestConfigErrorsReportEveryProblem is issue 18's sixth problem: a value of
// the wrong type hid the file's other problems (2 of 4 reported), and
// type errors did not repeat the value or show a good one.
func TestConfigErrorsReportEveryProblem(t *testing.T) {
	path := writeConfig(t, `
listen: nowhere
lisen: x
log:
  level: loud
  access: maybe
proxy:
  max_attempts: two
scrape:
  interval: fast
  health_interval: 5
backends:
  - url: 127.0.0.1:8001
  - url: http://127.0.0.1:8002
    models: [m, {a: b}]
`)
	_, stderr, err := validate(t, noEnv, path)
	if err == nil {
		t.Fatal("validate accepted the file")
	}
	for _, want := range []string{
		`unknown key "lisen" (did you mean "listen"?)`,
		`listen: "nowhere" is not host:port`,
		`log.level: must be debug, info, warn or error, got "loud"`,
		`log.access: "maybe" is not true or false`,
		`proxy.max_attempts: "two" is not a whole number; write it like 3`,
		`scrape.interval: "fast" is not a duration; write it with a unit, like 500ms, 5s or 10m`,
		`scrape.health_interval: 5 is not a duration`,
		`backends[0].url: "127.0.0.1:8001" has no scheme; write it as "http://127.0.0.1:8001"`,
		`backends[1].models[1]: map[a:b] is not a single value; write it like "text"`,
	} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("missing %q in:\n%s", want, stderr)
		}
	}
	if n := strings.Count(stderr, path+": "); n != 9 {
		t.Errorf("%d problems reported, want 9 (none twice, none made up by a field left at its default):\n%s", n, stderr)
	}
}

// noEnv is an environment without LLMLB_* variables.
var noEnv config.Environ

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// validate checks path as `llmlb validate` does ([config.Check]) and
// returns the error and what that command would print: "PATH: ok" and a
// count to stdout, or every problem to stderr.
func validate(t *testing.T, env config.Environ, path string) (stdout, stderr string, err error) {
	t.Helper()
	if _, err := config.Check(path, env); err != nil {
		return "", err.Error() + "\n", err
	}
	return fmt.Sprintf("%s: ok\n", path), "", nil
}

// TestKeys: config.Keys names sections' keys by their path, list elements
// by [] and map entries by <name>, and leaves out fields config does not
// set.
func TestKeys(t *testing.T) {
	keys := config.Keys()
	for _, want := range []string{"listen", "proxy.retry_broken_connections", "balancer.ttft.prefill_rate", "auth.keys[].priority",
		"models[].targets[].weight", "engines.<name>.queued", "backends[].url", "backends[].labels"} {
		if !slices.Contains(keys, want) {
			t.Errorf("Keys() lacks %s", want)
		}
	}
	for _, k := range keys {
		if k == "balancer" || k == "backends" || strings.HasSuffix(k, "max_candidates") {
			t.Errorf("Keys() has %s, a section or a field config does not set", k)
		}
	}
}

// TestConfigYAMLNamesEveryKey: config.yaml is the reference of every key.
// It names each key the code defines ([config.Keys]) at its place, as a
// key or as a key of a commented-out example, and no key the code lacks.
func TestConfigYAMLNamesEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found := yamlKeys(string(b))
	keys := config.Keys()
	for _, k := range keys {
		if !slices.ContainsFunc(found, func(f yamlKey) bool { return keyMatch(f.path, k, false) }) {
			t.Errorf("config.yaml lacks %s", k)
		}
	}
	for _, f := range found {
		if !slices.ContainsFunc(keys, func(k string) bool { return keyMatch(f.path, k, true) }) {
			t.Errorf("config.yaml:%d: %s is no key of the code", f.line, f.path)
		}
	}
}

// TestConfigYAMLNamesEveryPolicy: the comment over config.yaml's
// balancer.policy names every policy serve accepts.
func TestConfigYAMLNamesEveryPolicy(t *testing.T) {
	b, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "  policy:") })
	if at < 0 {
		t.Fatal("config.yaml has no balancer.policy")
	}
	var words []string
	for i := at - 1; i >= 0 && strings.HasPrefix(strings.TrimSpace(lines[i]), "#"); i-- {
		words = append(words, strings.FieldsFunc(lines[i], func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
		})...)
	}
	for _, p := range balancer.PolicyNames() {
		if !slices.Contains(words, p) {
			t.Errorf("config.yaml's comment on balancer.policy does not name policy %s", p)
		}
	}
}

// TestConfigYAMLShowsDefaults: config.yaml's values outside backends,
// models and engines are the defaults.
func TestConfigYAMLShowsDefaults(t *testing.T) {
	cfg, err := config.Load("../../config.yaml", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	def := config.DefaultConfig()
	cfg.Backends, cfg.Models, cfg.Engines = def.Backends, def.Models, def.Engines
	got, want := reflect.ValueOf(cfg), reflect.ValueOf(def)
	for i := range got.NumField() {
		// %v prints an empty list as the defaults' nil one: [].
		if g, w := fmt.Sprintf("%+v", got.Field(i)), fmt.Sprintf("%+v", want.Field(i)); g != w {
			t.Errorf("config.yaml's %s is not the default:\n got %s\nwant %s", got.Type().Field(i).Name, g, w)
		}
	}
}

// yamlKey is a key found in config.yaml: its path as [config.Keys] writes
// it, map entries by their own names (engines.vllm.queued), and its line.
type yamlKey struct {
	path string
	line int
}

var (
	// keyLine is a line that opens a key, as a list element or not.
	keyLine = regexp.MustCompile(`^( *)(- +)?([a-z][a-z0-9_-]*):(?: |$)`)
	// flowItem is a list element written as a flow mapping, {a: 1, b: 2}.
	flowItem = regexp.MustCompile(`^( *)- +\{(.*)\}`)
	flowKey  = regexp.MustCompile(`([a-z][a-z0-9_-]*): `)
)

// yamlKeys returns the keys of a YAML file by their indentation, and those
// of its commented-out examples read as if the comment mark were not
// there ("  # - name: x" is "  - name: x"); so a line of prose must not
// start with a lower-case word and a colon.
func yamlKeys(text string) []yamlKey {
	type open struct {
		indent int
		path   string
		item   bool // a list element, "-"
	}
	var stack []open
	var out []yamlKey
	parent := func() string {
		if len(stack) == 0 {
			return ""
		}
		return stack[len(stack)-1].path + "."
	}
	for n, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, "#"); i >= 0 && strings.TrimSpace(line[:i]) == "" {
			line = line[:i] + strings.TrimPrefix(line[i+1:], " ")
		}
		m := keyLine.FindStringSubmatch(line)
		flow := flowItem.FindStringSubmatch(line)
		if m == nil && flow == nil {
			continue
		}
		var col int
		if m != nil {
			col = len(m[1])
		} else {
			col = len(flow[1])
		}
		if m != nil && m[2] == "" { // key: closes what is as deep or deeper
			for len(stack) > 0 && stack[len(stack)-1].indent >= col {
				stack = stack[:len(stack)-1]
			}
		} else { // - closes what is deeper and the element before it
			for len(stack) > 0 && stack[len(stack)-1].indent > col {
				stack = stack[:len(stack)-1]
			}
			if len(stack) > 0 && stack[len(stack)-1].item && stack[len(stack)-1].indent == col {
				stack = stack[:len(stack)-1]
			}
			stack = append(stack, open{indent: col, path: strings.TrimSuffix(parent(), ".") + "[]", item: true})
			if m != nil {
				col += len(m[2]) // the key sits after the "- "
			}
		}
		if flow != nil {
			for _, k := range flowKey.FindAllStringSubmatch(flow[2], -1) {
				out = append(out, yamlKey{parent() + k[1], n + 1})
			}
			continue
		}
		path := parent() + m[3]
		out = append(out, yamlKey{path, n + 1})
		stack = append(stack, open{indent: col, path: path})
	}
	return out
}

// keyMatch reports whether a path found in config.yaml is key, a
// "<name>" in key matching any one name. With within, a section or list
// holding key, or a name inside key's value, matches too.
func keyMatch(path, key string, within bool) bool {
	split := func(s string) []string { return strings.Split(strings.ReplaceAll(s, "[]", ".[]"), ".") }
	p, k := split(path), split(key)
	if !within && len(p) != len(k) {
		return false
	}
	for i := range min(len(p), len(k)) {
		if p[i] != k[i] && k[i] != "<name>" {
			return false
		}
	}
	return true
}

// TestConfigurationDocNamesEveryKey holds docs/configuration.md to the
// code: a row for every key [config.Keys] lists, its path in backticks
// in the first column, and no row for a key the code lacks.
func TestConfigurationDocNamesEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_.<>\\[\\]]+)` \\|").FindAllStringSubmatch(string(b), -1) {
		rows[m[1]] = true
	}
	keys := config.Keys()
	for _, k := range keys {
		if !rows[k] {
			t.Errorf("docs/configuration.md has no row for %s", k)
		}
	}
	for r := range rows {
		if !slices.Contains(keys, r) {
			t.Errorf("docs/configuration.md has a row for %s, which is no key", r)
		}
	}
}

// TestDisaggregatedConfigLoads: a fleet declared by role, prefill and
// decode, loads (issue 45: it was refused as unknown keys); a role that is
// none of the three is reported with its key.
func TestDisaggregatedConfigLoads(t *testing.T) {
	path := writeConfig(t, `
balancer:
  pd:
    min_uncached_tokens: 512
backends:
  - url: http://127.0.0.1:8001
    role: prefill
    engine: sglang
    bootstrap_port: 8998
  - url: http://127.0.0.1:8002
    role: decode
  - url: http://127.0.0.1:8003
    role: both
`)
	if _, stderr, err := validate(t, noEnv, path); err != nil {
		t.Fatalf("validate refused a config with roles: %v\n%s", err, stderr)
	}
	bad := writeConfig(t, `
balancer:
  pd:
    min_uncached_tokens: -1
backends:
  - url: http://127.0.0.1:8001
    role: prefil
    bootstrap_port: 70000
`)
	_, stderr, err := validate(t, noEnv, bad)
	if err == nil {
		t.Fatal("validate accepted a bad role")
	}
	for _, want := range []string{"backends[0].role:", "backends[0].bootstrap_port:", "balancer.pd.min_uncached_tokens:"} {
		if !strings.Contains(stderr, bad+": "+want) {
			t.Errorf("no problem reported for %s in:\n%s", want, stderr)
		}
	}
}
