package scrape

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/llmlb/llmlb/balancer"
)

// EngineConfig is one entry of the `engines:` section: the metrics path and
// the spec of each signal, in that engine's own metric names. A nil field
// keeps the built-in value of the engine of the same name (or is disabled
// for a new engine); an empty string disables the signal.
type EngineConfig struct {
	// MetricsPath is where the server serves Prometheus text. (default
	// /metrics; /prometheus/metrics for trtllm-serve)
	MetricsPath *string `mapstructure:"metrics_path"`
	// Queued counts requests waiting for the scheduler; several matching
	// series are summed.
	Queued *string `mapstructure:"queued"`
	// Running counts requests in the running batch; summed like Queued.
	Running *string `mapstructure:"running"`
	// KVUsage is the KV-cache utilisation as a 0..1 fraction; several
	// matching series (data-parallel ranks) are averaged.
	KVUsage *string `mapstructure:"kv_usage"`
	// BlockSize is tokens per KV-cache block, read from the sample value,
	// or from the label BlockSizeLabel when that is set (info gauges).
	BlockSize      *string `mapstructure:"block_size"`
	BlockSizeLabel *string `mapstructure:"block_size_label"`
	// NumBlocks is the KV-cache block count, from the value or from
	// NumBlocksLabel; several matching series (ranks) are summed.
	NumBlocks      *string `mapstructure:"num_blocks"`
	NumBlocksLabel *string `mapstructure:"num_blocks_label"`
	// LoRA is an info gauge shaped like vllm:lora_requests_info: labels
	// max_lora, running_lora_adapters and waiting_lora_adapters (comma
	// separated), value the time of its last update; the newest series wins.
	LoRA *string `mapstructure:"lora"`
	// RankLabel is the label whose value is a series' data-parallel rank;
	// "" (the default of a new row) when the engine labels none, so that
	// its server is one backend.
	RankLabel *string `mapstructure:"rank_label"`
}

// Engine is a compiled engine row: what to read from a backend's metrics
// page and where the page is. It is immutable once built.
type Engine struct {
	Name           string
	MetricsPath    string
	Queued         Alternatives
	Running        Alternatives
	KVUsage        Alternatives
	BlockSize      Alternatives
	BlockSizeLabel string
	NumBlocks      Alternatives
	NumBlocksLabel string
	LoRA           Alternatives
	// RankLabel is the label whose value is a series' data-parallel rank
	// (vLLM's engine, SGLang's dp_rank); "" when the engine labels none.
	RankLabel string

	needed map[string]bool // every metric name a spec names
}

// Signal names, as `llmlb probe` reports them missing.
const (
	SignalQueued    = "queued"
	SignalRunning   = "running"
	SignalKVUsage   = "kv_usage"
	SignalBlockSize = "block_size"
	SignalNumBlocks = "num_blocks"
	SignalLoRA      = "lora"
)

func ptr(s string) *string { return &s }

