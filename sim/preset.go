package sim

import (
	"fmt"
	"slices"
	"time"
)

// Cost is the step-time model of an engine: one step (one forward pass over
// the scheduled batch) takes
//
//	Step + PrefillToken×(prompt tokens computed) + Sequence×(decoding
//	sequences) + ContextToken×(KV tokens the decodes read) +
//	Attention×(thousands of query-key pairs the prefill chunks compute)
//
// plus a LoRA load delay for each adapter brought onto the GPU. It is the
// shape that step-level simulators (Vidur, DistServe's latency model) fit
// to measured forward passes: a memory-bound part that does not depend on
// the batch (reading the weights), a compute-bound part per new token, a
// decode attention part that reads each sequence's KV, and a prefill
// attention part that grows with the square of the context (a chunk of n
// tokens after c computed ones computes n×c + n(n+1)/2 pairs).
//
// Request and RequestToken are the server's own work on each request
// before its scheduler sees it (HTTP, parsing, tokenising, the engine
// core's input queue): a prefix-cache hit does not remove it.
type Cost struct {
	Step         time.Duration
	PrefillToken time.Duration
	Sequence     time.Duration
	ContextToken time.Duration
	Attention    time.Duration // per thousand query-key pairs
	Request      time.Duration
	RequestToken time.Duration
}

// PrefillRate returns c with prefill f times as fast: its per-token
// prefill and attention costs divided by f.
func (c Cost) PrefillRate(f float64) Cost {
	c.PrefillToken = time.Duration(float64(c.PrefillToken) / f)
	c.Attention = time.Duration(float64(c.Attention) / f)
	return c
}

// Intake is how long a request of promptTokens takes to reach the
// scheduler.
func (c Cost) Intake(promptTokens int) time.Duration {
	return c.Request + time.Duration(promptTokens)*c.RequestToken
}

// EngineConfig shapes an [Engine]. Zero fields take the h100-8b preset's
// values.
type EngineConfig struct {
	Cost Cost
	// BlockSize is tokens per KV block. (default 16, vLLM's)
	BlockSize int
	// NumBlocks is the KV blocks the GPU holds.
	NumBlocks int
	// MaxNumSeqs caps the sequences running at once (vLLM max_num_seqs).
	MaxNumSeqs int
	// MaxBatchedTokens is the token budget of one step, shared by decodes
	// and prefill chunks (vLLM max_num_batched_tokens).
	MaxBatchedTokens int
	// MaxLoRA is how many adapters the running batch may use at once
	// (vLLM max_loras); it is also the adapter slots on the GPU.
	MaxLoRA int
	// LoRALoadDelay is added to a step that brings an adapter onto the GPU.
	LoRALoadDelay time.Duration
	// NoPrefixCaching turns automatic prefix caching off.
	NoPrefixCaching bool
	// CacheOnCompute enters a prompt block into the prefix cache only
	// once the step that computes it has run, as SGLang does (its
	// scheduler inserts a prefilled request into the radix tree after the
	// forward pass, process_batch_result_prefill in
	// python/sglang/srt/managers/scheduler_output_processor_mixin.py at
	// 5294b03c), so two requests sharing a prefix admitted in one step
	// both compute it. Unset, a block is cached when it is scheduled, as
	// vLLM V1 does ([Engine.register]).
	CacheOnCompute bool
	// KVEvents: the engine records a [KVEvent] whenever a block enters or
	// leaves the prefix cache, for [Engine.TakeKVEvents].
	KVEvents bool
}

// CachesOnCompute reports whether servers of an engine flavour take a
// prefix into their cache only once it is computed ([EngineConfig.CacheOnCompute]):
// SGLang's do; vLLM's cache it when scheduled.
func CachesOnCompute(engine string) bool { return engine == "sglang" }

// Preset names, the default first.
var presetNames = []string{"h100-8b", "a100-8b", "a100-80g-8b", "h100x2-qwen3-32b"}

// PresetNames lists the built-in engine presets, the default first.
func PresetNames() []string { return slices.Clone(presetNames) }

