package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"time"
)

// LLMDSimConfig shapes an [LLMDSim]. Each field is the llm-d-inference-sim
// flag named in its comment (pkg/common/config.go at eec055a3).
type LLMDSimConfig struct {
	// PrefillOverhead is the fixed part of a request's prefill
	// (--prefill-overhead); a prefix-cache hit does not remove it. Zero
	// is none. (default 5ms)
	PrefillOverhead time.Duration
	// PrefillTimePerToken is the prefill time of each prompt token not in
	// the prefix cache (--prefill-time-per-token). Zero is none.
	// (default 250µs)
	PrefillTimePerToken time.Duration
	// InterTokenLatency is the time between two output tokens of a
	// request running alone (--inter-token-latency). Zero is none.
	// (default 2ms)
	InterTokenLatency time.Duration
	// TimeFactorUnderLoad multiplies the three durations above with
	// MaxNumSeqs requests running, linearly from 1 at one request
	// (--time-factor-under-load); below 1 is 1. (default 2)
	TimeFactorUnderLoad float64
	// MaxNumSeqs is how many requests run at once, each on a worker of
	// its own; more wait in a FIFO queue (--max-num-seqs). (default 64)
	MaxNumSeqs int
	// MaxWaiting is the queue's length; a request arriving to a full
	// queue is refused (--max-waiting-queue-length, a 429 there).
	// (default 1000)
	MaxWaiting int
	// BlockSize is tokens a KV block (--block-size). (default 16)
	BlockSize int
	// NumBlocks is the KV blocks of the cache (--kv-cache-size).
	// (default 2048)
	NumBlocks int
	// MaxLoRA is how many adapters are loaded at once (--max-loras).
	// (default 4, as vllm-v1's presets and the lora workload assume; the
	// simulator's own default is 1)
	MaxLoRA int
	// KVEvents: record a [KVEvent] whenever a block enters or leaves the
	// cache, for [LLMDSim.TakeKVEvents], as the simulator publishes them
	// with --zmq-endpoint.
	KVEvents bool
}

// DefaultLLMDSimConfig returns the configuration of the llm-d-sim engine
// model (docs/simulator.md): prefill 5 ms plus 250 µs an uncached token,
// 2 ms a decoded token growing to 4 ms at 64 running requests, 2,048 KV
// blocks of 16 tokens.
func DefaultLLMDSimConfig() LLMDSimConfig {
	return LLMDSimConfig{
		PrefillOverhead:     5 * time.Millisecond,
		PrefillTimePerToken: 250 * time.Microsecond,
		InterTokenLatency:   2 * time.Millisecond,
		TimeFactorUnderLoad: 2,
		MaxNumSeqs:          64,
		MaxWaiting:          1000,
		BlockSize:           16,
		NumBlocks:           2048,
		MaxLoRA:             4,
	}
}

