package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
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

// BytesPerToken is how many bytes of prompt text the emulated engines count
// as one token, as llmlb assumes for English text.
const BytesPerToken = 4

// Preset names, the default first.
var presetNames = []string{"h100-8b", "a100-8b", "a100-80g-8b", "h100x2-qwen3-32b"}

// PresetNames lists the built-in engine presets, the default first.
func PresetNames() []string { return slices.Clone(presetNames) }

// Preset returns a built-in engine configuration. Each constant is derived
// from the hardware and model below and then held to published
// measurements by TestCalibration (README: the calibration table).
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

// Seq is one request inside an [Engine].
type Seq struct {
	// Hashes are the chained content hashes of the prompt's full blocks
	// ([BlockHashes]); equal leading hashes mean a shared prefix.
	Hashes       []uint64
	PromptTokens int
	MaxTokens    int
	Adapter      string // "" for the base model
	// Tokens are the prompt's token ids ([Tokens]), for the KV events an
	// engine with [EngineConfig.KVEvents] records; nil records none for
	// the sequence's blocks.
	Tokens []uint32

	// CachedTokens is the prompt tokens found in the prefix cache when the
	// request was first scheduled (usage.prompt_tokens_details.cached_tokens).
	CachedTokens int
	// Generated is the output tokens sampled so far.
	Generated int
	// Preemptions counts how often the request lost its KV and recomputed.
	Preemptions int

	state    seqState
	computed int     // tokens whose KV is in the cache
	hashed   int     // leading prompt blocks registered in the prefix cache
	blocks   []int32 // physical KV blocks, in order
	n        int     // tokens scheduled in the step in progress
}

type seqState uint8

const (
	seqNew seqState = iota
	seqWaiting
	seqRunning
	seqDone
	seqAborted
)

// known is the tokens of s that exist: its prompt and what it generated.
func (s *Seq) known() int { return s.PromptTokens + s.Generated }

// Output is what one step produced for one sequence.
type Output struct {
	Seq   *Seq
	First bool // this token is the request's first
	Done  bool // the request generated its last token
}

// Engine is one emulated model server's scheduler and KV-cache: vLLM V1's
// continuous batching with chunked prefill, a paged KV pool with automatic
// prefix caching (full blocks named by chained content hash, kept after
// their request ends and evicted least recently used first when blocks run
// out), preemption by recompute, and LoRA slots. It has no clock: a driver
// calls Step when the previous step's time has passed, in real time
// ([Live]) or virtual time (the cluster benchmark). An Engine is not safe
// for concurrent use.
type Engine struct {
	cfg EngineConfig

	waiting []*Seq
	running []*Seq
	batch   []*Seq // scheduled in the step in progress

	// The block pool. Free blocks (reference count 0) sit in a doubly
	// linked list in eviction order, head first; the sentinel is index
	// NumBlocks. A free block that still has a hash can be reused by a
	// prefix hit until it is evicted.
	ref        []int32
	hash       []uint64
	hasHash    []bool
	prev, next []int32
	nfree      int
	cache      map[uint64]int32

	loaded []string // adapters on the GPU, least recently used first

	kv []KVEvent // recorded since the last TakeKVEvents

	promptTotal, genTotal, queries, hits, preemptions int64
}

