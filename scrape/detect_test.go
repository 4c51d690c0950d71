package scrape

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/sim"
)

// TestDetectRealPages tells each captured page's engine (see
// testdata/README.md) from the page alone, and says nothing for pages that
// name no known engine.
func TestDetectRealPages(t *testing.T) {
	set := engineSet(t, nil)
	for _, tc := range []struct {
		name, page string // page: a file under testdata, or text
		wantEngine string
		wantBy     string
	}{
		{"vllm 0.7", "vllm-0.7-aibrix.txt", "vllm", "signals"},
		{"vllm 0.22", "vllm-0.22-excerpt.txt", "vllm", "signals"},
		{"vllm dp2 lora", "vllm-v1-dp2-lora.txt", "vllm", "signals"},
		{"sglang", "sglang-docs.txt", "sglang", "signals"},
		{"triton trtllm", "triton-trtllm.txt", "triton-tensorrt-llm", "signals"},
		{"trtllm-serve", "trtllm-serve.txt", "trtllm-serve", "signals"},
		// Triton serving a model without the TensorRT-LLM backend: its
		// nv_inference_* families, none of the row's nv_trt_llm_* signals.
		{"triton without trtllm", "text:nv_inference_request_success{model=\"m\",version=\"1\"} 4\nnv_inference_pending_request_count{model=\"m\",version=\"1\"} 0\n", "triton-tensorrt-llm", "families"},
		// A vLLM release whose gauges all have other names: still vLLM.
		{"vllm renamed gauges", "text:vllm:some_future_gauge 3\n", "vllm", "families"},
		{"process metrics only", "text:process_cpu_seconds_total 12.5\npython_gc_objects_collected_total{generation=\"0\"} 3\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := []byte(strings.TrimPrefix(tc.page, "text:"))
			if !strings.HasPrefix(tc.page, "text:") {
				b, err := os.ReadFile(filepath.Join("testdata", tc.page))
				if err != nil {
					t.Fatal(err)
				}
				page = b
			}
			d := set.Detect(page, time.Now())
			got := ""
			if d.Engine != nil {
				got = d.Engine.Name
			}
			if got != tc.wantEngine || d.By != tc.wantBy {
				t.Errorf("Detect = %q by %q, want %q by %q", got, d.By, tc.wantEngine, tc.wantBy)
			}
			if tc.wantBy == "signals" && len(d.Reading.Used) == 0 {
				t.Errorf("detected by signals with an empty reading")
			}
		})
	}
}

