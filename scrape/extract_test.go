package scrape

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

func engineSet(t testing.TB, overrides map[string]EngineConfig) EngineSet {
	t.Helper()
	set, err := NewEngineSet(overrides)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func v(x float64) balancer.Value { return balancer.Known(x) }

// TestExtractRealPages reads the pages under testdata (see its README for
// where each comes from) with the built-in engine rows and checks every
// signal.
func TestExtractRealPages(t *testing.T) {
	set := engineSet(t, nil)
	at := time.Unix(1_790_000_000, 0)
	tests := []struct {
		file, engine string
		want         balancer.Metrics
		wantMissing  []string
		wantUsed     map[string]string
	}{
		{
			file: "vllm-v1-dp2-lora.txt", engine: "vllm",
			// Two data-parallel engines: counts summed, KV averaged,
			// blocks summed; waiting_by_reason is a different metric;
			// the newest LoRA series wins.
			want: balancer.Metrics{
				Queued: v(11), Running: v(13), KVUsage: v((0.4375 + 0.9125) / 2),
				BlockSize: v(16), NumBlocks: v(2 * 14835),
				LoRA: &balancer.LoRAInfo{Max: 2, Running: []string{"sql-lora", "chat-lora"}, Waiting: []string{"tool-lora"}},
			},
			wantUsed: map[string]string{SignalKVUsage: "vllm:kv_cache_usage_perc"},
		},
		{
			file: "vllm-0.22-excerpt.txt", engine: "vllm",
			// A current release, idle, as its author kept it: no
			// cache_config_info (unknown, not 0) and no LoRA info.
			want:        balancer.Metrics{Queued: v(0), Running: v(0), KVUsage: v(0)},
			wantMissing: []string{SignalBlockSize, SignalLoRA, SignalNumBlocks},
			wantUsed:    map[string]string{SignalKVUsage: "vllm:kv_cache_usage_perc"},
		},
		{
			file: "vllm-0.7-aibrix.txt", engine: "vllm",
			// The older engine: gpu_cache_usage_perc is read because
			// kv_cache_usage_perc is absent.
			want: balancer.Metrics{
				Queued: v(0), Running: v(0), KVUsage: v(0),
				BlockSize: v(16), NumBlocks: v(81767),
				LoRA: &balancer.LoRAInfo{Max: 0, Running: []string{}, Waiting: []string{}},
			},
			wantUsed: map[string]string{SignalKVUsage: "vllm:gpu_cache_usage_perc"},
		},
		{
			file: "sglang-docs.txt", engine: "sglang",
			// This release has no cache_config_info: block size and
			// count are unknown, not 0.
			want:        balancer.Metrics{Queued: v(2826), Running: v(162), KVUsage: v(0.28)},
			wantMissing: []string{SignalBlockSize, SignalNumBlocks},
		},
		{
			file: "triton-trtllm.txt", engine: "triton-tensorrt-llm",
			want: balancer.Metrics{Queued: v(1), Running: v(1), KVUsage: v(0.4875), BlockSize: v(64), NumBlocks: v(6239)},
		},
		{
			file: "trtllm-serve.txt", engine: "trtllm-serve",
			want: balancer.Metrics{Queued: v(1), Running: v(3), KVUsage: v(0.62), BlockSize: v(32), NumBlocks: v(62762)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			page, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			r, err := set[tt.engine].Extract(page, at)
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			tt.want.At = at
			if msg := diffMetrics(tt.want, r.Metrics); msg != "" {
				t.Error(msg)
			}
			if !slices.Equal(r.Missing, tt.wantMissing) {
				t.Errorf("missing = %v, want %v", r.Missing, tt.wantMissing)
			}
			for sig, spec := range tt.wantUsed {
				if r.Used[sig] != spec {
					t.Errorf("%s read from %q, want %q", sig, r.Used[sig], spec)
				}
			}
		})
	}
}

func diffMetrics(want, got balancer.Metrics) string {
	var b strings.Builder
	for _, f := range []struct {
		name      string
		want, got balancer.Value
	}{
		{"queued", want.Queued, got.Queued},
		{"running", want.Running, got.Running},
		{"kv_usage", want.KVUsage, got.KVUsage},
		{"block_size", want.BlockSize, got.BlockSize},
		{"num_blocks", want.NumBlocks, got.NumBlocks},
	} {
		if f.want.Known != f.got.Known || (f.want.Known && !near(f.want.V, f.got.V)) {
			b.WriteString(f.name + ": got " + fmtValue(f.got) + ", want " + fmtValue(f.want) + "\n")
		}
	}
	switch {
	case (want.LoRA == nil) != (got.LoRA == nil):
		b.WriteString("lora: presence differs\n")
	case want.LoRA != nil && (want.LoRA.Max != got.LoRA.Max || !slices.Equal(want.LoRA.Running, got.LoRA.Running) || !slices.Equal(want.LoRA.Waiting, got.LoRA.Waiting)):
		b.WriteString("lora differs\n")
	}
	if !want.At.Equal(got.At) {
		b.WriteString("at differs\n")
	}
	return b.String()
}

func near(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 }

func fmtValue(x balancer.Value) string {
	j, _ := x.MarshalJSON()
	return string(j)
}

// TestExtractEdgeCases covers pages no engine writes on purpose.
func TestExtractEdgeCases(t *testing.T) {
	set := engineSet(t, nil)
	vllm := set["vllm"]
	tests := []struct {
		name        string
		page        string
		wantErr     error // nil: no error; errAny: some error
		want        balancer.Metrics
		wantMissing []string
	}{
		{name: "empty page", page: "", wantErr: ErrNoData},
		{name: "only comments", page: "# HELP x y\n\n# TYPE x gauge\n", wantErr: ErrNoData},
		{
			name:        "unrelated metrics only",
			page:        "process_cpu_seconds_total 12.5\n",
			wantMissing: []string{SignalBlockSize, SignalKVUsage, SignalLoRA, SignalNumBlocks, SignalQueued, SignalRunning},
		},
		{
			name:        "histogram named like a signal is not a gauge",
			page:        "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 9\nvllm:num_requests_waiting_sum 3\nvllm:num_requests_waiting_count 9\nvllm:num_requests_running 2\n",
			want:        balancer.Metrics{Running: v(2)},
			wantMissing: []string{SignalBlockSize, SignalKVUsage, SignalLoRA, SignalNumBlocks, SignalQueued},
		},
		{
			name:        "garbage in a family we do not read is skipped",
			page:        "python_gc{{{ not prometheus\nvllm:num_requests_waiting 4\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n",
			want:        balancer.Metrics{Queued: v(4), Running: v(1), KVUsage: v(0.5)},
			wantMissing: []string{SignalBlockSize, SignalLoRA, SignalNumBlocks},
		},
		{name: "garbage in a family we read fails the page", page: "vllm:num_requests_waiting{engine=\"0\" 4\n", wantErr: errAny},
		{
			name:        "NaN and None are unknown",
			page:        "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_waiting 1\nvllm:cache_config_info{block_size=\"None\",num_gpu_blocks=\"None\"} 1\n",
			want:        balancer.Metrics{Queued: v(1)},
			wantMissing: []string{SignalBlockSize, SignalKVUsage, SignalLoRA, SignalNumBlocks, SignalRunning},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := vllm.Extract([]byte(tt.page), time.Time{})
			switch {
			case tt.wantErr == errAny:
				if err == nil {
					t.Fatal("Extract succeeded, want an error")
				}
				return
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Extract error = %v, want %v", err, tt.wantErr)
				}
				return
			case err != nil:
				t.Fatalf("Extract: %v", err)
			}
			if msg := diffMetrics(tt.want, r.Metrics); msg != "" {
				t.Error(msg)
			}
			if !slices.Equal(r.Missing, tt.wantMissing) {
				t.Errorf("missing = %v, want %v", r.Missing, tt.wantMissing)
			}
		})
	}
}

