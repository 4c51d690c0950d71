package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
    cold_room: 2
    cold_backlog: -1
    step_tokens: 0
  saturation:
    holder_queue: -1
backends:
  - url: 127.0.0.1:8001
    engine: vlm
`)
	_, stderr, err := validate(t, noEnv, path)
	if err == nil {
		t.Fatal("validate accepted bad values")
	}
	for _, want := range []string{"listen:", "default_engine:", "log.level:", "proxy.max_attempts:", "proxy.retry_statuses:",
		"scrape.health_path:", "balancer.ttft.cold_room:", "balancer.ttft.cold_backlog:", "balancer.ttft.step_tokens:", "balancer.saturation.holder_queue:", "backends[0].url:", "backends[0].engine:"} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("no problem reported for %s in:\n%s", want, stderr)
		}
	}
}

// TestShippedConfigsValidate: config.yaml and every config in examples/
// validate as written.
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
		stdout, stderr, err := validate(t, noEnv, f)
		if err != nil || !strings.Contains(stdout, f+": ok") {
			t.Errorf("%s: %v\n%s", f, err, stderr)
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

// validate loads path as `llmlb validate` does and returns the error and
// what that command would print: "PATH: ok (N backends)" to stdout, or
// every problem to stderr.
func validate(t *testing.T, env config.Environ, path string) (stdout, stderr string, err error) {
	t.Helper()
	cfg, err := config.Load(path, env)
	if err != nil {
		return "", err.Error() + "\n", err
	}
	return fmt.Sprintf("%s: ok (%d backends)\n", path, len(cfg.Backends)), "", nil
}