func (c *LLMDSimConfig) setDefaults() {
	d := DefaultLLMDSimConfig()
	if c.TimeFactorUnderLoad < 1 {
		c.TimeFactorUnderLoad = 1
	}
	for _, f := range []struct{ v, d *int }{
		{&c.MaxNumSeqs, &d.MaxNumSeqs}, {&c.MaxWaiting, &d.MaxWaiting}, {&c.BlockSize, &d.BlockSize},
		{&c.NumBlocks, &d.NumBlocks}, {&c.MaxLoRA, &d.MaxLoRA},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
}

// ErrQueueFull is returned by [LLMDSim.Add] when every worker is busy and
// the waiting queue is full.
var ErrQueueFull = errors.New("waiting queue is full")

// LLMDSim is an engine model after llm-d's inference simulator
// (github.com/llm-d/llm-d-inference-sim at eec055a3, its per-token latency
// calculator and KV cache), different in form from [Engine]:
//
//   - No batching. Each running request has a worker of its own and its
//     own timers (pkg/llm-d-inference-sim/simulator.go, worker.go): its
//     first token comes PrefillOverhead×f + (prompt − cached
//     tokens)×PrefillTimePerToken×f after it starts, each later token
//     InterTokenLatency×f after the one before, where f = 1 +
//     (TimeFactorUnderLoad − 1)×(running − 1)/(MaxNumSeqs − 1) is taken
//     from the requests running (prefilling or decoding, itself included)
//     when the wait begins (latencies.go: getCurrLoadFactor,
//     GetTimeToFirstToken, GetInterTokenLatency; context.go:
//     simulateTTFT, simulateInterTokenLatency). A request's prefill does
//     not slow the others' decodes beyond its count in f.
//   - At most MaxNumSeqs run; later requests wait in a FIFO queue of
//     MaxWaiting, taken first for the base model or a loaded adapter, then
//     for an adapter that can be loaded (simulator.go: dequeue; lora.go:
//     loadLora, which unloads an idle adapter when MaxLoRA are loaded).
//   - The KV cache holds the prompt's full blocks only, named by chained
//     hash; output tokens take none (pkg/kv-cache/kv_cache.go:
//     OnRequestStart, with llm-d-router's kvblock, which drops a partial
//     last block). When a request starts, every one of its blocks found in
//     the cache, in use or not, counts as cached, whether or not the
//     blocks before it are (block_cache.go: startRequest). If the blocks
//     in use, its new blocks and its cached blocks not in use exceed
//     NumBlocks, the request is refused (a 500 there): it is neither
//     queued nor preempted, and no request is ever preempted. Otherwise
//     each new block takes a free slot or evicts the least recently
//     released block not in use, those of unloaded adapters first
//     (pickBlockToEvict). A request holds its blocks to its last token.
//   - KV use on /metrics is the blocks in use over NumBlocks.
//
// Where the simulator leaves an order to Go's map iteration (blocks
// released together, which idle adapter to unload), LLMDSim evicts a
// request's blocks last first and unloads the adapter loaded longest ago.
// It draws no jitter: the simulator's standard deviations are zero here.
//
// LLMDSim runs in the virtual time of the clock it is given: a driver calls
// Step when the time Step last returned has passed, and also after every
// Add, since a request starts the moment it arrives rather than at a step
// boundary. An LLMDSim is not safe for concurrent use.
type LLMDSim struct {
	cfg LLMDSimConfig
	now func() time.Duration

	waiting []*Seq
	running int
	timers  llmdTimers // one a running request: its next token
	pushes  uint64

	blocks   map[uint64]*llmdBlock
	used     int        // blocks with a reference
	idle     int        // blocks with none, still cached
	unused   []llmdList // idle blocks by adapter index, least recently released first
	adapters []string   // adapter index → name; 0 is the base model
	released uint64     // release stamps
	spare    []*llmdBlock

	loaded []llmdAdapter // loaded adapters, loaded longest ago first

	kv []KVEvent

	promptTotal, genTotal, queries, hits int64
}

type llmdAdapter struct {
	name    string
	running int
}

// llmdBlock is one cached prompt block.
type llmdBlock struct {
	hash       uint64
	ref        int
	adapter    int
	stamp      uint64 // release order, while idle
	prev, next *llmdBlock
}

// llmdList is a doubly linked list of idle blocks, oldest first.
type llmdList struct{ head, tail *llmdBlock }

func (l *llmdList) push(b *llmdBlock) {
	b.prev, b.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = b
	} else {
		l.head = b
	}
	l.tail = b
}

func (l *llmdList) remove(b *llmdBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		l.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

// llmdTimer is a running request's next token and when it comes.
type llmdTimer struct {
	at    time.Duration
	order uint64 // push order, to break ties deterministically
	seq   *Seq
}

type llmdTimers []llmdTimer

func (h llmdTimers) Len() int { return len(h) }
func (h llmdTimers) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].order < h[j].order
}
func (h llmdTimers) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *llmdTimers) Push(x any)   { *h = append(*h, x.(llmdTimer)) }
func (h *llmdTimers) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// NewLLMDSim returns an idle LLMDSim with an empty cache, reading the
// time from now. Zero counts of cfg take DefaultLLMDSimConfig's; its
// durations are taken as they are.
func NewLLMDSim(cfg LLMDSimConfig, now func() time.Duration) *LLMDSim {
	cfg.setDefaults()
	return &LLMDSim{cfg: cfg, now: now, blocks: make(map[uint64]*llmdBlock), unused: make([]llmdList, 1), adapters: []string{""}}
}