// autoTarget is testTarget for a backend whose engine is named (or auto).
func autoTarget(t *testing.T, bc BackendConfig, logger *slog.Logger) (*Target, *balancer.Balancer) {
	t.Helper()
	bal := testBalancer(t)
	m, err := NewManager(Setup{Config: DefaultConfig(), Backends: []BackendConfig{bc}, DefaultEngine: Auto, Balancer: bal, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	tg := m.running[bc.URL].target
	return tg, bal
}

func simServer(t *testing.T, engine string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(simHandler(t, engine))
	t.Cleanup(srv.Close)
	return srv
}

// simHandler is an emulated server of engine, serving model m.
func simHandler(t *testing.T, engine string) http.Handler {
	t.Helper()
	s, err := sim.NewServer(sim.ServerConfig{Engine: engine, Model: "m"}, sim.NewSteady(sim.SteadyConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	return s.Handler()
}

// TestAutoDetectsEachEmulatedEngine: with engine auto (the default) each
// of the four emulated engines is scraped with its own row from the first
// round, trtllm-serve at /prometheus/metrics although its /metrics answers
// JSON.
func TestAutoDetectsEachEmulatedEngine(t *testing.T) {
	for _, engine := range []string{"vllm", "sglang", "triton-tensorrt-llm", "trtllm-serve"} {
		t.Run(engine, func(t *testing.T) {
			srv := simServer(t, engine)
			var logs syncLog
			tg, bal := autoTarget(t, BackendConfig{URL: srv.URL}, logs.logger())
			if be := only(t, bal); be.Engine != Auto {
				t.Errorf("before the first round: engine %q, want %q", be.Engine, Auto)
			}
			tg.round(context.Background())
			be := only(t, bal)
			if be.Engine != engine {
				t.Fatalf("engine = %q, want %q\n%s", be.Engine, engine, logs.String())
			}
			if !be.Metrics.Queued.Known || !be.Metrics.KVUsage.Known || be.Stale {
				t.Errorf("metrics after detection: queued %v, kv %v, stale %v", be.Metrics.Queued, be.Metrics.KVUsage, be.Stale)
			}
			if be.Warning != "" {
				t.Errorf("warning = %q, want none", be.Warning)
			}
			tg.round(context.Background()) // read with the row now, not detected again
			if be := only(t, bal); be.Engine != engine || !be.Metrics.Queued.Known {
				t.Errorf("second round: engine %q, queued %v", be.Engine, be.Metrics.Queued)
			}
			if n := strings.Count(logs.String(), "backend engine detected"); n != 1 {
				t.Errorf("detection logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}

// TestDeclaredEngineMismatchReportedOnce is issue 18's third problem: a
// vLLM server declared sglang showed ready with no metrics and took
// traffic as if idle, silently. Now the mismatch is an error logged once,
// llmlb_backend_engine_mismatch is 1, the backend's warning (the status
// page's) says what to write, and the page is read as what it is. A vLLM
// declared on a trtllm-serve server (whose /metrics is JSON) likewise.
func TestDeclaredEngineMismatchReportedOnce(t *testing.T) {
	for _, tc := range []struct{ server, declared string }{
		{"vllm", "sglang"},
		{"sglang", "triton-tensorrt-llm"},
		{"trtllm-serve", "vllm"},
	} {
		t.Run(tc.server+" declared "+tc.declared, func(t *testing.T) {
			srv := simServer(t, tc.server)
			var logs syncLog
			tg, bal := autoTarget(t, BackendConfig{URL: srv.URL, Engine: tc.declared}, logs.logger())
			for range 4 {
				tg.round(context.Background())
			}
			be := only(t, bal)
			if be.Engine != tc.server || !be.Metrics.Queued.Known {
				t.Errorf("engine %q, queued %v: want read as %s", be.Engine, be.Metrics.Queued, tc.server)
			}
			if want := "declared engine " + tc.declared + ", but the server exposes " + tc.server + "'s metrics"; !strings.Contains(be.Warning, want) {
				t.Errorf("warning = %q, want it to contain %q", be.Warning, want)
			}
			if v := testutil.ToFloat64(tg.metrics.mismatch.WithLabelValues(srv.URL, tc.declared, tc.server)); v != 1 {
				t.Errorf("llmlb_backend_engine_mismatch = %v, want 1", v)
			}
			if n := strings.Count(logs.String(), "level=ERROR msg=\"backend engine contradicts its metrics"); n != 1 {
				t.Errorf("mismatch logged %d times, want once:\n%s", n, logs.String())
			}
			if strings.Contains(logs.String(), "lack a signal") {
				t.Errorf("the declared row's signals were reported missing beside the mismatch:\n%s", logs.String())
			}
		})
	}
}

// TestMismatchMetricGoesWithItsTarget: a reload that fixes the engine
// restarts the backend; the old target's mismatch series must not stay at
// 1 beside a corrected config.
func TestMismatchMetricGoesWithItsTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bn := newBubbleNet(t)
		url := bn.serve("gpu-0:8000", simHandler(t, "vllm"))
		bal := testBalancer(t)
		bc := BackendConfig{URL: url, Engine: "sglang"}
		m, err := NewManager(Setup{Config: DefaultConfig(), Backends: []BackendConfig{bc}, Balancer: bal, Client: bn.client})
		if err != nil {
			t.Fatal(err)
		}
		tg := m.running[url].target
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); tg.Run(ctx) }()
		waitFor(t, "the mismatch reported", func() bool {
			return testutil.CollectAndCount(tg.metrics.mismatch) == 1
		})
		cancel()
		<-done
		if n := testutil.CollectAndCount(tg.metrics.mismatch); n != 0 {
			t.Errorf("llmlb_backend_engine_mismatch has %d series after the target stopped, want 0", n)
		}
	})
}

// TestDeclaredEngineThatMatchesIsLeftAlone: a row that reads its page is
// never second-guessed, even one of the operator's own that another row
// would read better.
func TestDeclaredEngineThatMatchesIsLeftAlone(t *testing.T) {
	srv := simServer(t, "vllm")
	bal := testBalancer(t)
	set := engineSet(t, map[string]EngineConfig{"mine": {Queued: ptr("vllm:num_requests_waiting")}})
	m, err := NewManager(Setup{Config: DefaultConfig(), Backends: []BackendConfig{{URL: srv.URL, Engine: "mine"}}, Engines: set, Balancer: bal})
	if err != nil {
		t.Fatal(err)
	}
	tg := m.running[srv.URL].target
	tg.round(context.Background())
	if be := only(t, bal); be.Engine != "mine" || be.Warning != "" || !be.Metrics.Queued.Known {
		t.Errorf("engine %q, warning %q, queued %v: want mine, none, known", be.Engine, be.Warning, be.Metrics.Queued)
	}
}

// TestAutoFallsBackToModelOwner: a page that names no engine (a server
// behind a metrics relabelling proxy, say) leaves auto to the owned_by of
// the server's /v1/models; with neither, the backend is flagged once.
func TestAutoFallsBackToModelOwner(t *testing.T) {
	for _, tc := range []struct{ owner, want string }{{"sglang", "sglang"}, {"tensorrt_llm", "trtllm-serve"}, {"someone", Auto}} {
		t.Run(tc.owner, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/health":
				case "/v1/models":
					io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"`+tc.owner+`"}]}`)
				case "/metrics":
					io.WriteString(w, "process_cpu_seconds_total 1\n")
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			var logs syncLog
			tg, bal := autoTarget(t, BackendConfig{URL: srv.URL}, logs.logger())
			tg.round(context.Background())
			be := only(t, bal)
			if be.Engine != tc.want {
				t.Fatalf("engine = %q, want %q\n%s", be.Engine, tc.want, logs.String())
			}
			if tc.want != Auto {
				return
			}
			if !strings.Contains(be.Warning, "engine not detected") {
				t.Errorf("warning = %q, want engine not detected", be.Warning)
			}
			tg.detectedAt = time.Time{} // let the next round try again at once
			tg.round(context.Background())
			if n := strings.Count(logs.String(), "backend engine not detected"); n != 1 {
				t.Errorf("logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}

// TestAutoIsReserved: no engine row may be called auto.
func TestAutoIsReserved(t *testing.T) {
	if _, err := NewEngineSet(map[string]EngineConfig{Auto: {Queued: ptr("x")}}); err == nil || !strings.Contains(err.Error(), "engines.auto") {
		t.Errorf("NewEngineSet(auto) = %v, want an error naming engines.auto", err)
	}
}
