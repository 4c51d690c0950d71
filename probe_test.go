package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// probeJSON runs `llmlb probe --json` and decodes its one object.
func probeJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	err, stdout, stderr := runCmd(t, noEnv, append([]string{"probe", "--json"}, args...)...)
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
		err, _, _ := runCmd(t, noEnv, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
	s, _ := sim.NewServer(sim.ServerConfig{Engine: "trtllm-serve", Model: "m"}, sim.NewSteady(sim.SteadyConfig{}))
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	err, _, _ := runCmd(t, noEnv, "probe", "--engine", "trtllm-serve", srv.URL+"/metrics")
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
			err, stdout, _ := runCmd(t, noEnv, "probe", "--engine", tt.engine, tt.src)
			if err == nil || !strings.Contains(err.Error(), "every signal is unknown") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("probe --engine %s %s: err %v, want one saying every signal is unknown and %q", tt.engine, tt.src, err, tt.want)
			}
			if !strings.Contains(stdout, "queued") {
				t.Errorf("probe printed no table before failing: %q", stdout)
			}
		})
	}
	err, _, _ = runCmd(t, noEnv, "probe", "--engine", "vllm", "go.mod")
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
