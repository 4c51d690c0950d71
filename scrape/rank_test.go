package scrape

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/sim"
)

// TestExtractReadsRanksApart: a vLLM page of two data-parallel engines
// gives each rank its own queue, running count, KV use and blocks, and
// both the server's LoRA information, which carries no engine label.
func TestExtractReadsRanksApart(t *testing.T) {
	page, err := os.ReadFile("testdata/vllm-v1-dp2-lora.txt")
	if err != nil {
		t.Fatal(err)
	}
	r, err := engineSet(t, nil)["vllm"].Extract(page, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rank                      int
		wantQueued, wantRunning   float64
		wantKVUsage, wantNumBlock float64
	}{
		{rank: 0, wantQueued: 2, wantRunning: 5, wantKVUsage: 0.4375, wantNumBlock: 14835},
		{rank: 1, wantQueued: 9, wantRunning: 8, wantKVUsage: 0.9125, wantNumBlock: 14835},
	} {
		m, ok := r.Ranks[tc.rank]
		if !ok {
			t.Fatalf("Ranks = %v, want ranks 0 and 1", r.Ranks)
		}
		got := []balancer.Value{m.Queued, m.Running, m.KVUsage, m.NumBlocks, m.BlockSize}
		want := []float64{tc.wantQueued, tc.wantRunning, tc.wantKVUsage, tc.wantNumBlock, 16}
		for i := range got {
			if !got[i].Known || got[i].V != want[i] {
				t.Errorf("rank %d: reading %d = %+v, want %g", tc.rank, i, got[i], want[i])
			}
		}
		if m.LoRA == nil || strings.Join(m.LoRA.Running, ",") != "sql-lora,chat-lora" {
			t.Errorf("rank %d: LoRA %+v, want the server's newest", tc.rank, m.LoRA)
		}
	}
	if len(r.Ranks) != 2 {
		t.Errorf("Ranks has %d entries, want 2", len(r.Ranks))
	}
	if r.Metrics.Queued.V != 11 {
		t.Errorf("whole server queued %g, want the sum 11", r.Metrics.Queued.V)
	}
}

// TestEngineRowSetsItsRankLabel: the rank label is a field of the engine
// row like its specs: a row of the operator's own can name one, vLLM's
// can be overridden to none, and a label that is no label name is refused
// under its key.
func TestEngineRowSetsItsRankLabel(t *testing.T) {
	set := engineSet(t, map[string]EngineConfig{
		"mine":       {Queued: ptr("my:queue"), RankLabel: ptr("dp")},
		"vllm":       {RankLabel: ptr("")},
		"mine-no-dp": {Queued: ptr("my:queue")},
	})
	for _, tc := range []struct {
		engine    string
		page      string
		wantRanks []int
	}{
		{"mine", "my:queue{dp=\"0\"} 2\nmy:queue{dp=\"1\"} 3\n", []int{0, 1}},
		{"mine-no-dp", "my:queue{dp=\"0\"} 2\nmy:queue{dp=\"1\"} 3\n", nil},
		{"vllm", "vllm:num_requests_waiting{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"1\"} 3\n", nil},
		{"sglang", "sglang:num_queue_reqs{dp_rank=\"0\"} 2\nsglang:num_queue_reqs{dp_rank=\"1\"} 3\n", []int{0, 1}},
	} {
		r, err := set[tc.engine].Extract([]byte(tc.page), time.Time{})
		if err != nil {
			t.Fatalf("%s: %v", tc.engine, err)
		}
		if got := slices.Sorted(maps.Keys(r.Ranks)); !slices.Equal(got, tc.wantRanks) {
			t.Errorf("%s: ranks %v, want %v", tc.engine, got, tc.wantRanks)
		}
		if r.Metrics.Queued != balancer.Known(5) {
			t.Errorf("%s: whole server queued %v, want the sum 5", tc.engine, r.Metrics.Queued)
		}
	}
	_, err := NewEngineSet(map[string]EngineConfig{"mine": {RankLabel: ptr("dp-rank")}})
	if want := `engines.mine.rank_label: "dp-rank" is not a label name`; err == nil || err.Error() != want {
		t.Errorf("NewEngineSet with a bad rank_label: %v, want %q", err, want)
	}
}