// NewEngine returns an idle engine with an empty cache.
func NewEngine(cfg EngineConfig) *Engine {
	cfg.setDefaults()
	n := cfg.NumBlocks
	e := &Engine{
		cfg:     cfg,
		ref:     make([]int32, n),
		hash:    make([]uint64, n),
		hasHash: make([]bool, n),
		prev:    make([]int32, n+1),
		next:    make([]int32, n+1),
		cache:   make(map[uint64]int32),
	}
	s := int32(n)
	e.prev[s], e.next[s] = s, s
	for b := range int32(n) {
		e.pushTail(b)
	}
	return e
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() EngineConfig { return e.cfg }

func (e *Engine) pushTail(b int32) {
	s := int32(e.cfg.NumBlocks)
	p := e.prev[s]
	e.next[p], e.prev[b], e.next[b], e.prev[s] = b, p, s, b
	e.nfree++
}

func (e *Engine) pushHead(b int32) {
	s := int32(e.cfg.NumBlocks)
	n := e.next[s]
	e.prev[n], e.next[b], e.prev[b], e.next[s] = b, n, s, b
	e.nfree++
}

func (e *Engine) unlink(b int32) {
	p, n := e.prev[b], e.next[b]
	e.next[p], e.prev[n] = n, p
	e.nfree--
}

// allocate takes the block at the head of the free list, evicting its
// cached content.
func (e *Engine) allocate() int32 {
	b := e.next[e.cfg.NumBlocks]
	e.unlink(b)
	if e.hasHash[b] {
		delete(e.cache, e.hash[b])
		e.hasHash[b] = false
		if e.cfg.KVEvents {
			e.kv = append(e.kv, KVEvent{Hash: e.hash[b]})
		}
	}
	e.ref[b] = 1
	return b
}

// release drops s's blocks. As vLLM does, the blocks go to the tail of the
// free list last block first, so a request's tail is evicted before its
// head, which other requests are more likely to share; blocks with no
// cached content go to the head, to be reused first.
func (e *Engine) release(s *Seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		b := s.blocks[i]
		e.ref[b]--
		if e.ref[b] > 0 {
			continue
		}
		if e.hasHash[b] {
			e.pushTail(b)
		} else {
			e.pushHead(b)
		}
	}
	s.blocks = s.blocks[:0]
	s.computed, s.hashed = 0, 0
}

// ErrTooLong is returned by [Engine.Add] for a request whose prompt and
// output could never fit in the KV cache, which a real server refuses at
// startup (max_model_len) or on arrival.
var ErrTooLong = errors.New("request does not fit in the KV cache")

// Add queues s. A sequence is added once; one that has no tokens to
// generate or could never fit in the KV cache is refused.
func (e *Engine) Add(s *Seq) error {
	if s.state != seqNew {
		return fmt.Errorf("sim: sequence added twice")
	}
	if s.PromptTokens < 1 || s.MaxTokens < 1 {
		return fmt.Errorf("sim: a request needs a prompt token and an output token")
	}
	if ceilDiv(s.PromptTokens+s.MaxTokens, e.cfg.BlockSize) > e.cfg.NumBlocks {
		return fmt.Errorf("%w: %d tokens, the cache holds %d", ErrTooLong, s.PromptTokens+s.MaxTokens, e.cfg.BlockSize*e.cfg.NumBlocks)
	}
	s.state = seqWaiting
	e.waiting = append(e.waiting, s)
	return nil
}

// Abort drops s wherever it is and frees its blocks; a step in progress
// produces nothing for it.
func (e *Engine) Abort(s *Seq) {
	switch s.state {
	case seqWaiting:
		e.waiting = remove(e.waiting, s)
	case seqRunning:
		e.running = remove(e.running, s)
		e.release(s)
	default:
		return
	}
	s.state = seqAborted
}

func remove(list []*Seq, s *Seq) []*Seq {
	if i := slices.Index(list, s); i >= 0 {
		return slices.Delete(list, i, i+1)
	}
	return list
}

// Busy reports whether the engine has work queued, running or in a step.
func (e *Engine) Busy() bool { return len(e.waiting)+len(e.running)+len(e.batch) > 0 }

// PrefillLeft returns the prompt tokens the engine has still to prefill:
// each waiting request's prompt less what the prefix cache holds of it
// now, and each running request's prompt tokens not computed yet (a step
// in progress counts as not run). What no balancer can read from a
// server; the benchmark's trace reports it at each pick.
func (e *Engine) PrefillLeft() int {
	n := 0
	for _, s := range e.waiting {
		n += max(0, s.PromptTokens-e.Holds(s.Hashes))
	}
	for _, s := range e.running {
		n += max(0, s.PromptTokens-s.computed)
	}
	return n
}

