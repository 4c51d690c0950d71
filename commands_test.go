package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/overhead"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// TestBenchCommand runs a small `llmlb bench` and checks the table, the
// JSON file and the plot it writes.
func TestBenchCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb strings.Builder
	args := []string{"bench", "--workload", "burst", "--policy", "default,round-robin,ttft-true-cache", "--backends", "3",
		"--scale", "0.05", "--quiet", "--json", dir + "/b.json", "--plot", dir + "/b.png"}
	if err := run(context.Background(), args, nil, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"burst:", "policy", "ttft p50", "default", "round-robin", "ttft-true-cache", "hit rate", "saturated: 96 clients", "saturated tok/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(dir + "/b.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workloads []struct {
			Name    string `json:"name"`
			Results []struct {
				Policy    string   `json:"policy"`
				TTFTP90   *float64 `json:"ttft_p90"`
				Saturated float64  `json:"saturated_output_tokens_per_s"`
			} `json:"results"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Workloads) != 1 || len(rep.Workloads[0].Results) != 3 ||
		rep.Workloads[0].Results[0].Policy != "default" || rep.Workloads[0].Results[0].TTFTP90 == nil || rep.Workloads[0].Results[0].Saturated <= 0 {
		t.Fatalf("json %s: %v", b, err)
	}
	if png, err := os.ReadFile(dir + "/b.png"); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("plot: %v", err)
	}
	if err := run(context.Background(), []string{"bench", "--policy", "fastest"}, nil, &out, &errb); err == nil {
		t.Error("unknown policy accepted")
	}
	if err := run(context.Background(), []string{"bench", "--clients", "-5"}, nil, &out, &errb); err == nil || !strings.Contains(err.Error(), "--clients") {
		t.Errorf("--clients -5: %v", err)
	}
}

// TestBenchTraceCommand: --trace writes a JSON line a served request of
// each run, naming its run (workload, policy, replicas, seed); with
// --replicas both the one-replica run and the R-replica run are there;
// --sweep refuses it.
func TestBenchTraceCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb strings.Builder
	args := []string{"bench", "--workload", "burst", "--policy", "default,round-robin", "--backends", "3", "--scale", "0.05",
		"--clients", "0", "--replicas", "2", "--seed", "4", "--quiet", "--trace", dir + "/t.jsonl"}
	if err := run(context.Background(), args, nil, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	b, err := os.ReadFile(dir + "/t.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Workload string   `json:"workload"`
			Policy   string   `json:"policy"`
			Replicas int      `json:"replicas"`
			Seed     uint64   `json:"seed"`
			Server   string   `json:"server"`
			TTFT     *float64 `json:"ttft_s"`
			Held     *int     `json:"held_tokens"`
			Best     *int     `json:"best_held_tokens"`
			Left     *int     `json:"best_prefill_left_tokens"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Workload != "burst" || r.Seed != 4 || r.Server == "" ||
			r.TTFT == nil || r.Held == nil || r.Best == nil || r.Left == nil || *r.Held > *r.Best {
			t.Fatalf("line %s: %v", line, err)
		}
		runs[fmt.Sprintf("%s/%d", r.Policy, r.Replicas)]++
	}
	if len(runs) != 4 || runs["default/1"] == 0 || runs["default/1"] != runs["round-robin/2"] {
		t.Errorf("lines by policy/replicas: %v", runs)
	}
	// The same command writes the same file, whichever run ends first.
	again := append(slices.Clone(args[:len(args)-1]), dir+"/t2.jsonl")
	if err := run(context.Background(), again, nil, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if b2, err := os.ReadFile(dir + "/t2.jsonl"); err != nil || !bytes.Equal(b, b2) {
		t.Errorf("the same command wrote another trace (%d bytes, then %d): %v", len(b), len(b2), err)
	}
	err = run(context.Background(), []string{"bench", "--sweep", "--trace", dir + "/s.jsonl"}, nil, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("--sweep --trace: %v", err)
	}
	if _, err := os.Stat(dir + "/s.jsonl"); err == nil {
		t.Error("--sweep --trace created its file")
	}
	// A command refused for another flag leaves a trace already there.
	err = run(context.Background(), []string{"bench", "--seeds", "3", "--trace", dir + "/t.jsonl"}, nil, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--seeds") {
		t.Errorf("--seeds 3 without --sweep: %v", err)
	}
	if after, err := os.ReadFile(dir + "/t.jsonl"); err != nil || !bytes.Equal(after, b) {
		t.Errorf("a refused command changed the trace already there (%d bytes, was %d): %v", len(after), len(b), err)
	}
}

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
	t.Setenv("LLMLB_TEST_RUN_MAIN", "1")
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

// TestOverheadGoProxyBadURL: the go row's mode refuses a backend that is
// not an http(s) URL, saying which, instead of serving a proxy to nowhere.
func TestOverheadGoProxyBadURL(t *testing.T) {
	for _, u := range []string{"localhost:8000", "ftp://x", "http://"} {
		var out, errb strings.Builder
		err := run(context.Background(), []string{"overhead", "--go-proxy", u}, nil, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "is not an http(s) URL") || !strings.Contains(err.Error(), u) {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestBenchSweepAndScenarioCommands runs `llmlb bench --sweep`,
// `--replicas` and `--scenario` small and checks what they print and write.
func TestBenchSweepAndScenarioCommands(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"sweep", []string{"--sweep", "--rates", "0.5,2", "--workload", "burst", "--policy", "default,epp", "--backends", "3", "--scale", "0.05", "--plot", dir + "/s.png", "--json", dir + "/s.json"},
			[]string{"x0.5", "x2", "worst TTFT p90 ratio", "plots: " + dir + "/s-burst.png"}},
		{"replicas", []string{"--replicas", "3", "--workload", "burst", "--policy", "default,epp", "--backends", "3", "--scale", "0.05"},
			[]string{"replicas: 3 independent balancers", "hit rate 3"}},
		{"scenario", []string{"--scenario", "sglang-v04-shared-prefix", "--scale", "0.05", "--json", dir + "/e.json"},
			[]string{"cache-aware router (v0.4)", "158596", "best first: published"}},
		{"seeds", []string{"--sweep", "--seeds", "2", "--rates", "2", "--workload", "burst", "--policy", "default,epp", "--backends", "3", "--scale", "0.05", "--json", dir + "/m.json"},
			[]string{"seeds 1-2", "summary over 2 seeds", "seeds worse", " of 2"}},
		{"bad seeds", []string{"--sweep", "--seeds", "0"}, []string{"--seeds 0: give a count of at least 1, with --sweep"}},
		{"seeds without sweep", []string{"--seeds", "3"}, []string{"--seeds 3: give a count of at least 1, with --sweep"}},
		{"bad rates", []string{"--sweep", "--rates", "0.5,fast"}, []string{`"fast" is not a positive factor`}},
		{"bad scenario", []string{"--scenario", "nope"}, []string{`unknown scenario "nope"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			err := run(context.Background(), append([]string{"bench", "--quiet"}, tc.args...), nil, &out, &errb)
			got := out.String()
			if err != nil {
				got += err.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
		})
	}
	if _, err := os.Stat(dir + "/s-burst.png"); err != nil {
		t.Error(err)
	}
	for _, f := range []string{"s.json", "e.json", "m.json"} {
		if b, err := os.ReadFile(dir + "/" + f); err != nil || !json.Valid(b) {
			t.Errorf("%s: %v, valid JSON %v", f, err, json.Valid(b))
		}
	}
	if b, _ := os.ReadFile(dir + "/m.json"); !strings.Contains(string(b), `"ttft_p90_by_seed"`) {
		t.Errorf("m.json lacks each seed's figures:\n%s", b)
	}
}

// probeJSON runs `llmlb probe --json` and decodes its one object.
func probeJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	stdout, stderr, err := runCmd(t, noEnv, append([]string{"probe", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("probe %v: %v\n%s", args, err, stderr)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("probe printed %q: %v", stdout, err)
	}
	return out
}

// TestProbeSavedPages: `llmlb probe --json FILE` prints the right values for
// each real page under scrape/testdata.
func TestProbeSavedPages(t *testing.T) {
	tests := []struct {
		file, engine string
		want         string // JSON of the signal fields
	}{
		{"vllm-v1-dp2-lora.txt", "vllm", `{"queued":11,"running":13,"kv_usage":0.675,"block_size":16,"num_blocks":29670,"lora":{"max":2,"running":["sql-lora","chat-lora"],"waiting":["tool-lora"]},"missing":[]}`},
		{"vllm-0.22-excerpt.txt", "vllm", `{"queued":0,"running":0,"kv_usage":0,"block_size":null,"num_blocks":null,"lora":null,"missing":["block_size","lora","num_blocks"]}`},
		{"vllm-0.7-aibrix.txt", "vllm", `{"queued":0,"running":0,"kv_usage":0,"block_size":16,"num_blocks":81767,"lora":{"max":0,"running":[],"waiting":[]},"missing":[]}`},
		{"sglang-docs.txt", "sglang", `{"queued":2826,"running":162,"kv_usage":0.28,"block_size":null,"num_blocks":null,"lora":null,"missing":["block_size","num_blocks"]}`},
		{"triton-trtllm.txt", "triton-tensorrt-llm", `{"queued":1,"running":1,"kv_usage":0.4875,"block_size":64,"num_blocks":6239,"lora":null,"missing":[]}`},
		{"trtllm-serve.txt", "trtllm-serve", `{"queued":1,"running":3,"kv_usage":0.62,"block_size":32,"num_blocks":62762,"lora":null,"missing":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got := probeJSON(t, "--engine", tt.engine, "scrape/testdata/"+tt.file)
			if got["engine"] != tt.engine {
				t.Errorf("engine = %v, want %s", got["engine"], tt.engine)
			}
			var want map[string]any
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			for k, w := range want {
				if !jsonEqual(got[k], w) {
					t.Errorf("%s = %v, want %v", k, got[k], w)
				}
			}
		})
	}
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestProbeEachSimFlavour: `llmlb probe --json URL` against every emulated
// engine prints the values that server's state holds, with work in flight.
func TestProbeEachSimFlavour(t *testing.T) {
	for _, engine := range []string{"vllm", "sglang", "triton-tensorrt-llm", "trtllm-serve"} {
		t.Run(engine, func(t *testing.T) {
			// Slow decoding keeps the requests running while we probe;
			// MaxRunning 2 queues the third.
			m := sim.NewSteady(sim.SteadyConfig{DecodeTokensPerSecond: 1, MaxRunning: 2, BlockSize: 32, NumBlocks: 1000})
			var adapters []string
			if engine == "vllm" {
				adapters = []string{"sql-lora"}
			}
			s, err := sim.NewServer(sim.ServerConfig{Engine: engine, Model: "m", Adapters: adapters}, m)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for range 3 {
				go func() {
					req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions",
						strings.NewReader(`{"model":"m","prompt":"`+strings.Repeat("hello ", 300)+`","max_tokens":50,"stream":true}`))
					req.Header.Set("Content-Type", "application/json")
					if resp, err := srv.Client().Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
			deadline := time.Now().Add(10 * time.Second)
			for st := m.Stats(); st.Running+st.Waiting < 3; st = m.Stats() {
				if time.Now().After(deadline) {
					t.Fatalf("requests never arrived: %+v", st)
				}
				time.Sleep(5 * time.Millisecond) // polling real HTTP arrivals, not timing the code under test
			}
			st := m.Stats()
			got := probeJSON(t, "--engine", engine, srv.URL)
			want := map[string]any{
				"queued": float64(st.Waiting), "running": float64(st.Running), "kv_usage": st.KVUsage,
				"block_size": float64(st.BlockSize), "num_blocks": float64(st.NumBlocks), "missing": []any{},
			}
			for k, w := range want {
				if !jsonEqual(got[k], w) {
					t.Errorf("%s = %v, want %v (state %+v)", k, got[k], w, st)
				}
			}
			if engine == "vllm" {
				lora, _ := got["lora"].(map[string]any)
				if lora == nil || lora["max"] != float64(st.MaxLoRA) {
					t.Errorf("lora = %v, want max %d", got["lora"], st.MaxLoRA)
				}
			} else if got["lora"] != nil {
				t.Errorf("lora = %v, want null for %s", got["lora"], engine)
			}
			if engine == "trtllm-serve" && !strings.HasSuffix(got["source"].(string), "/prometheus/metrics") {
				t.Errorf("trtllm-serve probed at %v, want /prometheus/metrics", got["source"])
			}
		})
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

// TestProbeWrongEngine is issue 18's seventh problem for probe: a page read
// with the wrong engine printed every signal unknown and exited 0. It
// still prints what it read, then fails, naming the engine that matches.
func TestProbeWrongEngine(t *testing.T) {
	s, err := sim.NewServer(sim.ServerConfig{Engine: "vllm", Model: "m"}, sim.NewSteady(sim.SteadyConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, tt := range []struct {
		name, engine, src, want string
	}{
		{"live vllm read as sglang", "sglang", srv.URL, "try --engine vllm"},
		{"saved sglang page read as vllm", "vllm", "scrape/testdata/sglang-docs.txt", "try --engine sglang"},
		{"saved trtllm-serve page read as triton", "triton-tensorrt-llm", "scrape/testdata/trtllm-serve.txt", "try --engine trtllm-serve"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := runCmd(t, noEnv, "probe", "--engine", tt.engine, tt.src)
			if err == nil || !strings.Contains(err.Error(), "every signal is unknown") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("probe --engine %s %s: err %v, want one saying every signal is unknown and %q", tt.engine, tt.src, err, tt.want)
			}
			if !strings.Contains(stdout, "queued") {
				t.Errorf("probe printed no table before failing: %q", stdout)
			}
		})
	}
	_, _, err = runCmd(t, noEnv, "probe", "--engine", "vllm", "go.mod")
	if err == nil || !strings.Contains(err.Error(), "no known engine") {
		t.Errorf("probe of a page no engine reads: %v, want it said", err)
	}
}

// TestProbeLoRAExpectedOnlyWithAdapters: probing a live vLLM that serves no
// adapters does not report lora missing (issue 18, 4).
func TestProbeLoRAExpectedOnlyWithAdapters(t *testing.T) {
	s, err := sim.NewServer(sim.ServerConfig{Engine: "vllm", Model: "m"}, sim.NewSteady(sim.SteadyConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	got := probeJSON(t, "--engine", "vllm", srv.URL)
	if !jsonEqual(got["missing"], []any{}) || got["lora"] != nil {
		t.Errorf("missing = %v, lora = %v; want nothing missing and lora null for a server without adapters", got["missing"], got["lora"])
	}
}
