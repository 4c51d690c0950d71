package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// traceLineFields are the fields of a trace line the tests look at.
type traceLineFields struct {
	Workload   string `json:"workload"`
	Policy     string `json:"policy"`
	Replicas   int    `json:"replicas"`
	Seed       uint64 `json:"seed"`
	Request    int    `json:"request"`
	Server     string `json:"server"`
	HeldTokens int    `json:"held_tokens"`
}

// readTrace decodes every line of a trace file.
func readTrace(t *testing.T, file string) []traceLineFields {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []traceLineFields
	for line := range strings.Lines(string(b)) {
		var l traceLineFields
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, l)
	}
	return out
}

// TestTraceWriterEmptiesTheFileAtTheFirstRun: a trace already in the file
// stays as it was until the first run's records come; they replace it, a
// line a record naming its run and seed.
func TestTraceWriterEmptiesTheFileAtTheFirstRun(t *testing.T) {
	run := TraceRun{Workload: "burst", Policy: "epp", Replicas: 2,
		Records: []TraceRecord{{Request: 0, Server: "sim-0"}, {Request: 1, Server: "sim-1", HeldTokens: 16}}}
	for _, tc := range []struct {
		name     string
		runs     []TraceRun
		wantOld  bool
		wantLine []traceLineFields
	}{
		{name: "no run", wantOld: true},
		{name: "a run without records", runs: []TraceRun{{Workload: "burst", Policy: "default", Replicas: 1}}},
		{name: "two runs", runs: []TraceRun{run, {Workload: "burst", Policy: "default", Replicas: 1, Records: run.Records[:1]}},
			wantLine: []traceLineFields{
				{Workload: "burst", Policy: "epp", Replicas: 2, Seed: 7, Request: 0, Server: "sim-0"},
				{Workload: "burst", Policy: "epp", Replicas: 2, Seed: 7, Request: 1, Server: "sim-1", HeldTokens: 16},
				{Workload: "burst", Policy: "default", Replicas: 1, Seed: 7, Request: 0, Server: "sim-0"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "t.jsonl")
			old := []byte("an earlier trace, longer than the new one will be, so that a write over it without emptying shows\n")
			if err := os.WriteFile(file, old, 0o644); err != nil {
				t.Fatal(err)
			}
			tw, err := NewTraceWriter(file, 7)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range tc.runs {
				tw.WriteRun(r)
			}
			if err := tw.Close(); err != nil {
				t.Fatalf("Close() = %v", err)
			}
			if b, _ := os.ReadFile(file); bytes.Equal(b, old) != tc.wantOld {
				t.Fatalf("after %d runs the file is %q; want the earlier trace kept: %v", len(tc.runs), b, tc.wantOld)
			}
			if tc.wantOld {
				return
			}
			if got := readTrace(t, file); !slices.Equal(got, tc.wantLine) {
				t.Errorf("lines = %+v, want %+v", got, tc.wantLine)
			}
		})
	}
}

// TestTraceWriterRefusesAtOnce: a path the trace cannot be written to is
// refused when the writer is made, before any run.
func TestTraceWriterRefusesAtOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "no-such-dir", "t.jsonl")
	if _, err := NewTraceWriter(file, 1); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "--record") {
		t.Errorf("NewTraceWriter(%s) = %v, want a --record error for a missing directory", file, err)
	}
}

// smallCommand is a bench command that runs in a fraction of a second, as
// the flags' defaults set it but smaller.
func smallCommand() Command {
	return Command{Workloads: []string{"burst"}, Policies: []string{"default", "round-robin"}, Backends: 3,
		Params: Params{Scale: 0.05, Seed: 1}, Engine: "vllm", Replicas: 1, Seeds: 1}
}