// Step ends the step in progress, appending what it produced to out, and
// schedules the next one, returning how long it takes; 0 means there is
// nothing to run until a sequence is added.
func (e *Engine) Step(out []Output) ([]Output, time.Duration) {
	out = e.finish(out)
	return out, e.schedule()
}

// finish applies the step in progress: a sequence whose known tokens are
// all computed samples one more.
func (e *Engine) finish(out []Output) []Output {
	for _, s := range e.batch {
		if s.state != seqRunning {
			continue // aborted or preempted during the step
		}
		prefill := s.computed < s.PromptTokens
		s.computed += s.n
		if prefill {
			e.promptTotal += int64(min(s.computed, s.PromptTokens) - (s.computed - s.n))
		}
		s.n = 0
		if e.cfg.CacheOnCompute {
			e.register(s, s.computed)
		}
		if s.computed < s.known() {
			continue // a prefill chunk that is not the last
		}
		s.Generated++
		e.genTotal++
		o := Output{Seq: s, First: s.Generated == 1}
		if s.Generated >= s.MaxTokens {
			o.Done = true
			s.state = seqDone
			e.running = remove(e.running, s)
			e.release(s)
		}
		out = append(out, o)
	}
	e.batch = e.batch[:0]
	return out
}

// schedule picks the next batch as vLLM V1's scheduler does: running
// sequences first, in order, each taking the tokens it needs (one to
// decode, a chunk of its prompt to prefill) from the step's budget,
// preempting the newest running sequences when blocks run out; then, if
// nothing was preempted, waiting sequences in arrival order while budget,
// sequence slots, LoRA slots and blocks allow.
func (e *Engine) schedule() time.Duration {
	budget := e.cfg.MaxBatchedTokens
	bs := e.cfg.BlockSize
	var prefill, decodes, context, pairs, loads int
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(s.known()-s.computed, budget)
		need := ceilDiv(s.computed+n, bs) - len(s.blocks)
		for need > e.nfree {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if s.state != seqRunning {
			break
		}
		for range need {
			s.blocks = append(s.blocks, e.allocate())
		}
		loads += e.useAdapter(s.Adapter)
		e.plan(s, n, &prefill, &decodes, &context, &pairs)
		budget -= n
	}
	if !preempted {
		adapters := e.runningAdapters()
		for i := 0; i < len(e.waiting) && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs; {
			s := e.waiting[i]
			if s.Adapter != "" && !slices.Contains(adapters, s.Adapter) && len(adapters) >= e.cfg.MaxLoRA {
				i++ // no LoRA slot: later requests may still fit
				continue
			}
			if !e.admit(s, budget) {
				break
			}
			e.waiting = slices.Delete(e.waiting, i, i+1)
			e.running = append(e.running, s)
			if s.Adapter != "" && !slices.Contains(adapters, s.Adapter) {
				adapters = append(adapters, s.Adapter)
			}
			loads += e.useAdapter(s.Adapter)
			n := min(s.known()-s.computed, budget)
			e.plan(s, n, &prefill, &decodes, &context, &pairs)
			budget -= n
		}
	}
	if len(e.batch) == 0 {
		return 0
	}
	c := e.cfg.Cost
	return c.Step + time.Duration(prefill)*c.PrefillToken + time.Duration(decodes)*c.Sequence +
		time.Duration(context)*c.ContextToken + time.Duration(pairs)*c.Attention/1000 +
		time.Duration(loads)*e.cfg.LoRALoadDelay
}

// plan adds s's n tokens to the step: a decode reads its context's KV; a
// prefill chunk computes attention between each of its tokens and every
// token before it.
func (e *Engine) plan(s *Seq, n int, prefill, decodes, context, pairs *int) {
	if n <= 0 {
		return
	}
	s.n = n
	e.batch = append(e.batch, s)
	if !e.cfg.CacheOnCompute {
		e.register(s, s.computed+n)
	}
	if s.known()-s.computed == 1 {
		*decodes++
		*context += s.computed
	} else {
		*prefill += n
		*pairs += n*s.computed + n*(n+1)/2
	}
}