// TestExtractReadsSGLangRanksApart: an SGLang page of two data-parallel
// ranks, whose scheduler gauges carry dp_rank beside tp_rank and pp_rank,
// gives each rank its own queue, running count and token usage; the
// tokenizer's families, labelled model_name only, decide nothing.
func TestExtractReadsSGLangRanksApart(t *testing.T) {
	page, err := os.ReadFile("testdata/sglang-dp2.txt")
	if err != nil {
		t.Fatal(err)
	}
	r, err := engineSet(t, nil)["sglang"].Extract(page, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rank                    int
		wantQueued, wantRunning float64
		wantKVUsage             float64
	}{
		{rank: 0, wantQueued: 1, wantRunning: 6, wantKVUsage: 0.25},
		{rank: 1, wantQueued: 7, wantRunning: 11, wantKVUsage: 0.8125},
	} {
		m, ok := r.Ranks[tc.rank]
		if !ok {
			t.Fatalf("Ranks = %v, want ranks 0 and 1", r.Ranks)
		}
		got := []balancer.Value{m.Queued, m.Running, m.KVUsage}
		want := []float64{tc.wantQueued, tc.wantRunning, tc.wantKVUsage}
		for i := range got {
			if !got[i].Known || got[i].V != want[i] {
				t.Errorf("rank %d: reading %d = %+v, want %g", tc.rank, i, got[i], want[i])
			}
		}
		if m.BlockSize.Known || m.NumBlocks.Known {
			t.Errorf("rank %d: block size %+v, blocks %+v; want unknown, the page has no cache_config_info", tc.rank, m.BlockSize, m.NumBlocks)
		}
	}
	if len(r.Ranks) != 2 {
		t.Errorf("Ranks has %d entries, want 2", len(r.Ranks))
	}
	if r.Metrics.Queued.V != 8 || r.Metrics.Running.V != 17 || r.Metrics.KVUsage.V != 0.53125 {
		t.Errorf("whole server queued %g, running %g, KV %g; want the sums 8 and 17 and the mean 0.53125",
			r.Metrics.Queued.V, r.Metrics.Running.V, r.Metrics.KVUsage.V)
	}
}

// TestExtractRanksOfEmulatedServer: the emulated servers of ranks 4-7,
// vLLM's and SGLang's, read as ranks 4-7; an SGLang page of one rank,
// which has no dp_rank label, reads none.
func TestExtractRanksOfEmulatedServer(t *testing.T) {
	sts := []sim.Stats{{Waiting: 1}, {Waiting: 2}, {Waiting: 3}, {Waiting: 4}}
	for _, engine := range []string{"vllm", "sglang"} {
		page := sim.RenderRankMetrics(engine, "m", false, 4, sts, time.Time{})
		r, err := engineSet(t, nil)[engine].Extract([]byte(page), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Ranks) != 4 {
			t.Errorf("%s: Ranks %v, want 4 to 7", engine, r.Ranks)
		}
		for i := range 4 {
			if q := r.Ranks[4+i].Queued; q.V != float64(i+1) {
				t.Errorf("%s: rank %d queued %+v, want %d", engine, 4+i, q, i+1)
			}
		}
	}
	r, err := engineSet(t, nil)["sglang"].Extract([]byte(sim.RenderMetrics("sglang", "m", false, sts[0], time.Time{})), time.Time{})
	if err != nil || r.Ranks != nil {
		t.Errorf("sglang page of one rank: Ranks %v, err %v; want none", r.Ranks, err)
	}
}

func TestRankEndpoint(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		rank     int
		want     string
	}{
		{"tcp://10.0.0.5:5557", 0, "tcp://10.0.0.5:5557"},
		{"tcp://10.0.0.5:5557", 5, "tcp://10.0.0.5:5562"},
		{"tcp://[fd00::1]:5558", 2, "tcp://[fd00::1]:5560"},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv"},
		{"ipc:///tmp/kv", 1, ""},
		{"tcp://host", 1, ""},
		{"tcp://h:65535", 1, ""},
		{"", 3, ""},
	} {
		if got := RankEndpoint(tc.endpoint, tc.rank); got != tc.want {
			t.Errorf("RankEndpoint(%q, %d) = %q, want %q", tc.endpoint, tc.rank, got, tc.want)
		}
	}
}