// Config returns the model's configuration with defaults filled in.
func (m *LLMDSim) Config() LLMDSimConfig { return m.cfg }

// Add queues s; the next Step starts it if a worker is free. A sequence is
// added once; one with no tokens to generate, or arriving with every
// worker busy and the queue full ([ErrQueueFull]), is refused. One whose
// blocks do not fit is refused when it comes to run: Step reports it
// [Output.Refused].
func (m *LLMDSim) Add(s *Seq) error {
	if s.state != seqNew {
		return fmt.Errorf("sim: sequence added twice")
	}
	if s.PromptTokens < 1 || s.MaxTokens < 1 {
		return fmt.Errorf("sim: a request needs a prompt token and an output token")
	}
	if m.running >= m.cfg.MaxNumSeqs && len(m.waiting) >= m.cfg.MaxWaiting {
		return fmt.Errorf("%w: %d waiting", ErrQueueFull, len(m.waiting))
	}
	s.state = seqWaiting
	m.waiting = append(m.waiting, s)
	return nil
}

// Step emits every token due by now, appending to out, and starts waiting
// requests on the workers free; it returns the time until the next token
// is due, 0 when nothing runs.
func (m *LLMDSim) Step(out []Output) ([]Output, time.Duration) {
	now := m.now()
	for {
		out = m.start(out, now)
		if len(m.timers) == 0 || m.timers[0].at > now {
			break
		}
		t := heap.Pop(&m.timers).(llmdTimer)
		s := t.seq
		s.Generated++
		m.genTotal++
		o := Output{Seq: s, First: s.Generated == 1}
		if o.First {
			m.promptTotal += int64(s.PromptTokens)
		}
		if s.Generated >= s.MaxTokens {
			o.Done = true
			m.finish(s)
		} else {
			m.schedule(s, t.at+scaleDuration(m.cfg.InterTokenLatency, m.factor()))
		}
		out = append(out, o)
	}
	if len(m.timers) == 0 {
		return out, 0
	}
	return out, m.timers[0].at - now
}

// factor is the load factor with the requests running now.
func (m *LLMDSim) factor() float64 {
	if m.cfg.MaxNumSeqs <= 1 {
		return 1
	}
	return 1 + (m.cfg.TimeFactorUnderLoad-1)*float64(m.running-1)/float64(m.cfg.MaxNumSeqs-1)
}