// register enters s's full prompt blocks up to its first tokens into the
// prefix cache. Unless CacheOnCompute, plan calls it with the tokens the
// step being planned computes, as vLLM V1 does when it allocates them
// (KVCacheManager.allocate_slots caches up to the computed tokens plus the
// tokens scheduled now, vllm/v1/core/kv_cache_manager.py at 003df29), so a
// request admitted later in the same step hits them: each layer writes the
// whole batch's keys and values before its attention reads them.
func (e *Engine) register(s *Seq, tokens int) {
	if e.cfg.NoPrefixCaching {
		return
	}
	full := min(tokens/e.cfg.BlockSize, len(s.Hashes))
	for ; s.hashed < full; s.hashed++ {
		b, h := s.blocks[s.hashed], s.Hashes[s.hashed]
		if _, dup := e.cache[h]; dup || e.hasHash[b] {
			continue
		}
		e.hash[b], e.hasHash[b] = h, true
		e.cache[h] = b
		if e.cfg.KVEvents && len(s.Tokens) >= (s.hashed+1)*e.cfg.BlockSize {
			ev := KVEvent{Stored: true, Hash: h, Adapter: s.Adapter,
				Tokens: s.Tokens[s.hashed*e.cfg.BlockSize : (s.hashed+1)*e.cfg.BlockSize]}
			if s.hashed > 0 {
				ev.Parent, ev.HasParent = s.Hashes[s.hashed-1], true
			}
			e.kv = append(e.kv, ev)
		}
	}
}

// KVEvent is one block entering (Stored) or leaving the prefix cache, as
// vLLM's KV events report it (vllm/distributed/kv_events.py).
type KVEvent struct {
	Stored bool
	Hash   uint64
	// Parent is the hash of the block this one extends, for a stored
	// block past the prompt's first.
	Parent    uint64
	HasParent bool
	// Tokens are a stored block's token ids; they alias the sequence's.
	Tokens  []uint32
	Adapter string
}

// TakeKVEvents returns the events recorded since the last call, in order,
// appended to dst.
func (e *Engine) TakeKVEvents(dst []KVEvent) []KVEvent {
	dst = append(dst, e.kv...)
	clear(e.kv)
	e.kv = e.kv[:0]
	return dst
}

// Tokens returns the token ids the emulated engines give text: each
// BytesPerToken bytes read as a little-endian number; bytes short of a
// whole token at the end count for none, as the engines' token counts
// (len(text)/BytesPerToken) have it. It is the emulation's tokenizer, what
// its /tokenize answers.
func Tokens(text []byte) []uint32 {
	out := make([]uint32, 0, len(text)/BytesPerToken)
	for off := 0; off+BytesPerToken <= len(text); off += BytesPerToken {
		out = append(out, binary.LittleEndian.Uint32(text[off:]))
	}
	return out
}

// admit takes blocks for waiting sequence s: its cached prefix, then new
// blocks for the first chunk of what is left. It reports false, changing
// nothing, when the free blocks do not suffice.
func (e *Engine) admit(s *Seq, budget int) bool {
	bs := e.cfg.BlockSize
	hit := 0
	if !e.cfg.NoPrefixCaching {
		// At least one token is computed, to sample from.
		limit := min(len(s.Hashes), (s.known()-1)/bs)
		for hit < limit {
			if _, ok := e.cache[s.Hashes[hit]]; !ok {
				break
			}
			hit++
		}
	}
	n := min(s.known()-hit*bs, budget)
	fresh := ceilDiv(hit*bs+n, bs) - hit
	reuse := 0 // hit blocks that are free now and stop being free
	for _, h := range s.Hashes[:hit] {
		if e.ref[e.cache[h]] == 0 {
			reuse++
		}
	}
	if fresh+reuse > e.nfree {
		return false
	}
	for _, h := range s.Hashes[:hit] {
		b := e.cache[h]
		if e.ref[b] == 0 {
			e.unlink(b)
		}
		e.ref[b]++
		s.blocks = append(s.blocks, b)
	}
	for range fresh {
		s.blocks = append(s.blocks, e.allocate())
	}
	s.computed, s.hashed = hit*bs, hit
	if s.Preemptions == 0 {
		s.CachedTokens = hit * bs
	}
	e.queries += int64(s.PromptTokens)
	e.hits += int64(min(hit*bs, s.PromptTokens))
	s.state = seqRunning
	return true
}