// TestBenchCommandRefusesBeforeRunning: a command whose flags do not go
// together is refused before it runs anything and leaves a trace already
// in its trace file as it was; a trace it cannot take is not created.
func TestBenchCommandRefusesBeforeRunning(t *testing.T) {
	dir := t.TempDir()
	old := []byte("an earlier trace\n")
	for _, tc := range []struct {
		name    string
		change  func(*Command)
		wantErr string
	}{
		{"trace with sweep", func(c *Command) { c.Sweep = true }, "--record records single runs"},
		{"trace with scenario", func(c *Command) { c.Scenario = "sglang-v04-shared-prefix" }, "--record records single runs"},
		{"trace with target", func(c *Command) { c.Target = "http://127.0.0.1:1" }, "--record records single runs"},
		{"seeds without sweep", func(c *Command) { c.Seeds = 3 }, "--seeds 3: give a count of at least 1, with --sweep"},
		{"no seeds", func(c *Command) { c.Seeds = 0 }, "--seeds 0: give a count of at least 1, with --sweep"},
		{"negative backends", func(c *Command) { c.Backends = -1 }, "--backends must be at least 1"},
		{"bad clients", func(c *Command) { c.Clients = -5 }, "--clients must be -1 (32 a server), 0 (no saturated run) or a count, got -5"},
		{"bad perturb", func(c *Command) { c.Perturb = "bogus" }, `--perturb "bogus"`},
		{"unknown policy", func(c *Command) { c.Policies = []string{"fastest"} }, `unknown policy "fastest"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, existing := range []bool{true, false} {
				file := filepath.Join(dir, fmt.Sprintf("%s-%v.jsonl", strings.ReplaceAll(tc.name, " ", "-"), existing))
				if existing {
					if err := os.WriteFile(file, old, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				c := smallCommand()
				c.RecordFile = file
				tc.change(&c)
				var out strings.Builder
				if err := c.Run(context.Background(), &out); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Run() = %v, want an error saying %q", err, tc.wantErr)
				}
				b, err := os.ReadFile(file)
				switch {
				case existing && !bytes.Equal(b, old):
					t.Errorf("the trace already there is now %q (%v)", b, err)
				case !existing && len(b) > 0:
					t.Errorf("a refused command wrote a trace: %q", b)
				case !existing && strings.Contains(tc.wantErr, "--record") && !errors.Is(err, fs.ErrNotExist):
					t.Errorf("a trace refused for its flags was created (%v)", err)
				}
			}
		})
	}
	for _, tc := range []struct {
		name    string
		c       Command
		wantErr string
	}{
		{"bad rates", Command{Sweep: true, Rates: "0.5,fast", Backends: 3, Seeds: 1}, `--rates: "fast" is not a positive factor`},
		{"unknown scenario", Command{Scenario: "nope"}, `unknown scenario "nope"`},
		{"unknown engine model", Command{EngineModel: "sglang", Backends: 3, Seeds: 1}, `unknown engine model "sglang"`},
		{"engine model of a scenario", Command{EngineModel: LLMDSim, Scenario: "sglang-v04-shared-prefix"}, "--engine-model llm-d-sim: --scenario"},
		{"shared ledger of one replica", Command{SharedLedger: 100 * time.Millisecond, Replicas: 1, Backends: 3, Seeds: 1}, "--shared-ledger 100ms: give a positive interval, with --replicas 2 or more"},
		{"negative shared ledger", Command{SharedLedger: -time.Second, Replicas: 2, Backends: 3, Seeds: 1}, "--shared-ledger -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if err := tc.c.Run(context.Background(), &out); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Run() = %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}

// TestBenchCommandRuns runs each kind of emulated command small and checks
// what it prints and the files it writes.
func TestBenchCommandRuns(t *testing.T) {
	for _, tc := range []struct {
		name      string
		change    func(c *Command, dir string)
		wantOut   []string
		wantFiles []string // each is a PNG or valid JSON
		wantJSON  string   // in the JSON file
	}{
		{"tables", func(c *Command, dir string) {
			c.Policies = append(c.Policies, "ttft-true-cache")
			c.Clients = -1
			c.JSONFile, c.PlotFile = dir+"/b.json", dir+"/b.png"
		}, []string{"llmlb bench: 3 servers (3×h100-8b), engine model vllm-v1, seed 1, virtual time", "burst:", "ttft p50", "round-robin", "ttft-true-cache", "hit rate", "saturated: 96 clients", "saturated tok/s"},
			[]string{"b.json", "b.png"}, `"saturated_output_tokens_per_s"`},
		{"sweep", func(c *Command, dir string) {
			c.Sweep, c.Rates = true, "0.5, 2"
			c.JSONFile, c.PlotFile = dir+"/s.json", dir+"/s.png"
		}, []string{"x0.5", "x2", "worst TTFT p90 ratio", "plots: " + "DIR/s-burst.png"}, []string{"s.json", "s-burst.png"}, `"rate"`},
		{"seeds", func(c *Command, dir string) {
			c.Sweep, c.Seeds, c.Rates, c.JSONFile = true, 2, "2", dir+"/m.json"
		}, []string{"seeds 1-2", "summary over 2 seeds", "seeds worse", " of 2"}, []string{"m.json"}, `"ttft_p90_by_seed"`},
		{"replicas", func(c *Command, dir string) {
			c.Replicas, c.JSONFile = 3, dir+"/r.json"
		}, []string{"replicas: 3 independent balancers", "hit rate 3"}, []string{"r.json"}, `"hit_rate_r"`},
		{"replicas sharing a ledger", func(c *Command, dir string) {
			c.Replicas, c.SharedLedger, c.Rates, c.JSONFile = 3, 100*time.Millisecond, "0.5,2", dir+"/s.json"
		}, []string{"replicas sharing their ledgers every 100ms", "3 sharing their ledgers every 100ms (3 shared)", "kept 3 shared", "x0.5", "x2"}, []string{"s.json"}, `"hit_rate_shared"`},
		{"perturbed with KV events", func(c *Command, dir string) {
			c.Perturb, c.KVEvents = "prefill=2", true
		}, []string{"engines perturbed (prefill=2) without telling the balancer, servers publishing KV events"}, nil, ""},
		{"llm-d-sim", func(c *Command, dir string) {
			c.EngineModel, c.Perturb, c.JSONFile = LLMDSim, "request=2", dir+"/l.json"
		}, []string{"llmlb bench: 3 servers (3×llm-d-sim), engine model llm-d-sim, seed 1, virtual time, engines perturbed (request=2)", "burst:", "round-robin"},
			[]string{"l.json"}, `"ttft_p90"`},
		{"llm-d-sim sweep and replicas", func(c *Command, dir string) {
			c.EngineModel, c.Sweep, c.Rates, c.Replicas = LLMDSim, true, "1", 2
		}, []string{"engine model llm-d-sim", "x1"}, nil, ""},
		{"scenario", func(c *Command, dir string) {
			c.Scenario, c.JSONFile = "sglang-v04-shared-prefix", dir+"/e.json"
		}, []string{"cache-aware router (v0.4)", "158596", "best first: published"}, []string{"e.json"}, `"published"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := smallCommand()
			tc.change(&c, dir)
			var out strings.Builder
			if err := c.Run(context.Background(), &out); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wantOut {
				if w = strings.ReplaceAll(w, "DIR", dir); !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, f := range tc.wantFiles {
				b, err := os.ReadFile(filepath.Join(dir, f))
				switch {
				case err != nil:
					t.Error(err)
				case strings.HasSuffix(f, ".png") && !bytes.HasPrefix(b, []byte("\x89PNG")):
					t.Errorf("%s is not a PNG", f)
				case strings.HasSuffix(f, ".json") && (!json.Valid(b) || !strings.Contains(string(b), tc.wantJSON)):
					t.Errorf("%s lacks %s or is not JSON:\n%s", f, tc.wantJSON, b)
				}
			}
		})
	}
}