// scaleDuration multiplies d by f as the simulator does, truncating.
func scaleDuration(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

func (m *LLMDSim) schedule(s *Seq, at time.Duration) {
	m.pushes++
	heap.Push(&m.timers, llmdTimer{at: at, order: m.pushes, seq: s})
}

// start moves waiting requests onto free workers: each takes its blocks
// and waits out its prefill, or is refused when they do not fit.
func (m *LLMDSim) start(out []Output, now time.Duration) []Output {
	for m.running < m.cfg.MaxNumSeqs {
		i := m.next()
		if i < 0 {
			break
		}
		s := m.waiting[i]
		m.waiting = slices.Delete(m.waiting, i, i+1)
		m.running++
		if !m.admit(s) {
			m.running--
			m.unuseAdapter(s.Adapter)
			s.state = seqAborted
			out = append(out, Output{Seq: s, Refused: true})
			continue
		}
		s.state = seqRunning
		f := m.factor()
		uncached := s.PromptTokens - s.CachedTokens
		ttft := scaleDuration(m.cfg.PrefillOverhead, f) + time.Duration(uncached)*scaleDuration(m.cfg.PrefillTimePerToken, f)
		m.schedule(s, now+ttft)
	}
	return out
}

// next returns the index of the waiting request to run next and takes its
// adapter's slot, or -1: the first for the base model or a loaded adapter,
// else the first whose adapter can be loaded.
func (m *LLMDSim) next() int {
	for i, s := range m.waiting {
		if a := m.loadedAt(s.Adapter); s.Adapter == "" || a >= 0 {
			if a >= 0 {
				m.loaded[a].running++
			}
			return i
		}
	}
	for i, s := range m.waiting {
		if m.load(s.Adapter) {
			return i
		}
	}
	return -1
}

func (m *LLMDSim) loadedAt(name string) int {
	return slices.IndexFunc(m.loaded, func(a llmdAdapter) bool { return a.name == name })
}

// load loads adapter name with one request on it, unloading an idle
// adapter if MaxLoRA are loaded; it reports false when none is idle.
func (m *LLMDSim) load(name string) bool {
	if len(m.loaded) >= m.cfg.MaxLoRA {
		i := slices.IndexFunc(m.loaded, func(a llmdAdapter) bool { return a.running == 0 })
		if i < 0 {
			return false
		}
		m.loaded = slices.Delete(m.loaded, i, i+1)
	}
	m.loaded = append(m.loaded, llmdAdapter{name: name, running: 1})
	return true
}

func (m *LLMDSim) unuseAdapter(name string) {
	if i := m.loadedAt(name); i >= 0 {
		m.loaded[i].running--
	}
}

// adapterIndex interns an adapter name.
func (m *LLMDSim) adapterIndex(name string) int {
	if i := slices.Index(m.adapters, name); i >= 0 {
		return i
	}
	m.adapters = append(m.adapters, name)
	m.unused = append(m.unused, llmdList{})
	return len(m.adapters) - 1
}

// admit takes s's blocks as the simulator's startRequest does, reporting
// false, changing nothing, when they do not fit.
func (m *LLMDSim) admit(s *Seq) bool {
	fresh, revive := 0, 0
	for _, h := range s.Hashes {
		switch b := m.blocks[h]; {
		case b == nil:
			fresh++
		case b.ref == 0:
			revive++
		}
	}
	if m.used+fresh+revive > m.cfg.NumBlocks {
		return false
	}
	cached := 0
	for _, h := range s.Hashes {
		if b := m.blocks[h]; b != nil {
			if b.ref == 0 {
				m.unused[b.adapter].remove(b)
				m.idle--
				m.used++
			}
			b.ref++
			cached++
		}
	}
	adapter := m.adapterIndex(s.Adapter)
	for i, h := range s.Hashes {
		if _, ok := m.blocks[h]; ok {
			continue // taken above
		}
		if m.used+m.idle == m.cfg.NumBlocks {
			m.evict()
		}
		m.insert(h, adapter, 1)
		if m.cfg.KVEvents && len(s.Tokens) >= (i+1)*m.cfg.BlockSize {
			ev := KVEvent{Stored: true, Hash: h, Adapter: s.Adapter, Tokens: s.Tokens[i*m.cfg.BlockSize : (i+1)*m.cfg.BlockSize]}
			if i > 0 {
				ev.Parent, ev.HasParent = s.Hashes[i-1], true
			}
			m.kv = append(m.kv, ev)
		}
	}
	s.CachedTokens = cached * m.cfg.BlockSize
	m.queries += int64(s.PromptTokens)
	m.hits += int64(s.CachedTokens)
	return true
}

// insert caches a new block with ref references; a block with none goes
// to the tail of its adapter's idle list.
func (m *LLMDSim) insert(h uint64, adapter, ref int) {
	var b *llmdBlock
	if n := len(m.spare); n > 0 {
		b, m.spare = m.spare[n-1], m.spare[:n-1]
	} else {
		b = new(llmdBlock)
	}
	*b = llmdBlock{hash: h, ref: ref, adapter: adapter}
	m.blocks[h] = b
	if ref > 0 {
		m.used++
		return
	}
	m.released++
	b.stamp = m.released
	m.unused[adapter].push(b)
	m.idle++
}

// evict drops the idle block released longest ago, of an unloaded
// adapter if there is one.
func (m *LLMDSim) evict() {
	var victim *llmdBlock
	unloaded := false
	for i := range m.unused {
		b := m.unused[i].head
		if b == nil {
			continue
		}
		u := i > 0 && m.loadedAt(m.adapters[i]) < 0
		if victim == nil || u && !unloaded || u == unloaded && b.stamp < victim.stamp {
			victim, unloaded = b, u
		}
	}
	m.unused[victim.adapter].remove(victim)
	m.idle--
	delete(m.blocks, victim.hash)
	if m.cfg.KVEvents {
		m.kv = append(m.kv, KVEvent{Hash: victim.hash})
	}
	m.spare = append(m.spare, victim)
}

// finish ends s: its blocks are released, last first, and its worker and
// adapter slot freed.
func (m *LLMDSim) finish(s *Seq) {
	for i := len(s.Hashes) - 1; i >= 0; i-- {
		b := m.blocks[s.Hashes[i]]
		b.ref--
		if b.ref > 0 {
			continue
		}
		m.used--
		m.released++
		b.stamp = m.released
		m.unused[b.adapter].push(b)
		m.idle++
	}
	s.state = seqDone
	m.running--
	m.unuseAdapter(s.Adapter)
}

// Holds reports how many tokens of a prompt with these block hashes the
// cache would count as cached now: every block found, as the simulator
// counts them, whether or not the blocks before it are.
func (m *LLMDSim) Holds(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := m.blocks[h]; ok {
			n++
		}
	}
	return n * m.cfg.BlockSize
}