// preempt sends s back to the head of the queue without its KV; it will
// recompute its prompt and what it generated.
func (e *Engine) preempt(s *Seq) {
	e.running = remove(e.running, s)
	if i := slices.Index(e.batch, s); i >= 0 {
		e.batch = slices.Delete(e.batch, i, i+1)
	}
	e.release(s)
	s.n = 0
	s.state = seqWaiting
	s.Preemptions++
	e.preemptions++
	e.waiting = slices.Insert(e.waiting, 0, s)
}

// useAdapter makes name resident on the GPU and reports 1 if that took a
// load.
func (e *Engine) useAdapter(name string) int {
	if name == "" {
		return 0
	}
	if i := slices.Index(e.loaded, name); i >= 0 {
		e.loaded = append(slices.Delete(e.loaded, i, i+1), name)
		return 0
	}
	if len(e.loaded) >= e.cfg.MaxLoRA {
		// Evict the least recently used adapter the batch does not use; the
		// running batch never holds more than MaxLoRA adapters.
		inUse := e.runningAdapters()
		for i, a := range e.loaded {
			if !slices.Contains(inUse, a) {
				e.loaded = slices.Delete(e.loaded, i, i+1)
				break
			}
		}
	}
	e.loaded = append(e.loaded, name)
	return 1
}

func (e *Engine) runningAdapters() []string {
	var out []string
	for _, s := range e.running {
		if s.Adapter != "" && !slices.Contains(out, s.Adapter) {
			out = append(out, s.Adapter)
		}
	}
	return out
}

// Holds reports how many leading tokens of a prompt with these block
// hashes the prefix cache holds now.
func (e *Engine) Holds(hashes []uint64) int {
	if e.cfg.NoPrefixCaching {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if _, ok := e.cache[h]; !ok {
			break
		}
		n++
	}
	return n * e.cfg.BlockSize
}

// Stats reports the engine's state as its /metrics page shows it. KV use
// counts blocks held by requests, not cached blocks that are free to evict,
// as vLLM's kv_cache_usage_perc does.
func (e *Engine) Stats() Stats {
	st := Stats{
		Waiting:          len(e.waiting),
		Running:          len(e.running),
		KVUsage:          1 - float64(e.nfree)/float64(e.cfg.NumBlocks),
		BlockSize:        e.cfg.BlockSize,
		NumBlocks:        e.cfg.NumBlocks,
		PromptTokens:     e.promptTotal,
		GenerationTokens: e.genTotal,
		PrefixQueries:    e.queries,
		PrefixHits:       e.hits,
		Preemptions:      e.preemptions,
		MaxLoRA:          e.cfg.MaxLoRA,
		RunningAdapters:  e.runningAdapters(),
		CachedBlocks:     len(e.cache),
	}
	for _, s := range e.waiting {
		if s.Adapter != "" && !slices.Contains(st.WaitingAdapters, s.Adapter) {
			st.WaitingAdapters = append(st.WaitingAdapters, s.Adapter)
		}
	}
	return st
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// BlockHashes appends to dst the chained hashes of text's full blocks of
// blockBytes: block i's hash covers seed and every byte up to the block's
// end, so equal hashes mean equal prefixes. The seed separates what must
// not share a cache (adapters, models).
func BlockHashes(dst []uint64, seed uint64, text []byte, blockBytes int) []uint64 {
	var d xxhash.Digest
	var buf [8]byte
	prev := seed
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		_, _ = d.Write(text[off : off+blockBytes])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}