// Preset returns a built-in engine configuration. Each constant is derived
// from the hardware and model below and then held to published
// measurements by TestCalibration (docs/simulator.md: the calibration
// table).
//
// h100-8b: one H100 SXM 80GB serving Llama-3.1-8B in bf16 with vLLM V1.
//   - Weights: 8.03e9 parameters × 2 bytes = 16.1 GB. HBM3 bandwidth 3.35
//     TB/s (NVIDIA H100 datasheet), so reading them once takes 4.8 ms; with
//     kernel launch and scheduler overhead a decode step of one sequence
//     takes 6.4 ms, the TPOT vLLM 0.21.0 measured at one request
//     (yobitelcomm InferenceBench concurrency sweep, 2026-05-16: 6.48 ms).
//     Step = 6.4 ms.
//   - A new token costs 2 × 8.03e9 = 16.1 GFLOP. bf16 dense peak is 989
//     TFLOPS (datasheet); at 50% model-FLOPs utilisation, typical of
//     prefill, that is 32 µs a token (~31k prefill tokens/s).
//     PrefillToken = 32 µs.
//   - Prefill attention: QKᵀ and AV are 4 × 4,096 (model width) × 32
//     layers = 0.52 MFLOP per query-key pair; at 40% of peak (flash
//     attention) 1.3 ns. Attention = 1.3 µs a thousand pairs: a 32k-token prompt spends
//     0.67 s there against 1.0 s in the linear part.
//   - A decoding sequence adds its token's compute plus sampling, output
//     processing and scheduling in vLLM's Python: Sequence = 230 µs,
//     fitted to the TPOT and throughput the same sweep measured at 16
//     concurrent requests (10.94 ms, 1,384 tokens/s); at 4 it gives 7.4
//     ms against 6.59 measured.
//   - KV per token: 2 (K and V) × 32 layers × 8 KV heads × 128 dims × 2
//     bytes = 128 KiB (Llama-3.1-8B config). Reading it at 3.35 TB/s is
//     39 ns: ContextToken = 39 ns.
//   - Request = 3 ms, RequestToken = 1 µs: HTTP, request parsing and
//     tokenising (a fast tokenizer does about a million tokens a second
//     on one core); with the step and a short prompt's prefill this makes
//     the 14 ms TTFT the sweep measured at one request.
//   - KV blocks: 0.9 (gpu_memory_utilization) × 80 GiB − 15 GiB weights −
//     ~4 GiB activations and CUDA graphs = 53 GiB / 128 KiB = 434k tokens
//     = 27,136 blocks of 16 (vLLM logged 51.38 GiB available for this
//     model on an H100: llm-d/llm-d-benchmark
//     config_explorer/empirical-vllm-memory-results.md, 25933486).
//   - MaxBatchedTokens 8192 and MaxNumSeqs 1024: vLLM's OpenAI-server
//     defaults for GPUs with at least 70 GiB (EngineArgs.get_batch_defaults).
//   - LoRA: a rank-16 adapter on every linear layer of an 8B model is about
//     40M parameters, 80 MB; from host memory over PCIe Gen5 (~25 GB/s
//     achieved) plus setup, ~5 ms. LoRALoadDelay = 5 ms, MaxLoRA 4.
//
// a100-8b: one A100 40GB, the same model and server, the slower GPU of a
// mixed fleet.
//   - 1,555 GB/s HBM2 (A100 datasheet): weights in 10.3 ms; one request
//     decodes at about 75 tokens/s, 77% of that ceiling (johnmusgrave.com,
//     vLLM 0.23.0, 1024 in / 128 out): Step = 12.5 ms.
//   - 312 TFLOPS bf16 dense at 55%: 94 µs a token. PrefillToken = 94 µs,
//     Sequence = 150 µs, Attention = 4 µs a thousand pairs (a third of the H100's
//     FLOPs).
//   - 128 KiB at 1,555 GB/s: ContextToken = 84 ns.
//   - 0.9 × 40 GiB − 15 − 3 = 18 GiB / 128 KiB = 147k tokens = 9,216 blocks.
//   - MaxBatchedTokens 2048, MaxNumSeqs 256: vLLM's defaults below 70 GiB
//     (and on every A100, PR #17885).
//   - PCIe Gen4 halves the adapter copy: LoRALoadDelay = 10 ms.
//
// a100-80g-8b: one A100 80GB with the same model, as in SGLang v0.4's
// router benchmark (lmsys.org/blog/2024-12-04-sglang-v0-4, 8 × A100 80GB).
// 2,039 GB/s: weights in 7.9 ms, Step = 9.5 ms at the same 77%;
// ContextToken 64 ns; compute as the 40GB card; 0.9 × 80 GiB − 15 − 4 =
// 53 GiB = 27,136 blocks; 80 GiB takes vLLM's large-GPU batch defaults
// except on A100 (2048 tokens a step).
//
// h100x2-qwen3-32b: Qwen3-32B in bf16 on two H100 80GB with tensor
// parallelism 2, one server of llm-d's "KV-cache wins you can see"
// benchmark (llm-d.ai blog, 2025-09-24; llm-d-kv-cache-manager
// benchmarking/73-capacity/README.md at d070ea60).
//   - KV: 307,328 tokens a server, as published: 19,208 blocks of 16.
//   - Weights 65.5 GB, half on each GPU: 9.8 ms at 3.35 TB/s; the same
//     report measured an 11 ms mean ITL at light load: Step = 10 ms.
//   - Prefill: llm-d measured 15,928 tokens/s for a cold 8,192-token
//     prompt on this setup with vLLM v0.23.0 (llm-d guides
//     recipes/router/calibration, configuration-matrix.md). Attention:
//     4 × 8,192 (query width) × 64 layers = 2.1 MFLOP a pair over two
//     GPUs at 40%: Attention = 2.65 µs a thousand pairs, 89 ms of that prompt; the
//     rest is PrefillToken = 49 µs.
//   - KV per token 64 layers × 8 × 128 × 2 × 2 bytes = 256 KiB, half per
//     GPU: ContextToken = 39 ns. Sequence = 150 µs.
func Preset(name string) (EngineConfig, error) {
	intake := Cost{Request: 3 * time.Millisecond, RequestToken: time.Microsecond}
	with := func(c Cost) Cost { c.Request, c.RequestToken = intake.Request, intake.RequestToken; return c }
	switch name {
	case "", "h100-8b":
		return EngineConfig{
			Cost:      with(Cost{Step: 6400 * time.Microsecond, PrefillToken: 32 * time.Microsecond, Sequence: 230 * time.Microsecond, ContextToken: 39 * time.Nanosecond, Attention: 1300 * time.Nanosecond}),
			BlockSize: 16, NumBlocks: 27136, MaxNumSeqs: 1024, MaxBatchedTokens: 8192,
			MaxLoRA: 4, LoRALoadDelay: 5 * time.Millisecond,
		}, nil
	case "a100-8b":
		return EngineConfig{
			Cost:      with(Cost{Step: 12500 * time.Microsecond, PrefillToken: 94 * time.Microsecond, Sequence: 150 * time.Microsecond, ContextToken: 84 * time.Nanosecond, Attention: 4 * time.Microsecond}),
			BlockSize: 16, NumBlocks: 9216, MaxNumSeqs: 256, MaxBatchedTokens: 2048,
			MaxLoRA: 4, LoRALoadDelay: 10 * time.Millisecond,
		}, nil
	case "a100-80g-8b":
		return EngineConfig{
			Cost:      with(Cost{Step: 9500 * time.Microsecond, PrefillToken: 94 * time.Microsecond, Sequence: 150 * time.Microsecond, ContextToken: 64 * time.Nanosecond, Attention: 4 * time.Microsecond}),
			BlockSize: 16, NumBlocks: 27136, MaxNumSeqs: 1024, MaxBatchedTokens: 2048,
			MaxLoRA: 4, LoRALoadDelay: 10 * time.Millisecond,
		}, nil
	case "h100x2-qwen3-32b":
		return EngineConfig{
			Cost:      with(Cost{Step: 10 * time.Millisecond, PrefillToken: 49 * time.Microsecond, Sequence: 150 * time.Microsecond, ContextToken: 39 * time.Nanosecond, Attention: 2650 * time.Nanosecond}),
			BlockSize: 16, NumBlocks: 19208, MaxNumSeqs: 1024, MaxBatchedTokens: 8192,
			MaxLoRA: 4, LoRALoadDelay: 10 * time.Millisecond,
		}, nil
	}
	return EngineConfig{}, fmt.Errorf("unknown engine preset %q (have %v)", name, presetNames)
}

func (c *EngineConfig) setDefaults() {
	d, _ := Preset("")
	if c.Cost == (Cost{}) {
		c.Cost = d.Cost
	}
	if c.BlockSize <= 0 {
		c.BlockSize = d.BlockSize
	}
	if c.NumBlocks <= 0 {
		c.NumBlocks = d.NumBlocks
	}
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.MaxBatchedTokens <= 0 {
		c.MaxBatchedTokens = d.MaxBatchedTokens
	}
	if c.MaxLoRA <= 0 {
		c.MaxLoRA = d.MaxLoRA
	}
	if c.LoRALoadDelay < 0 {
		c.LoRALoadDelay = 0
	}
}
