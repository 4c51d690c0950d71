package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

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
	// Refused: the engine refused the request when it came to run it,
	// its KV blocks not fitting ([LLMDSim]); it produced no token.
	Refused bool
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
