package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/overhead"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// TestBenchTargetCommand replays a workload over HTTP through a running
// balancer in front of two emulated servers on the engine model: both
// serve, the table and the JSON are written, nothing fails.
func TestBenchTargetCommand(t *testing.T) {
	ecfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range 2 {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewLive(ecfg, 50))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin.Listen, cfg.Log.Level = "127.0.0.1:0", "", "warn"
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, scrape.BackendConfig{URL: u})
	}
	inst, err := serve.Start(t.Context(), cfg, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Wait() })
	// Ready when both servers' models are learned.
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get("http://" + inst.Addr + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), testModel) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/models lists no model after 10s: %s", b)
		}
		<-time.After(20 * time.Millisecond)
	}
	dir := t.TempDir()
	args := []string{"bench", "--target", "http://" + inst.Addr, "--workload", "burst", "--scale", "0.03", "--rate", "4",
		"--backends", "3", "--quiet", "--json", dir + "/t.json"}
	out, errb, err := runCmd(t, noEnv, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb)
	}
	if !strings.Contains(out, "burst:") || !strings.Contains(out, "target") {
		t.Errorf("table:\n%s", out)
	}
	b, err := os.ReadFile(dir + "/t.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workloads []struct {
			Backends int `json:"backends"`
			Results  []struct {
				Policy    string  `json:"policy"`
				Failed    int     `json:"failed"`
				Refused   int     `json:"refused"`
				Imbalance float64 `json:"imbalance"`
				HitRate   float64 `json:"hit_rate"`
				TTFTP50   float64 `json:"ttft_p50"`
			} `json:"results"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Workloads) != 1 || len(rep.Workloads[0].Results) != 1 {
		t.Fatalf("json %s: %v", b, err)
	}
	w, r := rep.Workloads[0], rep.Workloads[0].Results[0]
	// Three backends claimed, two exist: the third's zero counts, so the
	// busiest is at least 1.5x the mean.
	if w.Backends != 3 || r.Policy != "target" || r.Failed != 0 || r.Refused != 0 || r.Imbalance < 1.5 || !(r.HitRate > 0) || !(r.TTFTP50 > 0) {
		t.Errorf("%s", b)
	}
}

// TestOverheadCommand runs a short `llmlb overhead`: every scenario
// through a direct connection, through llmlb (this binary, run as
// `llmlb serve`) and through Go's bare reverse proxy (this binary, run as
// `llmlb overhead --go-proxy`) answers without errors; HAProxy and nginx rows run too
// where they are installed, and must (LLMLB_REQUIRE_PROXIES=1, as CI
// sets) where the test is told they are.
func TestOverheadCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts llmlb and Go proxy processes for seconds; make test runs it")
	}
	t.Setenv("LLMLBTEST_RUN_MAIN", "1")
	dir := t.TempDir()
	var out, errb strings.Builder
	args := []string{"overhead", "--duration", "300ms", "--scale", "0.05", "--quiet", "--llmlb", os.Args[0], "--json", dir + "/o.json"}
	if err := run(context.Background(), args, os.Environ(), &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	t.Log("\n" + out.String())
	b, err := os.ReadFile(dir + "/o.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep overhead.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			t.Logf("%s skipped: %s", r.Proxy, r.Skipped)
			continue
		}
		ran[r.Proxy] = true
		if len(r.Cells) != 5 {
			t.Errorf("%s: %d cells", r.Proxy, len(r.Cells))
		}
		for _, c := range r.Cells {
			// The go row is a reference, Go's bare reverse proxy; on a busy
			// machine it has aborted a stream or two after the long chats
			// (unexpected EOF at the client, cause not found). Its errors
			// are in the table; every other row must have none.
			if r.Proxy == "go" && c.Errors != 0 {
				t.Logf("go %s: %d errors (%s)", c.Scenario, c.Errors, c.FirstError)
				c.Errors = 0
			}
			if c.Requests == 0 || c.Errors != 0 || !(c.P50 > 0) {
				t.Errorf("%s %s: %+v", r.Proxy, c.Scenario, c)
			}
			if c.Scenario == "streams" && !(c.EventsPerS > 0 && c.TTFTP50 > 0) {
				t.Errorf("%s streams: %+v", r.Proxy, c)
			}
		}
	}
	if !ran["direct"] || !ran["llmlb"] || !ran["go"] {
		t.Errorf("rows run: %v", ran)
	}
	if os.Getenv("LLMLB_REQUIRE_PROXIES") == "1" && (!ran["haproxy"] || !ran["nginx"]) {
		t.Errorf("LLMLB_REQUIRE_PROXIES=1 but rows run: %v", ran)
	}
	for _, want := range []string{"proxy", "added p50", "streams ttft p50", "direct", "llmlb", "go "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
}

// TestProbeErrors: a missing file, an unknown engine and a JSON page each
// give a clear error.
func TestProbeErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"probe", "/nonexistent/page.txt"}, "no such file"},
		{[]string{"probe", "--engine", "vlm", "x"}, `unknown engine "vlm"`},
		{[]string{"probe"}, "one URL or file"},
	} {
		_, _, err := runCmd(t, noEnv, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
	s, _ := sim.NewServer(sim.ServerConfig{Engine: "trtllm-serve", Model: "m"}, sim.NewSteady(sim.SteadyConfig{}))
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	_, _, err := runCmd(t, noEnv, "probe", "--engine", "trtllm-serve", srv.URL+"/metrics")
	if err == nil || !strings.Contains(err.Error(), "/prometheus/metrics") {
		t.Errorf("probing trtllm-serve's JSON /metrics: %v, want a hint at /prometheus/metrics", err)
	}
}
