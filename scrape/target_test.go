package scrape

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/sim"
)

// testTarget builds a manager over one backend and returns its target,
// ready for rounds run by hand, and the balancer it publishes to.
func testTarget(t *testing.T, cfg Config, bc BackendConfig, logger *slog.Logger) (*Target, *balancer.Balancer) {
	t.Helper()
	bal := testBalancer(t)
	m, err := NewManager(Setup{Config: cfg, Backends: []BackendConfig{bc}, DefaultEngine: "vllm", Balancer: bal, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	tg := m.running[bc.URL].target
	return tg, bal
}

// round runs what Run does first: a probe, a scrape, a publish.
func (t *Target) round(ctx context.Context) {
	t.probeRound(ctx)
	t.scrape(ctx)
	t.publish()
}

func only(t *testing.T, bal *balancer.Balancer) *balancer.Backend {
	t.Helper()
	bs := bal.Snapshot().Backends
	if len(bs) != 1 {
		t.Fatalf("snapshot has %d backends, want 1", len(bs))
	}
	return bs[0]
}

// TestModelsAndAdaptersLearnedFromVLLM runs discovery against the emulated
// vLLM, whose /v1/models lists adapters with their parent as vLLM does.
func TestModelsAndAdaptersLearnedFromVLLM(t *testing.T) {
	s, err := sim.NewServer(sim.ServerConfig{Model: "llama-3.1-8b", Adapters: []string{"sql-lora", "chat-lora"}}, sim.NewSteady(sim.SteadyConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	tg, bal := testTarget(t, DefaultConfig(), BackendConfig{URL: srv.URL}, nil)
	if be := only(t, bal); be.State != balancer.StateUnknown || be.ModelsKnown() {
		t.Fatalf("before the first probe: state %v, models %v", be.State, be.Models)
	}
	tg.round(context.Background())
	be := only(t, bal)
	if be.State != balancer.StateReady {
		t.Errorf("state = %v, want ready", be.State)
	}
	if !slices.Equal(be.Models, []string{"llama-3.1-8b"}) {
		t.Errorf("models = %v", be.Models)
	}
	want := []balancer.Adapter{{Name: "chat-lora", Parent: "llama-3.1-8b"}, {Name: "sql-lora", Parent: "llama-3.1-8b"}}
	if !slices.Equal(be.Adapters, want) {
		t.Errorf("adapters = %v, want %v", be.Adapters, want)
	}
	if be.Engine != "vllm" {
		t.Errorf("engine = %q, want the default", be.Engine)
	}
}

// TestHealthTransitions walks a backend through up, one failed probe (still
// up), a second (down, logged once), more failures (no new log) and recovery.
func TestHealthTransitions(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	var modelCalls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			if !healthy.Load() {
				http.Error(w, "engine dead", http.StatusInternalServerError)
			}
		case "/v1/models":
			modelCalls.Add(1)
			w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model","parent":null}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := DefaultConfig()
	cfg.UnhealthyAfter = 2
	tg, bal := testTarget(t, cfg, BackendConfig{URL: srv.URL, HealthPath: "/healthz"}, logger)
	ctx := context.Background()

	tg.round(ctx)
	if s := only(t, bal).State; s != balancer.StateReady {
		t.Fatalf("state = %v, want ready", s)
	}
	healthy.Store(false)
	tg.round(ctx)
	if s := only(t, bal).State; s != balancer.StateReady {
		t.Fatalf("after one failure: %v, want still ready", s)
	}
	for range 3 {
		tg.round(ctx)
	}
	if s := only(t, bal).State; s != balancer.StateDown {
		t.Fatalf("after four failures: %v, want down", s)
	}
	if n := strings.Count(logs.String(), "backend down"); n != 1 {
		t.Errorf("'backend down' logged %d times, want once:\n%s", n, logs.String())
	}
	healthy.Store(true)
	tg.round(ctx)
	if s := only(t, bal).State; s != balancer.StateReady {
		t.Errorf("after recovery: %v, want ready", s)
	}
	if n := modelCalls.Load(); n != 1 {
		t.Errorf("/v1/models fetched %d times within the refresh interval, want 1", n)
	}
}

// TestConfiguredModelsAreNotDiscovered: a backend with models in config is
// never asked for /v1/models, and its list is the configured one.
func TestConfiguredModelsAreNotDiscovered(t *testing.T) {
	var modelCalls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			modelCalls.Add(1)
		}
	}))
	defer srv.Close()
	tg, bal := testTarget(t, DefaultConfig(), BackendConfig{URL: srv.URL, Models: []string{"a", "b"}}, nil)
	if be := only(t, bal); !slices.Equal(be.Models, []string{"a", "b"}) {
		t.Fatalf("models before probing = %v", be.Models)
	}
	tg.round(context.Background())
	if modelCalls.Load() != 0 {
		t.Error("/v1/models was fetched for a backend with configured models")
	}
	if be := only(t, bal); be.State != balancer.StateReady || !slices.Equal(be.Models, []string{"a", "b"}) {
		t.Errorf("state %v models %v", be.State, be.Models)
	}
}