var errAny = errors.New("any error")

// TestLoRATiesAreDeterministic: several series share the newest value; the
// choice does not depend on the order of the lines.
func TestLoRATiesAreDeterministic(t *testing.T) {
	lines := []string{
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 100`,
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="b,c",waiting_lora_adapters=""} 100`,
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="c,b",waiting_lora_adapters=""} 100`,
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="z",waiting_lora_adapters="x"} 99`,
	}
	vllm := engineSet(t, nil)["vllm"]
	var first []string
	for i := range lines {
		page := strings.Join(append(slices.Clone(lines[i:]), lines[:i]...), "\n")
		r, err := vllm.Extract([]byte(page), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = r.Metrics.LoRA.Running
		}
		if !slices.Equal(r.Metrics.LoRA.Running, first) {
			t.Fatalf("rotation %d chose %v, rotation 0 chose %v", i, r.Metrics.LoRA.Running, first)
		}
	}
	if !slices.Equal(first, []string{"c", "b"}) {
		t.Errorf("chose %v, want [c b] (most running adapters, then greatest label value)", first)
	}
}

// TestEngineOverrides lays config over the built-in rows.
func TestEngineOverrides(t *testing.T) {
	set := engineSet(t, map[string]EngineConfig{
		// Narrow vLLM's queue to one rank and disable LoRA.
		"vllm": {Queued: ptr(`vllm:num_requests_waiting{engine="1"}`), LoRA: ptr("")},
		// A new engine with only a queue signal.
		"my-engine": {MetricsPath: ptr("/stats"), Queued: ptr("my_queue")},
	})
	page, err := os.ReadFile("testdata/vllm-v1-dp2-lora.txt")
	if err != nil {
		t.Fatal(err)
	}
	r, err := set["vllm"].Extract(page, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Metrics.Queued != v(9) || r.Metrics.Running != v(13) || r.Metrics.LoRA != nil {
		t.Errorf("overridden vllm read queued %v running %v lora %v", r.Metrics.Queued, r.Metrics.Running, r.Metrics.LoRA)
	}
	my := set["my-engine"]
	if my.MetricsPath != "/stats" || len(my.Running) != 0 || my.Queued.String() != "my_queue" {
		t.Errorf("my-engine = %+v", my)
	}
	if _, err := NewEngineSet(map[string]EngineConfig{"sglang": {Queued: ptr("bad{")}}); err == nil || !strings.Contains(err.Error(), "engines.sglang.queued") {
		t.Errorf("bad spec error = %v, want it to name engines.sglang.queued", err)
	}
}

// BenchmarkExtract reads the largest real page with the vLLM row.
func BenchmarkExtract(b *testing.B) {
	page, err := os.ReadFile("testdata/vllm-0.7-aibrix.txt")
	if err != nil {
		b.Fatal(err)
	}
	vllm := engineSet(b, nil)["vllm"]
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := vllm.Extract(page, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}