// FuzzRankEndpoint: rank 0 keeps the endpoint; any other rank gives ""
// or a tcp endpoint with the same address and a port rank higher.
func FuzzRankEndpoint(f *testing.F) {
	f.Add("tcp://10.0.0.5:5557", 5)
	f.Add("ipc:///x", 1)
	f.Add("tcp://:", 2)
	f.Fuzz(func(t *testing.T, endpoint string, rank int) {
		if rank < 0 {
			return
		}
		got := RankEndpoint(endpoint, rank)
		if rank == 0 {
			if got != endpoint {
				t.Fatalf("RankEndpoint(%q, 0) = %q", endpoint, got)
			}
			return
		}
		if got == "" {
			return
		}
		i, j := strings.LastIndexByte(endpoint, ':'), strings.LastIndexByte(got, ':')
		if !strings.HasPrefix(got, "tcp://") || got[:j] != endpoint[:i] {
			t.Fatalf("RankEndpoint(%q, %d) = %q: another address", endpoint, rank, got)
		}
		p, err1 := strconv.Atoi(endpoint[i+1:])
		q, err2 := strconv.Atoi(got[j+1:])
		if err1 != nil || err2 != nil || q != p+rank || q > 65535 {
			t.Fatalf("RankEndpoint(%q, %d) = %q: port not offset by the rank", endpoint, rank, got)
		}
	})
}

func TestValidateBackendsDataParallel(t *testing.T) {
	names := engineSet(t, nil).Names()
	if err := ValidateBackends([]BackendConfig{{URL: "http://a:8000", DataParallelSize: 4, DataParallelStartRank: 4}}, names); err != nil {
		t.Errorf("ranks 4-7: %v", err)
	}
	err := ValidateBackends([]BackendConfig{
		{URL: "http://a:8000", DataParallelSize: -1},
		{URL: "http://b:8000", DataParallelStartRank: -2, DataParallelSize: 2},
		{URL: "http://c:8000", DataParallelStartRank: 4},
	}, names)
	for _, want := range []string{
		"backends[0].data_parallel_size: must not be negative",
		"backends[1].data_parallel_start_rank: must not be negative",
		"backends[2].data_parallel_start_rank: set without data_parallel_size",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateBackends error %v, want it to say %q", err, want)
		}
	}
}

// TestRanksDetectedAndResized: a vLLM server of ranks 4-7 is published as
// four backends once its page is read, and a reload that makes it
// data_parallel_size 2 from rank 4 leaves ranks 4 and 5 alone.
func TestRanksDetectedAndResized(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		models := make([]sim.Model, 4)
		for i := range models {
			models[i] = sim.NewSteady(sim.SteadyConfig{})
		}
		s, err := sim.NewDataParallelServer(sim.ServerConfig{Model: "m", DataParallelStartRank: 4}, models)
		if err != nil {
			t.Fatal(err)
		}
		bn := newBubbleNet(t)
		url := bn.serve("gpu-0:8000", s.Handler())
		bal := testBalancer(t)
		m, err := NewManager(Setup{Config: dnsConfig(), DefaultEngine: "vllm", Balancer: bal, Client: bn.client, Backends: []BackendConfig{{URL: url}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(ctx) }()
		defer func() { cancel(); <-done }()
		rankIDs := func(ranks ...int) []string {
			var out []string
			for _, r := range ranks {
				out = append(out, balancer.RankID(url, r))
			}
			return out
		}
		all := func() []string {
			var out []string
			for _, be := range bal.Snapshot().Backends {
				out = append(out, be.ID)
			}
			return out
		}
		waitFor(t, "ranks 4-7", func() bool { return slices.Equal(all(), rankIDs(4, 5, 6, 7)) })
		for _, be := range bal.Snapshot().Backends {
			if !be.Ranked || be.ID != balancer.RankID(url, be.Rank) || !be.Metrics.Queued.Known {
				t.Errorf("%s: ranked %v rank %d queued %+v, want its rank and its own reading", be.ID, be.Ranked, be.Rank, be.Metrics.Queued)
			}
		}
		if err := m.Reload([]BackendConfig{{URL: url, DataParallelSize: 2, DataParallelStartRank: 4}}, engineSet(t, nil), "vllm"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "ranks 4 and 5", func() bool { return slices.Equal(all(), rankIDs(4, 5)) })
	})
}
