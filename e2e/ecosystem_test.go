package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/doccheck"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// The tests in this file run llmlb against the real tools operators put
// beside it: Prometheus and promtool from Debian's prometheus package, and
// the official OpenAI Node SDK. Each skips when its tool is absent, unless
// the LLMLB_REQUIRE_* variable named in its helper is set: .ci/run installs
// the tools and sets them, so CI never skips.

// tool finds name on PATH; when it is absent the test fails if env is set,
// else it is skipped.
func tool(t *testing.T, name, env, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv(env) != "" {
		t.Fatalf("%s not found, and %s is set (%s)", name, env, install)
	}
	t.Skipf("%s not installed (%s)", name, install)
	return ""
}

// busyFleet starts llmlb in front of three emulated vLLM servers and one
// that answers 503 to every request (so retries and ejections happen) and
// fails one metrics scrape in five (so scrape errors do), and drives
// traffic through it until the test ends: streamed chats that share a
// system prompt, with and without usage, and plain completions. It
// returns the running instance.
func busyFleet(t *testing.T) *serve.Instance {
	t.Helper()
	sc := sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000}
	urls := simBackends(t, 3, sc)
	s4, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sc))
	if err != nil {
		t.Fatal(err)
	}
	h4 := s4.Handler()
	var scrapes atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost:
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
		case r.URL.Path == "/metrics" && scrapes.Add(1)%5 == 0:
			http.Error(w, "busy", http.StatusInternalServerError)
		default:
			h4.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(failing.Close)
	cfg := testConfig(append(urls, failing.URL))
	cfg.Balancer.Passive.EjectBackoff = 500 * time.Millisecond
	// Every backend first in turn, so the failing one fails five requests
	// in a row and is ejected; the default policy learns from its first
	// failure to avoid it, and an ejection would never come.
	cfg.Balancer.Policy = "round-robin"
	inst := startTest(t, cfg, 4)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				var body map[string]any
				switch i % 3 {
				case 0, 1:
					body = map[string]any{"model": testModel, "stream": true, "max_tokens": 4,
						"messages": []map[string]string{
							{"role": "system", "content": strings.Repeat("You are a careful assistant. ", 40)},
							{"role": "user", "content": fmt.Sprintf("question %d from client %d", i, w)},
						}}
					if i%3 == 0 {
						body["stream_options"] = map[string]any{"include_usage": true}
					}
				default:
					body = map[string]any{"model": testModel, "prompt": fmt.Sprintf("once upon a time %d", i), "max_tokens": 4}
				}
				path := "/v1/chat/completions"
				if body["prompt"] != nil {
					path = "/v1/completions"
				}
				b, _ := json.Marshal(body)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+inst.Addr+path, bytes.NewReader(b))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
	}
	return inst
}