// TestBadModelListsKeepTheLastGoodOne: garbage, errors and wrong shapes from
// /v1/models are logged once and never erase what was learned.
func TestBadModelListsKeepTheLastGoodOne(t *testing.T) {
	var body atomic.Value
	body.Store(`{"data":[{"id":"m"},{"id":"lora-1","parent":"m"}]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			b := body.Load().(string)
			if b == "500" {
				http.Error(w, "boom", 500)
				return
			}
			w.Write([]byte(b))
		}
	}))
	defer srv.Close()
	var logs bytes.Buffer
	cfg := DefaultConfig()
	cfg.ModelsInterval = 1 // every round refreshes
	tg, bal := testTarget(t, cfg, BackendConfig{URL: srv.URL}, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	tg.round(ctx)
	for _, bad := range []string{"not json", `{"data":`, "500", `["a"]`} {
		body.Store(bad)
		tg.round(ctx)
		be := only(t, bal)
		if !slices.Equal(be.Models, []string{"m"}) || len(be.Adapters) != 1 {
			t.Errorf("after %q: models %v adapters %v, want the last good lists", bad, be.Models, be.Adapters)
		}
	}
	if n := strings.Count(logs.String(), "model discovery failing"); n != 1 {
		t.Errorf("failure logged %d times, want once", n)
	}
	body.Store(`{"data":[{"id":"m2"}]}`)
	tg.round(ctx)
	if be := only(t, bal); !slices.Equal(be.Models, []string{"m2"}) || len(be.Adapters) != 0 {
		t.Errorf("after recovery: %v %v", be.Models, be.Adapters)
	}
	if !strings.Contains(logs.String(), "model discovery recovered") {
		t.Error("recovery not logged")
	}
}

func TestValidateBackendsNamesEachField(t *testing.T) {
	err := ValidateBackends([]BackendConfig{
		{URL: "http://a:8000"},
		{URL: "http://A:8000/"},
		{URL: "ftp://b"},
		{},
		{URL: "http://c", Engine: "vlm", Models: []string{""}, HealthPath: "health"},
		{DNS: "vllm.internal"},
		{SRV: "_vllm._tcp.internal", Ports: []int{8000}},
		{DNS: "x", Ports: []int{8000, 70000}, ActivePorts: map[string][]int{"10.0.0.1": {8001}}, Scheme: "ftp"},
		{URL: "http://d", DNS: "d"},
		{URL: "http://e", Ports: []int{1}},
		{URL: "http://f", Name: "gpu-a"},
		{URL: "http://g", Name: "gpu-a"},
		{URL: "http://h", Name: "b7"},
		{URL: "http://i", Name: "http://i"},
		{DNS: "j", Ports: []int{1}, Name: "pool"},
	}, engineSet(t, nil).Names())
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"backends[1].url: \"http://A:8000/\" is the same backend as backends[0]",
		"backends[2].url:",
		"backends[3]: needs one of url, dns or srv",
		"backends[5].ports: dns \"vllm.internal\" needs the ports",
		"backends[6].ports: srv records carry their own ports",
		"backends[7].ports: 70000 is not a port",
		"backends[7].active_ports[10.0.0.1]: 8001 is not one of ports",
		"backends[7].scheme: must be http or https",
		"backends[8]: give only one of url, dns or srv",
		"backends[9].ports: only for dns or srv backends",
		"backends[4].engine: unknown engine \"vlm\"",
		"backends[4].models[0]: must not be empty",
		"backends[4].health_path: must start with /",
		"backends[11].name: \"gpu-a\" is backends[10]'s name too",
		"backends[12].name: must be 1 to 64 letters, digits, '.', '_' or '-', and not b followed by digits",
		"backends[13].name: must be",
		"backends[14].name: only for url backends",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	if err := ValidateBackends([]BackendConfig{{URL: "https://x:1", Engine: "sglang", Name: "h100-0"}, {URL: "http://y", Name: "b"}, {URL: "http://z", Name: "b1x"}, {DNS: "vllm", Ports: []int{8000}}, {SRV: "_v._tcp.x"}}, engineSet(t, nil).Names()); err != nil {
		t.Errorf("valid backend refused: %v", err)
	}
}

func TestValidateConfig(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	err := Config{HealthPath: "x"}.Validate()
	for _, f := range []string{"health_path", "health_interval", "timeout", "unhealthy_after", "models_interval", "interval", "scrape_timeout", "stale_after", "dns_interval"} {
		if err == nil || !strings.Contains(err.Error(), "scrape."+f+":") {
			t.Errorf("no error for scrape.%s in %v", f, err)
		}
	}
}

// TestMissingSignalReportedOnce: a signal the page never has is logged once
// and shown by llmlb_scrape_signal_missing, however many scrapes find it
// absent. LoRA is not expected: no adapters are known.
func TestMissingSignalReportedOnce(t *testing.T) {
	var queue atomic.Int64
	var page atomic.Value
	srv := httptest.NewServer(fakeVLLM(&queue, &page))
	defer srv.Close()
	var logs bytes.Buffer
	tg, _ := testTarget(t, DefaultConfig(), BackendConfig{URL: srv.URL, Models: []string{"m"}}, slog.New(slog.NewTextHandler(&logs, nil)))
	for range 5 {
		tg.round(context.Background())
	}
	for _, sig := range []string{"block_size", "num_blocks"} {
		if n := strings.Count(logs.String(), "signal="+sig+" "); n != 1 {
			t.Errorf("missing %s logged %d times, want once:\n%s", sig, n, logs.String())
		}
		if v := testutil.ToFloat64(tg.metrics.missing.WithLabelValues(srv.URL, sig)); v != 1 {
			t.Errorf("llmlb_scrape_signal_missing{signal=%q} = %v, want 1", sig, v)
		}
	}
	if strings.Contains(logs.String(), "signal=queued") {
		t.Error("a present signal was reported missing")
	}
}

// TestLoRAExpectedOnlyWithAdapters is issue 18's fourth problem: every vLLM
// server without adapters logged "signal missing" for lora and held
// llmlb_scrape_signal_missing{signal="lora"} at 1. LoRA information is
// expected from a server whose /v1/models lists adapters (entries with a
// parent), and only while it does.
func TestLoRAExpectedOnlyWithAdapters(t *testing.T) {
	// The emulated vLLM renders vllm:lora_requests_info only with adapters,
	// as vLLM registers it only with LoRA enabled.
	s, err := sim.NewServer(sim.ServerConfig{Model: "m"}, sim.NewSteady(sim.SteadyConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	plain := httptest.NewServer(s.Handler())
	defer plain.Close()
	var logs syncLog
	tg, _ := testTarget(t, DefaultConfig(), BackendConfig{URL: plain.URL}, logs.logger())
	for range 3 {
		tg.round(context.Background())
	}
	if strings.Contains(logs.String(), "signal=lora") {
		t.Errorf("lora reported missing for a server with no adapters:\n%s", logs.String())
	}
	if n := testutil.CollectAndCount(tg.metrics.missing); n != 0 {
		t.Errorf("llmlb_scrape_signal_missing has %d series for a server missing nothing expected, want 0", n)
	}

	// A server that lists an adapter but whose page has no LoRA info
	// (LoRA left out of a custom engine row's page, say) is reported.
	var queue atomic.Int64
	var page atomic.Value
	var adapters atomic.Bool
	adapters.Store(true)
	metrics := fakeVLLM(&queue, &page)
	lora := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			metrics.ServeHTTP(w, r)
			return
		}
		if adapters.Load() {
			io.WriteString(w, `{"data":[{"id":"m"},{"id":"sql-lora","parent":"m"}]}`)
		} else {
			io.WriteString(w, `{"data":[{"id":"m"}]}`)
		}
	}))
	defer lora.Close()
	cfg := DefaultConfig()
	cfg.ModelsInterval = time.Nanosecond // learn the model list on every round
	tg, _ = testTarget(t, cfg, BackendConfig{URL: lora.URL}, logs.logger())
	for range 3 {
		tg.round(context.Background())
	}
	if n := strings.Count(logs.String(), "signal=lora"); n != 1 {
		t.Errorf("lora missing from a server with adapters logged %d times, want once:\n%s", n, logs.String())
	}
	if v := testutil.ToFloat64(tg.metrics.missing.WithLabelValues(lora.URL, SignalLoRA)); v != 1 {
		t.Errorf("llmlb_scrape_signal_missing{signal=\"lora\"} = %v with adapters, want 1", v)
	}
	adapters.Store(false)
	tg.round(context.Background())
	if v := testutil.ToFloat64(tg.metrics.missing.WithLabelValues(lora.URL, SignalLoRA)); v != 0 {
		t.Errorf("llmlb_scrape_signal_missing{signal=\"lora\"} = %v once the adapters went, want 0", v)
	}
	if strings.Contains(logs.String(), "present again") {
		t.Errorf("lora logged present again though the page still lacks it:\n%s", logs.String())
	}
}

// testBalancer returns a balancer with the default policy and no prefix
// index: the scrape tests look only at what reaches its snapshot.
func testBalancer(t testing.TB) *balancer.Balancer {
	t.Helper()
	bal, err := balancer.New(balancer.DefaultConfig(), balancer.Deps{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bal
}

// TestValidateBackendURLExplainsMistakes: the two URL mistakes operators
// make (issue 18) are answered in our words with the fix, not url.Parse's.
func TestValidateBackendURLExplainsMistakes(t *testing.T) {
	tests := []struct {
		name, url, want string
	}{
		{"no scheme", "127.0.0.1:8001", `backends[0].url: "127.0.0.1:8001" has no scheme; write it as "http://127.0.0.1:8001"`},
		{"no scheme, host name", "localhost:8001", `backends[0].url: "localhost:8001" has no scheme; write it as "http://localhost:8001"`},
		{"ends in /v1", "http://127.0.0.1:8001/v1", `backends[0].url: "http://127.0.0.1:8001/v1" ends in /v1: give the server's base URL, "http://127.0.0.1:8001"`},
		{"ends in /v1/", "https://gpu-1:8000/v1/", `backends[0].url: "https://gpu-1:8000/v1/" ends in /v1: give the server's base URL, "https://gpu-1:8000"`},
		{"/v1 under a prefix", "http://gw/vllm/v1", `base URL, "http://gw/vllm"`},
		{"bad port", "http://h:port", `backends[0].url: "http://h:port" is not a URL: invalid port`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateBackends([]BackendConfig{{URL: tc.url}}, engineSet(t, nil).Names())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ValidateBackends(%q) = %v, want it to contain %q", tc.url, err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "first path segment") {
				t.Errorf("ValidateBackends(%q) = %v, url.Parse's words", tc.url, err)
			}
		})
	}
	for _, ok := range []string{"http://127.0.0.1:8001", "http://h/v1beta", "http://h/api/v10"} {
		if err := ValidateBackends([]BackendConfig{{URL: ok}}, engineSet(t, nil).Names()); err != nil {
			t.Errorf("ValidateBackends(%q) = %v, want nil", ok, err)
		}
	}
}