// TestBenchCommandTrace: the trace has a line a served request of each run,
// naming the run; with replicas, both the one-replica and the R-replica
// runs are there; the same command writes the same file.
func TestBenchCommandTrace(t *testing.T) {
	dir := t.TempDir()
	c := smallCommand()
	c.Replicas, c.Params.Seed = 2, 4
	var want []byte
	for i := range 2 {
		c.RecordFile = filepath.Join(dir, fmt.Sprintf("t%d.jsonl", i))
		if err := c.Run(context.Background(), new(strings.Builder)); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(c.RecordFile)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && !bytes.Equal(b, want) {
			t.Fatalf("the same command wrote another trace (%d bytes, then %d)", len(want), len(b))
		}
		want = b
	}
	runs := map[string]int{}
	for _, l := range readTrace(t, c.RecordFile) {
		if l.Workload != "burst" || l.Seed != 4 || l.Server == "" {
			t.Fatalf("line %+v", l)
		}
		runs[fmt.Sprintf("%s/%d", l.Policy, l.Replicas)]++
	}
	if len(runs) != 4 || runs["default/1"] == 0 || runs["default/1"] != runs["round-robin/2"] {
		t.Errorf("lines by policy/replicas: %v", runs)
	}
}

// TestBenchCommandTarget replays a workload over HTTP against an emulated
// server that names itself as a balancer's backend: it serves every
// request, and the table counts the idle backends the command names.
func TestBenchCommandTarget(t *testing.T) {
	ecfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.NewServer(sim.ServerConfig{Model: "m"}, sim.NewLive(ecfg, 50))
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(proxy.HeaderBackend, "only")
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "t.json")
	c := Command{Target: srv.URL, Label: "target", Workloads: []string{"burst"}, Backends: 3,
		Params: Params{Scale: 0.03, Rate: 4, Seed: 1}, JSONFile: file}
	var out strings.Builder
	if err := c.Run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "llmlb bench: target "+srv.URL+", seed 1, real time") || !strings.Contains(out.String(), "burst:") {
		t.Errorf("output:\n%s", out.String())
	}
	var rep struct {
		Workloads []struct {
			Backends int `json:"backends"`
			Results  []struct {
				Policy    string  `json:"policy"`
				Failed    int     `json:"failed"`
				Imbalance float64 `json:"imbalance"`
			} `json:"results"`
		} `json:"workloads"`
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Workloads) != 1 || len(rep.Workloads[0].Results) != 1 {
		t.Fatalf("json %s: %v", b, err)
	}
	// One backend served all, two named backends none: the busiest is 3x
	// the mean.
	if w, r := rep.Workloads[0], rep.Workloads[0].Results[0]; w.Backends != 3 || r.Policy != "target" || r.Failed != 0 || r.Imbalance != 3 {
		t.Errorf("%s", b)
	}
}
