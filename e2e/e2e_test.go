package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

const testModel = "llama-3.1-8b"

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

// simBackends starts n emulated vLLM servers and returns their URLs.
func simBackends(t *testing.T, n int, sc sim.SteadyConfig, adapters ...string) []string {
	t.Helper()
	var urls []string
	for range n {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel, Adapters: adapters}, sim.NewSteady(sc))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls
}

func testConfig(urls []string) config.Config {
	cfg := config.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Log.Level = "warn"
	cfg.Scrape.HealthInterval = 100 * time.Millisecond
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, scrape.BackendConfig{URL: u})
	}
	return cfg
}

// startTest runs the balancer for cfg until the test ends, then checks it
// shut down cleanly; it returns once n backends are ready.
func startTest(t *testing.T, cfg config.Config, n int) *serve.Instance {
	t.Helper()
	return startSource(t, cfg, nil, n)
}

// startSource is startTest with a config source to reload from.
func startSource(t *testing.T, cfg config.Config, src *serve.Source, n int) *serve.Instance {
	t.Helper()
	return startWith(t, cfg, src, io.Discard, n)
}

// startLogged is startTest that keeps the instance's log.
func startLogged(t *testing.T, cfg config.Config, n int) (*serve.Instance, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	return startWith(t, cfg, nil, logs, n), logs
}

// startWith is startSource writing the instance's log to stderr.
func startWith(t *testing.T, cfg config.Config, src *serve.Source, stderr io.Writer, n int) *serve.Instance {
	t.Helper()
	inst, err := serve.Start(t.Context(), cfg, src, stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := inst.Wait(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	e2etest.WaitBackends(t, inst.AdminAddr, n)
	return inst
}

// backendNames maps the names clients see in x-llmlb-backend to the
// backends' URLs, from /debug/backends.
func backendNames(t *testing.T, adminAddr string) map[string]string {
	t.Helper()
	return backendField(t, adminAddr, func(b proxy.BackendStatus) (string, string) { return b.Name, b.URL })
}

// backendField maps each backend of /debug/backends by kv's key to its
// value.
func backendField(t *testing.T, adminAddr string, kv func(proxy.BackendStatus) (string, string)) map[string]string {
	t.Helper()
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, b := range bs {
		k, v := kv(b)
		out[k] = v
	}
	return out
}

// waitFor looks at a live system every 20 ms until done reports true, and
// reports whether it did within d. It waits for an outcome and never
// measures one, so d is generous: a slow machine makes a test slower, not
// red.
func waitFor(d time.Duration, done func() bool) bool {
	deadline := time.After(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case <-deadline:
			return done()
		case <-tick.C:
		}
	}
	return true
}

func TestDebugBackendsJSONShape(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100})
	inst := startTest(t, testConfig(urls), 1)
	resp, err := http.Get("http://" + inst.AdminAddr + "/debug/backends")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Backends []map[string]any `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Backends) != 1 {
		t.Fatalf("%d backends", len(doc.Backends))
	}
	for _, k := range []string{"url", "engine", "models", "state", "in_flight"} {
		if _, ok := doc.Backends[0][k]; !ok {
			t.Errorf("/debug/backends lacks %q: %v", k, doc.Backends[0])
		}
	}
}

// TestDiscoveryAndEnginesConfig: dns, srv, active_ports keyed by an address
// (dots and all) and an engines: section decode as written.
func TestDiscoveryAndEnginesConfig(t *testing.T) {
	path := writeConfig(t, `
listen: 127.0.0.1:8080
engines:
  my-engine:
    metrics_path: /stats
    queued: 'my_queue{pool="main"}'
    kv_usage: ""
backends:
  - dns: vllm.internal
    ports: [8000, 8001]
    active_ports:
      10.0.0.5: [8000]
    engine: my-engine
  - srv: _sglang._tcp.internal
    engine: sglang
    refresh_interval: 5s
`)
	cfg, err := config.Load(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Backends
	if got := b[0].ActivePorts["10.0.0.5"]; len(got) != 1 || got[0] != 8000 {
		t.Errorf("active_ports = %v", b[0].ActivePorts)
	}
	if b[1].SRV != "_sglang._tcp.internal" || b[1].RefreshInterval != 5*time.Second {
		t.Errorf("srv entry = %+v", b[1])
	}
	e := cfg.Engines["my-engine"]
	if e.MetricsPath == nil || *e.MetricsPath != "/stats" || e.KVUsage == nil || *e.KVUsage != "" || e.Running != nil {
		t.Errorf("engines.my-engine = %+v", e)
	}
	bad := writeConfig(t, "listen: 127.0.0.1:8080\nengines:\n  sglang:\n    queued: 'x{'\nbackends:\n  - url: http://a:1\n    engine: nope\n")
	_, err = config.Load(bad, noEnv)
	for _, want := range []string{"engines.sglang.queued", `backends[0].engine: unknown engine "nope"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to name %s", err, want)
		}
	}
}