// TestPromtoolCheckMetrics: llmlb's /metrics, after real traffic (every
// family with series), passes `promtool check metrics`, Prometheus's own
// lint of metric names, types, units and help.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := tool(t, "promtool", "LLMLBTEST_REQUIRE_PROMETHEUS", "apt-get install prometheus")
	inst := busyFleet(t)
	<-time.After(2 * time.Second) // retries, an ejection, a failed scrape
	resp, err := http.Get("http://" + inst.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"llmlb_requests_total", "llmlb_time_to_first_token_seconds_bucket", "llmlb_retries_total", "llmlb_scrape_errors_total"} {
		if !bytes.Contains(page, []byte("\n"+fam+"{")) {
			t.Errorf("/metrics has no %s series: the lint would not see it", fam)
		}
	}
	cmd := exec.CommandContext(t.Context(), promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(page)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// dashboardQueries returns every PromQL expression of the Grafana
// dashboard in examples/, with its panel title.
func dashboardQueries(t *testing.T) [][2]string {
	t.Helper()
	return doccheck.DashboardQueries(t, filepath.Join("..", "examples", "grafana-dashboard.json"))
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// promAPI is Prometheus's HTTP API at base.
type promAPI struct{ base string }

// get GETs path with query and decodes the data field of a success answer.
func (p promAPI) get(ctx context.Context, path string, q url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: status %d: %w", path, resp.StatusCode, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s %s: %s", path, q.Encode(), env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

var (
	metricName = regexp.MustCompile(`\bllmlb_[a-zA-Z0-9_]+`)
	byLabels   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	matchers   = regexp.MustCompile(`\{([^}]*)\}`)
	matcherKey = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// queryLabels returns the label names expr groups by or matches on.
func queryLabels(expr string) []string {
	var out []string
	for _, m := range byLabels.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	for _, m := range matchers.FindAllStringSubmatch(expr, -1) {
		for _, k := range matcherKey.FindAllStringSubmatch(m[1], -1) {
			out = append(out, k[1])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestGrafanaDashboardQueriesReturnData runs Debian's Prometheus against a
// busy llmlb and asks its HTTP API every query of examples/
// grafana-dashboard.json: each metric a query names must exist, each label
// it groups by or matches on must be on that metric's series, and each
// query must return data. A renamed metric or label fails here.
func TestGrafanaDashboardQueriesReturnData(t *testing.T) {
	bin := tool(t, "prometheus", "LLMLBTEST_REQUIRE_PROMETHEUS", "apt-get install prometheus")
	queries := dashboardQueries(t)
	inst := busyFleet(t)

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: llmlb\n    static_configs:\n      - targets: [%q]\n", inst.AdminAddr)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	api := promAPI{base: fmt.Sprintf("http://127.0.0.1:%d", port)}

	// Grafana's $__rate_interval is at least four scrape intervals; with
	// 1 s scrapes, 10 s holds enough samples for every rate.
	expand := func(expr string) string {
		return strings.NewReplacer("$__rate_interval", "10s", "$__interval", "1s", "$__range", "10s").Replace(expr)
	}
	type sample struct {
		Metric map[string]string `json:"metric"`
	}
	type vector struct {
		ResultType string   `json:"resultType"`
		Result     []sample `json:"result"`
	}
	var failures []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		failures = failures[:0]
		for _, q := range queries {
			var v vector
			if err := api.get(t.Context(), "/api/v1/query", url.Values{"query": {expand(q[1])}}, &v); err != nil {
				failures = append(failures, fmt.Sprintf("%s: %s: %v", q[0], q[1], err))
			} else if len(v.Result) == 0 {
				failures = append(failures, fmt.Sprintf("%s: %s: no data", q[0], q[1]))
			}
		}
		if len(failures) == 0 || time.Now().After(deadline) {
			break
		}
		<-time.After(time.Second)
	}
	for _, f := range failures {
		t.Error(f)
	}

	// Names and labels, checked apart: a query can return data (a sum
	// over nothing, a grouping by a label nobody has) while naming
	// something gone.
	for _, q := range queries {
		have := map[string]bool{"job": true, "instance": true}
		for _, name := range slices.Compact(slices.Sorted(slices.Values(metricName.FindAllString(q[1], -1)))) {
			var series []map[string]string
			if err := api.get(t.Context(), "/api/v1/series", url.Values{"match[]": {name}}, &series); err != nil {
				t.Errorf("%s: series %s: %v", q[0], name, err)
				continue
			}
			if len(series) == 0 {
				t.Errorf("%s: %s names %s, which llmlb does not export", q[0], q[1], name)
			}
			for _, s := range series {
				for l := range s {
					have[l] = true
				}
			}
		}
		for _, l := range queryLabels(q[1]) {
			if !have[l] {
				t.Errorf("%s: %s uses label %q, which none of its metrics' series has", q[0], q[1], l)
			}
		}
	}
	if t.Failed() {
		t.Logf("prometheus log:\n%s", logs.String())
	}
}

// TestDashboardLabelParsing holds the label extraction the dashboard test
// relies on.
func TestDashboardLabelParsing(t *testing.T) {
	got := queryLabels(`histogram_quantile(0.9, sum by (le, backend) (rate(x_bucket{backend!="none",model=~"a.*"}[5m]))) / sum without(instance)(y)`)
	if want := []string{"backend", "instance", "le", "model"}; !slices.Equal(got, want) {
		t.Errorf("queryLabels = %v, want %v", got, want)
	}
}

// nodeSDK returns the directory holding the official OpenAI Node SDK,
// installing it there with npm when it is missing.
func nodeSDK(t *testing.T) string {
	t.Helper()
	tool(t, "node", "LLMLBTEST_REQUIRE_NODE", "apt-get install nodejs npm")
	dir, err := filepath.Abs(filepath.Join("testdata", "node-sdk"))
	if err != nil {
		t.Fatal(err)
	}
	_, err1 := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json"))
	_, err2 := os.Stat(filepath.Join(dir, "node_modules", "@anthropic-ai", "sdk", "package.json"))
	if err1 == nil && err2 == nil {
		return dir
	}
	npm := tool(t, "npm", "LLMLBTEST_REQUIRE_NODE", "apt-get install npm")
	cmd := exec.CommandContext(t.Context(), npm, "install", "--no-package-lock", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		// No registry reachable is a tool missing, not a failure of
		// llmlb's; CI requires the tool and so fails here.
		if os.Getenv("LLMLBTEST_REQUIRE_NODE") != "" {
			t.Fatalf("npm install in %s: %v\n%s", dir, err, out)
		}
		t.Skipf("the SDKs could not be installed (npm install in %s: %v)", dir, err)
	}
	return dir
}

// runNode runs a script of testdata/node-sdk with env and decodes the JSON
// summary it prints last into summary.
func runNode(t *testing.T, script string, summary any, env ...string) {
	t.Helper()
	dir := nodeSDK(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s%s", script, err, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), summary); err != nil {
		t.Fatalf("summary line %q: %v", lines[len(lines)-1], err)
	}
}

// TestNodeSDKEndToEnd drives llmlb in front of emulated vLLM servers with
// the official OpenAI Node SDK (testdata/node-sdk/e2e.mjs): the model
// list, chat and completions, streamed with and without usage, a LoRA
// adapter, stored responses followed through a second replica, and an
// unknown model's 404. Afterwards llmlb's metrics name every request and
// no backend holds one in flight.
func TestNodeSDKEndToEnd(t *testing.T) {
	nodeSDK(t)
	urls := simBackends(t, 3, sim.SteadyConfig{Speed: 100}, "sql-lora")
	inst := startTest(t, testConfig(urls), 3)
	inst2 := startTest(t, testConfig(urls), 3)
	var names []string
	for name := range backendNames(t, inst.AdminAddr) {
		names = append(names, name)
	}
	var summary struct {
		Models []string `json:"models"`
		Stream struct {
			Text             string `json:"text"`
			CompletionTokens int    `json:"completion_tokens"`
		} `json:"stream"`
		Completion string `json:"completion"`
		NotFound   bool   `json:"not_found"`
		Responses  struct {
			First, Streamed, Deltas string
		} `json:"responses"`
	}
	runNode(t, "e2e.mjs", &summary, "LLMLB_BASE_URL=http://"+inst.Addr+"/v1", "LLMLB_BASE_URL_2=http://"+inst2.Addr+"/v1",
		"LLMLB_MODEL="+testModel, "LLMLB_ADAPTER=sql-lora", "LLMLB_BACKENDS="+strings.Join(names, ","))
	if !slices.Contains(summary.Models, testModel) || summary.Stream.CompletionTokens != 6 || summary.Completion == "" || !summary.NotFound ||
		summary.Responses.Streamed == "" || summary.Responses.Deltas == "" {
		t.Errorf("summary = %+v", summary)
	}

	resp, err := http.Get("http://" + inst.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"llmlb_requests_total", "llmlb_time_to_first_byte_seconds", "llmlb_request_duration_seconds", "llmlb_in_flight_requests"} {
		if !bytes.Contains(b, []byte(name)) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	var total int64
	for _, inst := range []*serve.Instance{inst, inst2} {
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if b.InFlight != 0 {
				t.Errorf("%s: in flight %d after all requests ended", b.ID, b.InFlight)
			}
			total += b.Requests
		}
	}
	if total < 8 {
		t.Errorf("backends served %d requests, want at least 8", total)
	}
}

// TestAnthropicNodeSDK drives a keyed llmlb with the official Anthropic
// Node SDK (testdata/node-sdk/anthropic.mjs), which sends its key in
// x-api-key: a Message, a streamed one, a tool-calling turn, token
// counting, and a wrong key refused as the SDK's AuthenticationError.
func TestAnthropicNodeSDK(t *testing.T) {
	nodeSDK(t)
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100})
	cfg := testConfig(urls)
	cfg.Auth = proxy.AuthConfig{Keys: []proxy.KeyConfig{{Name: "alpha", Key: proxy.HashKey(testKeyA)}}}
	inst := startTest(t, cfg, 2)
	var summary struct {
		Message string `json:"message"`
		Stream  struct {
			Text         string `json:"text"`
			OutputTokens int    `json:"output_tokens"`
		} `json:"stream"`
		Count        int  `json:"count"`
		Unauthorized bool `json:"unauthorized"`
	}
	runNode(t, "anthropic.mjs", &summary, "LLMLB_URL=http://"+inst.Addr, "LLMLB_KEY="+testKeyA, "LLMLB_MODEL="+testModel)
	if summary.Message == "" || summary.Stream.OutputTokens != 6 || summary.Count == 0 || !summary.Unauthorized {
		t.Errorf("summary = %+v", summary)
	}
}