// PrefillLeft returns the prompt tokens still to prefill: each waiting
// request's less what the cache holds of it now, and each prefilling
// request's uncached tokens.
func (m *LLMDSim) PrefillLeft() int {
	n := 0
	for _, s := range m.waiting {
		n += max(0, s.PromptTokens-m.Holds(s.Hashes))
	}
	for _, t := range m.timers {
		if t.seq.Generated == 0 {
			n += t.seq.PromptTokens - t.seq.CachedTokens
		}
	}
	return n
}

// Receive enters the blocks a KV transfer brought as idle cached blocks,
// so that the request they came for finds them, as [Engine.Receive] does;
// it evicts older idle blocks for them but never the transfer's own.
func (m *LLMDSim) Receive(hashes []uint64) {
	room := m.cfg.NumBlocks - m.used
	for _, h := range hashes {
		if _, ok := m.blocks[h]; ok {
			continue
		}
		if room == 0 {
			return
		}
		room--
		if m.used+m.idle == m.cfg.NumBlocks {
			m.evict()
		}
		m.insert(h, 0, 0)
	}
}

// TakeKVEvents returns the events recorded since the last call, in order,
// appended to dst.
func (m *LLMDSim) TakeKVEvents(dst []KVEvent) []KVEvent {
	dst = append(dst, m.kv...)
	clear(m.kv)
	m.kv = m.kv[:0]
	return dst
}

// Stats reports the model's state as its /metrics page shows it.
func (m *LLMDSim) Stats() Stats {
	st := Stats{
		Waiting:          len(m.waiting),
		Running:          m.running,
		KVUsage:          float64(m.used) / float64(m.cfg.NumBlocks),
		BlockSize:        m.cfg.BlockSize,
		NumBlocks:        m.cfg.NumBlocks,
		PromptTokens:     m.promptTotal,
		GenerationTokens: m.genTotal,
		PrefixQueries:    m.queries,
		PrefixHits:       m.hits,
		CachedBlocks:     len(m.blocks),
		MaxLoRA:          m.cfg.MaxLoRA,
	}
	for _, a := range m.loaded {
		if a.running > 0 {
			st.RunningAdapters = append(st.RunningAdapters, a.name)
		}
	}
	for _, s := range m.waiting {
		if s.Adapter != "" && !slices.Contains(st.WaitingAdapters, s.Adapter) {
			st.WaitingAdapters = append(st.WaitingAdapters, s.Adapter)
		}
	}
	return st
}