// builtinEngines are the engine rows llmlb ships. Every name, label and unit
// was checked against real /metrics pages; see scrape/testdata/README.md.
var builtinEngines = map[string]EngineConfig{
	// vLLM (vllm/v1/metrics/loggers.py). One series per data-parallel
	// engine, labels engine and model_name. kv_cache_usage_perc is a 0..1
	// fraction despite its name; releases before the V1 engine exported
	// gpu_cache_usage_perc instead. PrometheusStatLogger labels every
	// gauge with engine, the global DP rank (loggers.py at a6f0308c), so
	// one port serving ranks 4-7 shows engine="4" to engine="7".
	"vllm": {
		MetricsPath:    ptr("/metrics"),
		Queued:         ptr("vllm:num_requests_waiting"),
		Running:        ptr("vllm:num_requests_running"),
		KVUsage:        ptr("vllm:kv_cache_usage_perc | vllm:gpu_cache_usage_perc"),
		BlockSize:      ptr("vllm:cache_config_info"),
		BlockSizeLabel: ptr("block_size"),
		NumBlocks:      ptr("vllm:cache_config_info"),
		NumBlocksLabel: ptr("num_gpu_blocks"),
		LoRA:           ptr("vllm:lora_requests_info"),
		RankLabel:      ptr("engine"),
	},
	// SGLang (python/sglang/srt/metrics/collector.py). token_usage is the
	// used fraction of the token pool. cache_config_info{page_size,
	// num_pages} exists only in some releases; where it is absent the
	// block size and count are unknown. The scheduler gauges
	// (num_queue_reqs, num_running_reqs, token_usage) carry model_name,
	// engine_type, tp_rank and pp_rank, and dp_rank only when the
	// scheduler has one (init_metrics in
	// python/sglang/srt/managers/scheduler_metrics_mixin.py at 01bb3c80),
	// so a server without data parallelism is one backend.
	"sglang": {
		MetricsPath:    ptr("/metrics"),
		Queued:         ptr("sglang:num_queue_reqs"),
		Running:        ptr("sglang:num_running_reqs"),
		KVUsage:        ptr("sglang:token_usage"),
		BlockSize:      ptr("sglang:cache_config_info"),
		BlockSizeLabel: ptr("page_size"),
		NumBlocks:      ptr("sglang:cache_config_info"),
		NumBlocksLabel: ptr("num_pages"),
		LoRA:           ptr(""),
		RankLabel:      ptr("dp_rank"),
	},
	// Triton with the TensorRT-LLM backend: batch manager statistics on the
	// metrics port (8002 by default), one gauge family keyed by a type label.
	"triton-tensorrt-llm": {
		MetricsPath: ptr("/metrics"),
		Queued:      ptr("nv_trt_llm_request_metrics{request_type=waiting}"),
		Running:     ptr("nv_trt_llm_request_metrics{request_type=scheduled}"),
		KVUsage:     ptr("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),
		BlockSize:   ptr("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
		NumBlocks:   ptr("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"),
		LoRA:        ptr(""),
	},
	// trtllm-serve (tensorrt_llm/metrics/collector.py): Prometheus text at
	// /prometheus/metrics, while its /metrics answers JSON iteration stats.
	// kv_cache_utilization is usedNumBlocks/maxNumBlocks.
	"trtllm-serve": {
		MetricsPath: ptr("/prometheus/metrics"),
		Queued:      ptr("trtllm_num_requests_waiting"),
		Running:     ptr("trtllm_num_requests_running"),
		KVUsage:     ptr("trtllm_kv_cache_utilization"),
		BlockSize:   ptr("trtllm_kv_cache_tokens_per_block"),
		NumBlocks:   ptr("trtllm_kv_cache_max_blocks"),
		LoRA:        ptr(""),
	},
}

// numericSignal is one number an engine row reads: where it goes, its
// specs, and how several matching series fold into one.
type numericSignal struct {
	name  string
	alts  Alternatives
	label string // read the value from this label (an info gauge), not the sample
	fold  func([]float64) float64
	field func(*balancer.Metrics) *balancer.Value
}

// numericSignals lists e's numeric signals. Counts from several series
// (data-parallel ranks, or one model_name per LoRA adapter) are summed, as
// are block counts (one pool per rank); a KV fraction over ranks is their
// mean, never their sum; the block size is the largest.
func (e *Engine) numericSignals() []numericSignal {
	return []numericSignal{
		{SignalQueued, e.Queued, "", sum, func(m *balancer.Metrics) *balancer.Value { return &m.Queued }},
		{SignalRunning, e.Running, "", sum, func(m *balancer.Metrics) *balancer.Value { return &m.Running }},
		{SignalKVUsage, e.KVUsage, "", mean, func(m *balancer.Metrics) *balancer.Value { return &m.KVUsage }},
		{SignalBlockSize, e.BlockSize, e.BlockSizeLabel, slices.Max[[]float64], func(m *balancer.Metrics) *balancer.Value { return &m.BlockSize }},
		{SignalNumBlocks, e.NumBlocks, e.NumBlocksLabel, sum, func(m *balancer.Metrics) *balancer.Value { return &m.NumBlocks }},
	}
}

// spec returns the spec string of a signal, for messages.
func (e *Engine) spec(signal string) string {
	if signal == SignalLoRA {
		return e.LoRA.String()
	}
	for _, s := range e.numericSignals() {
		if s.name == signal {
			return s.alts.String()
		}
	}
	return ""
}

// EngineSet is every engine a config can name: the built-in rows with the
// `engines:` section laid over them. It is immutable once built.
type EngineSet map[string]*Engine

// Names returns the engine names, sorted.
func (s EngineSet) Names() []string { return slices.Sorted(maps.Keys(s)) }

// NewEngineSet compiles the built-in rows with overrides laid over them,
// field by field. Every problem is reported at once, each naming its key
// under `engines.`.
func NewEngineSet(overrides map[string]EngineConfig) (EngineSet, error) {
	set := EngineSet{}
	var errs []error
	names := slices.Sorted(maps.Keys(builtinEngines))
	for name := range overrides {
		if _, ok := builtinEngines[name]; !ok {
			names = append(names, name)
		}
	}
	for _, name := range names {
		if name == Auto {
			errs = append(errs, fmt.Errorf("engines.%s: %q is reserved for engine detection; name the row otherwise", name, Auto))
			continue
		}
		cfg := overlay(builtinEngines[name], overrides[name])
		e, err := compileEngine(name, cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		set[name] = e
	}
	return set, errors.Join(errs...)
}

// overlay returns base with every non-nil field of over in its place.
func overlay(base, over EngineConfig) EngineConfig {
	pick := func(b, o *string) *string {
		if o != nil {
			return o
		}
		return b
	}
	return EngineConfig{
		MetricsPath:    pick(base.MetricsPath, over.MetricsPath),
		Queued:         pick(base.Queued, over.Queued),
		Running:        pick(base.Running, over.Running),
		KVUsage:        pick(base.KVUsage, over.KVUsage),
		BlockSize:      pick(base.BlockSize, over.BlockSize),
		BlockSizeLabel: pick(base.BlockSizeLabel, over.BlockSizeLabel),
		NumBlocks:      pick(base.NumBlocks, over.NumBlocks),
		NumBlocksLabel: pick(base.NumBlocksLabel, over.NumBlocksLabel),
		LoRA:           pick(base.LoRA, over.LoRA),
		RankLabel:      pick(base.RankLabel, over.RankLabel),
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// compileEngine parses every spec of cfg.
func compileEngine(name string, cfg EngineConfig) (*Engine, error) {
	e := &Engine{
		Name:           name,
		MetricsPath:    deref(cfg.MetricsPath),
		BlockSizeLabel: deref(cfg.BlockSizeLabel),
		NumBlocksLabel: deref(cfg.NumBlocksLabel),
		RankLabel:      deref(cfg.RankLabel),
		needed:         map[string]bool{},
	}
	if cfg.MetricsPath == nil {
		e.MetricsPath = "/metrics"
	}
	var errs []error
	if e.MetricsPath != "" && !strings.HasPrefix(e.MetricsPath, "/") {
		errs = append(errs, fmt.Errorf("engines.%s.metrics_path: must start with /, got %q", name, e.MetricsPath))
	}
	for _, f := range []struct {
		key string
		src *string
		dst *Alternatives
	}{
		{"queued", cfg.Queued, &e.Queued},
		{"running", cfg.Running, &e.Running},
		{"kv_usage", cfg.KVUsage, &e.KVUsage},
		{"block_size", cfg.BlockSize, &e.BlockSize},
		{"num_blocks", cfg.NumBlocks, &e.NumBlocks},
		{"lora", cfg.LoRA, &e.LoRA},
	} {
		alts, err := ParseAlternatives(deref(f.src))
		if err != nil {
			errs = append(errs, fmt.Errorf("engines.%s.%s: %w", name, f.key, err))
			continue
		}
		*f.dst = alts
		for _, s := range alts {
			e.needed[s.Name] = true
		}
	}
	for _, l := range []struct{ key, v string }{{"block_size_label", e.BlockSizeLabel}, {"num_blocks_label", e.NumBlocksLabel}, {"rank_label", e.RankLabel}} {
		if l.v != "" && labelLen(l.v) != len(l.v) {
			errs = append(errs, fmt.Errorf("engines.%s.%s: %q is not a label name", name, l.key, l.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return e, nil
}
