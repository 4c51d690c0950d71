package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/sim"
)

// probeFields returns the JSON of res's fields named in want, and of want's,
// field by field, for comparing.
func probeFields(t *testing.T, res ProbeResult, want string) (got, wantFields map[string]string) {
	t.Helper()
	var all, w map[string]json.RawMessage
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &all); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	got, wantFields = map[string]string{}, map[string]string{}
	for k, v := range w {
		got[k], wantFields[k] = string(all[k]), string(v)
	}
	return got, wantFields
}

// TestProbeSavedPages: Probe reads the right values from each real page
// under testdata with its engine's row.
func TestProbeSavedPages(t *testing.T) {
	for _, tt := range []struct {
		file, engine string
		want         string // JSON of the signal fields
	}{
		{"vllm-v1-dp2-lora.txt", "vllm", `{"queued":11,"running":13,"kv_usage":0.675,"block_size":16,"num_blocks":29670,"lora":{"max":2,"running":["sql-lora","chat-lora"],"waiting":["tool-lora"]},"missing":[]}`},
		{"vllm-0.22-excerpt.txt", "vllm", `{"queued":0,"running":0,"kv_usage":0,"block_size":null,"num_blocks":null,"lora":null,"missing":["block_size","lora","num_blocks"]}`},
		{"vllm-0.7-aibrix.txt", "vllm", `{"queued":0,"running":0,"kv_usage":0,"block_size":16,"num_blocks":81767,"lora":{"max":0,"running":[],"waiting":[]},"missing":[]}`},
		{"sglang-docs.txt", "sglang", `{"queued":2826,"running":162,"kv_usage":0.28,"block_size":null,"num_blocks":null,"lora":null,"missing":["block_size","num_blocks"]}`},
		{"triton-trtllm.txt", "triton-tensorrt-llm", `{"queued":1,"running":1,"kv_usage":0.4875,"block_size":64,"num_blocks":6239,"lora":null,"missing":[]}`},
		{"trtllm-serve.txt", "trtllm-serve", `{"queued":1,"running":3,"kv_usage":0.62,"block_size":32,"num_blocks":62762,"lora":null,"missing":[]}`},
	} {
		t.Run(tt.file, func(t *testing.T) {
			src := "testdata/" + tt.file
			res, err := Probe(context.Background(), ProbeOptions{Source: src, Engine: tt.engine})
			if err != nil {
				t.Fatal(err)
			}
			if res.Engine != tt.engine || res.Source != src {
				t.Errorf("engine, source = %s, %s; want %s, %s", res.Engine, res.Source, tt.engine, src)
			}
			got, want := probeFields(t, res, tt.want)
			for k := range want {
				if got[k] != want[k] {
					t.Errorf("%s = %s, want %s", k, got[k], want[k])
				}
			}
		})
	}
}

// TestProbeEngineOverrides: the config's engines: section changes the row
// Probe reads with.
func TestProbeEngineOverrides(t *testing.T) {
	o := ProbeOptions{Source: "testdata/vllm-v1-dp2-lora.txt", Engine: "vllm",
		Engines: map[string]EngineConfig{"vllm": {Queued: ptr("vllm:num_requests_running")}}}
	res, err := Probe(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := res.Queued.MarshalJSON(); string(got) != "13" || res.Specs[SignalQueued] != "vllm:num_requests_running" {
		t.Errorf("queued = %s read by %q, want 13 read by vllm:num_requests_running", got, res.Specs[SignalQueued])
	}
}

// fixedModel is an emulated server's model whose state never changes.
type fixedModel sim.Stats

func (m fixedModel) Run(ctx context.Context, _ sim.Job, _ func() error) (int, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}

func (m fixedModel) Stats() sim.Stats { return sim.Stats(m) }

// TestProbeLiveServers: Probe of a server's URL reads, from each emulated
// engine, the state its page renders, at the engine's own metrics path;
// LoRA information is expected only of a server that serves adapters.
func TestProbeLiveServers(t *testing.T) {
	st := sim.Stats{Waiting: 1, Running: 2, KVUsage: 0.25, BlockSize: 32, NumBlocks: 1000, MaxLoRA: 2, RunningAdapters: []string{"sql-lora"}}
	const signals = `"queued":1,"running":2,"kv_usage":0.25,"block_size":32,"num_blocks":1000,"missing":[]`
	for _, tt := range []struct {
		engine   string
		adapters []string
		wantPath string
		want     string
	}{
		{"vllm", []string{"sql-lora"}, "/metrics", `{` + signals + `,"lora":{"max":2,"running":["sql-lora"],"waiting":[]}}`},
		{"vllm", nil, "/metrics", `{` + signals + `,"lora":null}`},
		{"sglang", nil, "/metrics", `{` + signals + `,"lora":null}`},
		{"triton-tensorrt-llm", nil, "/metrics", `{` + signals + `,"lora":null}`},
		{"trtllm-serve", nil, "/prometheus/metrics", `{` + signals + `,"lora":null}`},
	} {
		t.Run(tt.engine+"/adapters="+strings.Join(tt.adapters, ","), func(t *testing.T) {
			s, err := sim.NewServer(sim.ServerConfig{Engine: tt.engine, Model: "m", Adapters: tt.adapters}, fixedModel(st))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			res, err := Probe(context.Background(), ProbeOptions{Source: srv.URL, Engine: tt.engine})
			if err != nil {
				t.Fatal(err)
			}
			if res.Source != srv.URL+tt.wantPath {
				t.Errorf("source = %s, want %s", res.Source, srv.URL+tt.wantPath)
			}
			got, want := probeFields(t, res, tt.want)
			for k := range want {
				if got[k] != want[k] {
					t.Errorf("%s = %s, want %s", k, got[k], want[k])
				}
			}
		})
	}
}

// TestProbeErrors: a missing file, an unknown engine and a page answered
// as JSON each fail with nothing read.
func TestProbeErrors(t *testing.T) {
	srv := simServer(t, "trtllm-serve")
	for _, tt := range []struct {
		name string
		o    ProbeOptions
		want string
		is   error // what the error wraps, if anything
	}{
		{"missing file", ProbeOptions{Source: "testdata/no-such-page.txt", Engine: "vllm"}, "no such file", fs.ErrNotExist},
		{"unknown engine", ProbeOptions{Source: "testdata/vllm-v1-dp2-lora.txt", Engine: "vlm"}, `probe: unknown engine "vlm" (known: sglang, triton-tensorrt-llm, trtllm-serve, vllm)`, nil},
		{"bad override", ProbeOptions{Source: "testdata/vllm-v1-dp2-lora.txt", Engine: "vllm", Engines: map[string]EngineConfig{"vllm": {Queued: ptr("x{")}}}, "queued", nil},
		{"JSON page", ProbeOptions{Source: srv.URL + "/metrics", Engine: "trtllm-serve"}, "/prometheus/metrics", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Probe(context.Background(), tt.o)
			if _, none := errors.AsType[*NoSignalsError](err); err == nil || none || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Probe() error = %v, want one saying %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Probe() error = %v, want one wrapping %v", err, tt.is)
			}
			if res.Engine != "" {
				t.Errorf("Probe() read %+v with its error", res)
			}
		})
	}
}

