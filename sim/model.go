package sim

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Job is one generation request as a [Model] sees it.
type Job struct {
	PromptTokens int
	MaxTokens    int
	Adapter      string // LoRA adapter name, or "" for the base model
	// Prompt is the prompt text as the engine tokenizes it, BytesPerToken
	// bytes a token (0: the package's BytesPerToken); Seed seeds its
	// block hashes (the model or adapter name), so different adapters
	// never share cached blocks.
	Prompt        []byte
	BytesPerToken int
	Seed          uint64
}

// Stats is a model's state as its /metrics page shows it.
type Stats struct {
	Waiting          int
	Running          int
	KVUsage          float64 // 0..1 fraction of the KV cache in use
	BlockSize        int     // tokens per KV block
	NumBlocks        int     // KV blocks in the cache
	PromptTokens     int64   // prompt tokens processed, ever
	GenerationTokens int64   // tokens generated, ever
	PrefixQueries    int64   // prompt tokens looked up in the prefix cache, ever
	PrefixHits       int64   // of those, tokens found cached
	Preemptions      int64   // requests that lost their KV and recomputed, ever
	CachedBlocks     int     // blocks holding reusable prefix content
	RunningAdapters  []string
	WaitingAdapters  []string
	MaxLoRA          int
}

// Model decides when an emulated server's tokens come out. Run blocks while
// the job is queued and generated, calling emit once per output token, in
// order, and returns the prompt tokens the prefix cache served; it returns
// early with ctx's error when ctx ends, or with emit's error. Run and Stats
// may be called concurrently.
type Model interface {
	Run(ctx context.Context, j Job, emit func() error) (cached int, err error)
	Stats() Stats
}

// SteadyConfig shapes a [Steady] model.
type SteadyConfig struct {
	// DecodeTokensPerSecond is each request's output rate. (default 50)
	DecodeTokensPerSecond float64
	// PrefillTokensPerSecond sets the prompt-dependent part of the first
	// token's delay. (default 20000)
	PrefillTokensPerSecond float64
	// FirstTokenLatency is the fixed part of the first token's delay.
	// (default 20ms)
	FirstTokenLatency time.Duration
	// MaxRunning caps requests generating at once; the rest wait. (default 64)
	MaxRunning int
	// BlockSize and NumBlocks size the emulated KV cache in tokens.
	// (default 16 and 8192)
	BlockSize, NumBlocks int
	// MaxLoRA is how many adapters may run at once. (default 4)
	MaxLoRA int
	// Speed divides every delay: 10 runs ten times faster than real time.
	// (default 1)
	Speed float64
}

func (c *SteadyConfig) setDefaults() {
	if c.DecodeTokensPerSecond <= 0 {
		c.DecodeTokensPerSecond = 50
	}
	if c.PrefillTokensPerSecond <= 0 {
		c.PrefillTokensPerSecond = 20000
	}
	if c.FirstTokenLatency <= 0 {
		c.FirstTokenLatency = 20 * time.Millisecond
	}
	if c.MaxRunning <= 0 {
		c.MaxRunning = 64
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	if c.NumBlocks <= 0 {
		c.NumBlocks = 8192
	}
	if c.MaxLoRA <= 0 {
		c.MaxLoRA = 4
	}
	if c.Speed <= 0 {
		c.Speed = 1
	}
}

// Steady is a fixed-delay model for tests that need exact timings: every
// request gets a first token after a fixed delay plus its prompt over a
// prefill rate, then tokens at a steady rate, with at most MaxRunning
// requests at once. KV use counts the tokens of running requests. It has no
// batching and no prefix cache; [Live] runs the engine model that has.
type Steady struct {
	cfg SteadyConfig
	sem chan struct{}

	waiting, running atomic.Int64
	kvTokens         atomic.Int64
	promptTotal      atomic.Int64
	genTotal         atomic.Int64
}

// NewSteady returns a Steady model; zero fields of cfg take their defaults.
func NewSteady(cfg SteadyConfig) *Steady {
	cfg.setDefaults()
	return &Steady{cfg: cfg, sem: make(chan struct{}, cfg.MaxRunning)}
}

var _ Model = (*Steady)(nil)

// Run implements [Model].
func (m *Steady) Run(ctx context.Context, j Job, emit func() error) (int, error) {
	return 0, m.run(ctx, j, emit)
}

func (m *Steady) run(ctx context.Context, j Job, emit func() error) error {
	m.waiting.Add(1)
	select {
	case m.sem <- struct{}{}:
		m.waiting.Add(-1)
	case <-ctx.Done():
		m.waiting.Add(-1)
		return ctx.Err()
	}
	m.running.Add(1)
	held := int64(j.PromptTokens)
	m.kvTokens.Add(held)
	defer func() {
		m.kvTokens.Add(-held)
		m.running.Add(-1)
		<-m.sem
	}()

	prefill := m.cfg.FirstTokenLatency + time.Duration(float64(j.PromptTokens)/m.cfg.PrefillTokensPerSecond*float64(time.Second))
	if transferred(ctx) { // a decode leg: the prompt's KV cache came from its prefill server
		prefill = m.cfg.FirstTokenLatency
	}
	if err := m.sleep(ctx, prefill); err != nil {
		return err
	}
	m.promptTotal.Add(int64(j.PromptTokens))
	step := time.Duration(float64(time.Second) / m.cfg.DecodeTokensPerSecond)
	for i := range j.MaxTokens {
		if i > 0 {
			if err := m.sleep(ctx, step); err != nil {
				return err
			}
		}
		m.genTotal.Add(1)
		m.kvTokens.Add(1)
		held++
		if err := emit(); err != nil {
			return err
		}
	}
	return nil
}

func (m *Steady) sleep(ctx context.Context, d time.Duration) error {
	d = time.Duration(float64(d) / m.cfg.Speed)
	if d <= 0 {
		return ctx.Err()
	}
	return sleepCtx(ctx, d)
}

// Stats implements [Model].
func (m *Steady) Stats() Stats {
	capacity := float64(m.cfg.BlockSize * m.cfg.NumBlocks)
	kv := float64(m.kvTokens.Load()) / capacity
	if kv > 1 {
		kv = 1
	}
	return Stats{
		Waiting:          int(m.waiting.Load()),
		Running:          int(m.running.Load()),
		KVUsage:          kv,
		BlockSize:        m.cfg.BlockSize,
		NumBlocks:        m.cfg.NumBlocks,
		PromptTokens:     m.promptTotal.Load(),
		GenerationTokens: m.genTotal.Load(),
		MaxLoRA:          m.cfg.MaxLoRA,
	}
}

// errUnsupportedEngine is returned for an engine flavour sim cannot render.
var errUnsupportedEngine = errors.New("unsupported engine")

func checkEngine(e string) error {
	switch e {
	case "", "vllm", "sglang", "triton-tensorrt-llm", "trtllm-serve":
		return nil
	}
	return fmt.Errorf("engine %q: %w (supported: vllm, sglang, triton-tensorrt-llm, trtllm-serve)", e, errUnsupportedEngine)
}
