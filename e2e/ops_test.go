package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/doccheck"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// secret is in every prompt of the mixed run; no log line may carry it.
const secret = "PROMPT-SECRET-7f3a"

// metricsPage is the page whose table documents every metric llmlb
// registers.
const metricsPage = "../docs/operations.md"

// documentedMetrics reads the metric names of the metrics table in
// docs/operations.md.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	return doccheck.DocumentedMetrics(t, metricsPage)
}

// sample is one line of a metrics page.
type sample struct {
	labels string
	value  float64
}

// scrapeAdmin parses the admin /metrics page into samples by name.
func scrapeAdmin(t *testing.T, adminAddr string) map[string][]sample {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string][]sample{}
	sc := bufio.NewScanner(resp.Body)
	re := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		out[m[1]] = append(out[m[1]], sample{m[2], v})
	}
	return out
}

// sum adds the samples of name whose labels contain every one of want.
func sum(ss map[string][]sample, name string, want ...string) (total float64, n int) {
	for _, s := range ss[name] {
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(s.labels, w)
		}
		if ok {
			total += s.value
			n++
		}
	}
	return total, n
}

// TestOperationsMixedRun drives a mixed run through the balancer: streams
// with and without the client asking for usage, a plain completion, chat,
// an alias, a LoRA adapter, errors, and a backend that answers 503 to
// everything and so is retried past and ejected, a dead backend, a vLLM
// backend declared sglang, and DNS discovery. Then: every metric
// docs/operations.md documents is on /metrics with sensible values, and
// every llmlb_ metric on /metrics is documented; the access log has
// exactly one line per request and no prompt text; request IDs reach the
// backend and come back; the usage chunk llmlb asked for never reaches a
// client that did not.
func TestOperationsMixedRun(t *testing.T) {
	var idsMu sync.Mutex
	seenIDs := map[string]bool{}
	good := func() string {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel, Adapters: []string{"sql-lora"}}, sim.NewSteady(sim.SteadyConfig{Speed: 50}))
		if err != nil {
			t.Fatal(err)
		}
		h := s.Handler()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				idsMu.Lock()
				seenIDs[r.Header.Get("X-Request-Id")] = true
				idsMu.Unlock()
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	g1, g2 := good(), good()
	// The 503 backend: healthy, serves the model, lacks a KV signal, and
	// fails every request.
	s3, _ := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sim.SteadyConfig{Speed: 50}))
	h3 := s3.Handler()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost:
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
		case r.URL.Path == "/metrics":
			rec := httptest.NewRecorder()
			h3.ServeHTTP(rec, r)
			var keep []string
			for _, l := range strings.Split(rec.Body.String(), "\n") {
				if !strings.Contains(l, "kv_cache_usage_perc") {
					keep = append(keep, l)
				}
			}
			io.WriteString(w, strings.Join(keep, "\n"))
		default:
			h3.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(bad.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	_, g2port, _ := net.SplitHostPort(strings.TrimPrefix(g2, "http://"))
	port, _ := strconv.Atoi(g2port)

	cfg := testConfig([]string{g1, g2, bad.URL, dead})
	// The dead backend's models are configured: one whose models were never
	// learned may serve any name, which would turn the unknown model's 404
	// below into a 503 (issue 18).
	cfg.Backends[3].Models = []string{testModel}
	cfg.Backends[0].Engine = "sglang"                                                               // a vLLM server: reported as a mismatch and read as vllm
	cfg.Backends = append(cfg.Backends, scrape.BackendConfig{DNS: "localhost", Ports: []int{port}}) // 127.0.0.1 is g2 again
	cfg.Balancer.Policy = "round-robin"                                                             // every backend is first in turn
	cfg.Models = []balancer.ModelRoute{{Name: "chat-alias", Targets: []balancer.ModelTarget{{Model: testModel}}}}
	cfg.Log.Level, cfg.Log.Format = "info", "json"
	inst, logs := startLogged(t, cfg, 3) // g1, g2, bad

	base := "http://" + inst.Addr
	sent := 0
	post := func(path, body string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		sent++
		return resp, string(b)
	}
	prompt := `"say hello ` + secret + `"`
	streams, ok := 0, 0
	for i := range 36 { // the 503 backend is first for about a third: enough to eject it
		var resp *http.Response
		var body string
		switch i % 6 {
		case 0: // a stream, no usage asked: the injected chunk must not show
			resp, body = post("/v1/completions", `{"model":"`+testModel+`","prompt":`+prompt+`,"max_tokens":5,"stream":true}`)
			if strings.Contains(body, `"usage":{`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Errorf("stream without include_usage got:\n%s", body)
			}
			streams++
		case 1: // chat stream asking for usage: it must show
			resp, body = post("/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":`+prompt+`}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`)
			if !strings.Contains(body, `"choices":[],`) || !strings.Contains(body, `"prompt_tokens"`) {
				t.Errorf("stream with include_usage lacks its usage chunk:\n%s", body)
			}
			streams++
		case 2:
			resp, body = post("/v1/completions", `{"model":"`+testModel+`","prompt":`+prompt+`,"max_tokens":5}`, "X-Request-Id", "ops-test-"+strconv.Itoa(i))
			if got := resp.Header.Get("X-Request-Id"); got != "ops-test-"+strconv.Itoa(i) {
				t.Errorf("request id came back as %q", got)
			}
		case 3:
			resp, body = post("/v1/completions", `{"model":"chat-alias","prompt":`+prompt+`,"max_tokens":5,"stream":true}`)
			streams++
		case 4:
			resp, body = post("/v1/completions", `{"model":"sql-lora","prompt":`+prompt+`,"max_tokens":5,"stream":true}`)
			streams++
		case 5:
			resp, body = post("/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":`+prompt+`}],"max_tokens":5}`)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d: %d %s", i, resp.StatusCode, body)
		} else {
			ok++
		}
		if resp.Header.Get("X-Request-Id") == "" {
			t.Errorf("request %d: no X-Request-Id", i)
		}
	}
	if resp, _ := post("/v1/completions", `{"model":"nosuch","prompt":`+prompt+`}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %d", resp.StatusCode)
	}
	if resp, _ := post("/v1/completions", `{"model":`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed: %d", resp.StatusCode)
	}
	if resp, err := http.Get(base + "/v1/models"); err == nil {
		resp.Body.Close()
		sent++
	}
	if resp, err := http.Get(base + "/health"); err == nil { // no access line
		resp.Body.Close()
	}
	idsMu.Lock()
	if !seenIDs["ops-test-2"] || !seenIDs["ops-test-20"] {
		t.Errorf("the backends never saw the client's request ids: %v", seenIDs)
	}
	idsMu.Unlock()

	// Every documented metric, with values that make sense for this run.
	var ss map[string][]sample
	deadline := time.Now().Add(10 * time.Second)
	for {
		ss = scrapeAdmin(t, inst.AdminAddr)
		_, ej := sum(ss, "llmlb_backend_ejections_total")
		_, dns := sum(ss, "llmlb_discovery_dns_backends")
		_, se := sum(ss, "llmlb_scrape_errors_total")
		if ej > 0 && dns > 0 && se > 0 || time.Now().After(deadline) {
			break
		}
		<-time.After(20 * time.Millisecond) // scrapes and DNS run on their own intervals
	}
	for _, name := range documentedMetrics(t) {
		if name == "llmlb_discovery_dns_errors_total" {
			continue // needs a failing DNS server: scrape.TestDNSNameThatDoesNotResolve
		}
		switch name {
		case "llmlb_tokenize_requests_total", "llmlb_kv_event_batches_total", "llmlb_kv_event_blocks":
			continue // needs backends publishing KV events: TestReplicasShareWhatTheServersHold
		case "llmlb_kv_event_resets_total":
			continue // needs lost batches: kvevents.TestStreamGapsAndRestarts (its OnReset hook)
		}
		switch name {
		case "llmlb_slo_requests_total": // needs deadline headers: TestDeadlines
			continue
		case "llmlb_evictions_total": // needs eviction on: TestEvictionEndsNewestSheddableStream
			continue
		case "llmlb_backend_slots": // needs a backend that fills its slots: proxy.TestSlotsMetric
			continue
		case "llmlb_ttft_predicted_seconds_total", "llmlb_ttft_observed_seconds_total":
			continue // needs a stream its first candidate answered alone, which this run's retries may leave none of: TestDeadlines
		}
		if strings.HasPrefix(name, "llmlb_cluster_") {
			continue // needs Redis: TestReplicasActAsOne, cluster.TestRedisDownAndBack
		}
		if name == "llmlb_key_requests_total" || name == "llmlb_key_tokens_total" {
			continue // needs API keys: proxy.TestNoKeyOrHashInLogsMetricsOrStatus, TestKeyReloadTakesEffectWithoutDroppingStreams
		}
		if len(ss[name]) == 0 && len(ss[name+"_count"]) == 0 {
			t.Errorf("/metrics lacks documented %s", name)
		}
	}
	documented := documentedMetrics(t)
	for name := range ss {
		if !strings.HasPrefix(name, "llmlb_") {
			continue
		}
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(documented, base) {
				family = base
			}
		}
		if !slices.Contains(documented, family) {
			t.Errorf("/metrics has %s, which %s does not document", name, metricsPage)
		}
	}
	check := func(what string, cond bool) {
		t.Helper()
		if !cond {
			t.Errorf("%s", what)
		}
	}
	total, _ := sum(ss, "llmlb_requests_total")
	check("requests_total counts every model request", total == float64(sent-1)) // /v1/models is not a model request
	okN, _ := sum(ss, "llmlb_requests_total", `status="200"`)
	check("200s", okN == float64(ok))
	aliasN, _ := sum(ss, "llmlb_requests_total", `model="chat-alias"`, `target_model="`+testModel+`"`)
	check("alias counted with its target model", aliasN == 6)
	notFound, _ := sum(ss, "llmlb_requests_total", `backend="none"`, `status="404"`)
	check("unknown model counted", notFound == 1)
	ttftN, _ := sum(ss, "llmlb_time_to_first_token_seconds_count")
	check("a TTFT per stream", ttftN == float64(streams))
	itlN, _ := sum(ss, "llmlb_inter_token_latency_seconds_count")
	check("inter-token gaps", itlN >= float64(streams))
	durN, _ := sum(ss, "llmlb_request_duration_seconds_count")
	check("a duration per answered request", durN == float64(ok))
	comp, _ := sum(ss, "llmlb_completion_tokens_total")
	check("completion tokens from usage, streams included", comp == float64(5*ok))
	promptT, _ := sum(ss, "llmlb_prompt_tokens_total")
	cached, _ := sum(ss, "llmlb_cached_prompt_tokens_total")
	check("prompt and cached tokens", promptT > 0 && cached >= 0 && cached <= promptT)
	_, pn := sum(ss, "llmlb_prefix_predicted_tokens_total")
	_, rn := sum(ss, "llmlb_prefix_reported_tokens_total")
	check("prefix prediction against report, per backend", pn > 0 && pn == rn)
	retries, _ := sum(ss, "llmlb_retries_total", `backend="`+bad.URL+`"`)
	check("the 503 backend was retried past", retries >= 1)
	inflight, n := sum(ss, "llmlb_in_flight_requests")
	check("nothing in flight at the end", inflight == 0 && n >= 3)
	ready, _ := sum(ss, "llmlb_backend_state", `state="ready"`)
	check("two or three ready backends (the 503 one may be ejected)", ready >= 2 && ready <= 3)
	deadDown, _ := sum(ss, "llmlb_backend_state", `backend="`+dead+`"`, `state="ready"`)
	check("the dead backend is not ready", deadDown == 0)
	kv, kn := sum(ss, "llmlb_backend_kv_cache_usage_ratio")
	check("KV use per backend that reports it", kn >= 2 && kv >= 0 && kv <= float64(kn))
	missing, _ := sum(ss, "llmlb_scrape_signal_missing", `backend="`+bad.URL+`"`, `signal="kv_usage"`)
	check("the missing KV signal is flagged", missing == 1)
	mismatch, mn := sum(ss, "llmlb_backend_engine_mismatch", `backend="`+g1+`"`, `declared="sglang"`, `detected="vllm"`)
	check("the backend declared sglang is flagged as vllm, and no other", mismatch == 1 && mn == 1 && len(ss["llmlb_backend_engine_mismatch"]) == 1)
	check("the engine mismatch is logged once", strings.Count(logs.String(), "backend engine contradicts its metrics") == 1)
	reloads, rn2 := sum(ss, "llmlb_config_reloads_total")
	check("no reloads (none asked), both results present", reloads == 0 && rn2 == 2)
	entries, en := sum(ss, "llmlb_prefix_index_entries")
	check("round-robin keeps no prefix index", en == 1 && entries == 0)
	picks, _ := sum(ss, "llmlb_picks_total")
	check("a pick per routed request", picks == float64(sent-3)) // not the 404, the 400, /v1/models

	// Exactly one access line per request, and no prompt text anywhere.
	lines := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, secret) {
			t.Errorf("prompt text logged: %s", l)
		}
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "request" {
			lines++
			if rec["id"] == "" || rec["status"] == nil || rec["duration_s"] == nil {
				t.Errorf("access line lacks fields: %s", l)
			}
			if rec["status"] == float64(200) && rec["path"] != "/v1/models" && (rec["backend"] == nil || rec["completion_tokens"] != float64(5)) {
				t.Errorf("answered request's line lacks backend or tokens: %s", l)
			}
		}
	}
	if lines != sent {
		t.Errorf("%d access lines for %d requests:\n%s", lines, sent, logs.String())
	}
}

// TestAccessLogPromptsOnlyAtDebug: log.prompts puts prompt text on access
// lines only when the level is debug too.
func TestAccessLogPromptsOnlyAtDebug(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100})
	for _, level := range []string{"info", "debug"} {
		cfg := testConfig(urls)
		cfg.Log.Level, cfg.Log.Prompts = level, true
		logs := &lockedBuffer{}
		inst, err := serve.Start(t.Context(), cfg, nil, logs)
		if err != nil {
			t.Fatal(err)
		}
		e2etest.WaitBackends(t, inst.AdminAddr, 1)
		completeWith(t, inst.Addr, secret)
		// The access line is written as the handler returns, which can be
		// after the client has read the whole answer.
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "msg=request") && time.Now().Before(deadline); {
			<-time.After(10 * time.Millisecond)
		}
		if got := strings.Contains(logs.String(), secret); got != (level == "debug") {
			t.Errorf("level %s with log.prompts: prompt logged %v", level, got)
		}
	}
}

func completeWith(t *testing.T, addr, prompt string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 2})
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes and reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAccessLineSaysWhyItFailed: a request llmlb answers with a 502
// because its server cut the connection carries the transport error on its
// access line; a client's bad request carries none.
func TestAccessLineSaysWhyItFailed(t *testing.T) {
	s, url := faultableSim(t, sim.SteadyConfig{Speed: 100})
	cfg := testConfig([]string{url})
	cfg.Log.Level, cfg.Log.Format = "info", "json"
	logs := &lockedBuffer{}
	inst, err := serve.Start(t.Context(), cfg, nil, logs)
	if err != nil {
		t.Fatal(err)
	}
	e2etest.WaitBackends(t, inst.AdminAddr, 1)
	faults, err := sim.ParseFaults("close")
	if err != nil {
		t.Fatal(err)
	}
	s.SetFaults(faults)
	b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": "hello", "max_tokens": 2})
	for _, body := range [][]byte{b, []byte(`{"model":`)} {
		resp, err := http.Post("http://"+inst.Addr+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// The access line is written as the handler returns, which can be
	// after the client has read the whole answer.
	var got map[float64]map[string]any
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); e2etest.PollPause() {
		got = map[float64]map[string]any{}
		for _, l := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "request" {
				got[rec["status"].(float64)] = rec
			}
		}
	}
	if e, ok := got[502]["error"].(string); !ok || e == "" {
		t.Errorf("the 502's access line has no error: %v (lines by status: %v)", got[502], got)
	}
	if _, ok := got[400]["error"]; ok || got[400] == nil {
		t.Errorf("the 400's access line: %v, want one without an error", got[400])
	}
}