// TestProbeNoSignals is issue 18's seventh problem for probe: a page read
// with the wrong engine printed every signal unknown and exited 0. Probe
// still returns what it read, with an error naming the engines whose rows
// read the page.
func TestProbeNoSignals(t *testing.T) {
	srv := simServer(t, "vllm")
	for _, tt := range []struct {
		name, engine, src string
		wantMatches       []string
		wantErr           string
	}{
		{"live vllm read as sglang", "sglang", srv.URL, []string{"vllm"}, "try --engine vllm"},
		{"saved sglang page read as vllm", "vllm", "testdata/sglang-docs.txt", []string{"sglang"},
			"probe: the page has none of the vllm engine's metrics, so every signal is unknown: its families match sglang; try --engine sglang"},
		{"saved trtllm-serve page read as triton", "triton-tensorrt-llm", "testdata/trtllm-serve.txt", []string{"trtllm-serve"}, "try --engine trtllm-serve"},
		{"a page no engine reads", "vllm", "../go.mod", nil, "no known engine's metrics are on it either"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Probe(context.Background(), ProbeOptions{Source: tt.src, Engine: tt.engine})
			none, ok := errors.AsType[*NoSignalsError](err)
			if !ok || strings.Join(none.Matches, ",") != strings.Join(tt.wantMatches, ",") || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Probe() error = %v, want a *NoSignalsError matching %v saying %q", err, tt.wantMatches, tt.wantErr)
			}
			if res.Engine != tt.engine || !strings.HasPrefix(res.Source, tt.src) || len(res.Specs) != 0 || len(res.Missing) == 0 {
				t.Errorf("result %+v, want the page's every signal unknown", res)
			}
		})
	}
}

// TestProbeResultWrite: the text is a table of signal, value and the spec
// that read it, then what is missing; the JSON is one indented object.
func TestProbeResultWrite(t *testing.T) {
	for _, tt := range []struct {
		file, wantText string
	}{
		{"vllm-v1-dp2-lora.txt", "testdata/vllm-v1-dp2-lora.txt read as vllm\n\n" +
			"  queued      11           vllm:num_requests_waiting\n" +
			"  running     13           vllm:num_requests_running\n" +
			"  kv_usage    0.675        vllm:kv_cache_usage_perc\n" +
			"  block_size  16           vllm:cache_config_info\n" +
			"  num_blocks  29670        vllm:cache_config_info\n" +
			"  lora        max 2, running [sql-lora,chat-lora], waiting [tool-lora]  vllm:lora_requests_info\n"},
		{"vllm-0.22-excerpt.txt", "testdata/vllm-0.22-excerpt.txt read as vllm\n\n" +
			"  queued      0            vllm:num_requests_waiting\n" +
			"  running     0            vllm:num_requests_running\n" +
			"  kv_usage    0            vllm:kv_cache_usage_perc\n" +
			"  block_size  unknown      \n" +
			"  num_blocks  unknown      \n" +
			"  lora        unknown\n" +
			"\nmissing: block_size, lora, num_blocks (the page has no series matching the engine row's spec)\n"},
	} {
		t.Run(tt.file, func(t *testing.T) {
			res, err := Probe(context.Background(), ProbeOptions{Source: "testdata/" + tt.file, Engine: "vllm"})
			if err != nil {
				t.Fatal(err)
			}
			var text, js strings.Builder
			if err := res.WriteText(&text); err != nil || text.String() != tt.wantText {
				t.Errorf("WriteText() = %v, wrote\n%s\nwant\n%s", err, text.String(), tt.wantText)
			}
			if err := res.WriteJSON(&js); err != nil || !strings.HasPrefix(js.String(), "{\n  \"engine\": \"vllm\",\n") || !strings.HasSuffix(js.String(), "}\n") {
				t.Errorf("WriteJSON() = %v, wrote\n%s", err, js.String())
			}
			var back ProbeResult
			if err := json.Unmarshal([]byte(js.String()), &back); err != nil || back.Source != res.Source || len(back.Missing) != len(res.Missing) {
				t.Errorf("WriteJSON() wrote %s, which reads back as %+v (%v)", js.String(), back, err)
			}
		})
	}
}
