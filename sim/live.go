package sim

import (
	"context"
	"sync"
	"time"
)

// Live runs an [Engine] in real time, optionally sped up, as the [Model]
// behind an emulated HTTP server: a goroutine steps the engine while it has
// work, sleeping each step's modelled time divided by the speed, and wakes
// the requests whose tokens came out.
type Live struct {
	speed float64

	mu      sync.Mutex
	eng     *Engine                // guarded by mu
	subs    map[*Seq]chan struct{} // guarded by mu; each request's wake-up
	looping bool                   // guarded by mu; the step goroutine runs
	kv      *KVPublisher           // guarded by mu; nil publishes no events
}

// PublishKV makes the engine record its KV events and p publish them, one
// batch per step with events, as vLLM does with --kv-events-config.
func (l *Live) PublishKV(p *KVPublisher) {
	l.mu.Lock()
	l.kv = p
	l.eng.cfg.KVEvents = p != nil
	l.mu.Unlock()
}

// NewLive returns a Live engine; speed 10 runs ten times faster than real
// time (at most 0 means 1).
func NewLive(cfg EngineConfig, speed float64) *Live {
	if speed <= 0 {
		speed = 1
	}
	eng := NewEngine(cfg)
	return &Live{speed: speed, eng: eng, subs: make(map[*Seq]chan struct{})}
}

var _ Model = (*Live)(nil)

// Run implements [Model].
func (l *Live) Run(ctx context.Context, j Job, emit func() error) (int, error) {
	bpt := j.BytesPerToken
	if bpt <= 0 {
		bpt = BytesPerToken
	}
	hashes := BlockHashes(nil, j.Seed, j.Prompt, l.eng.cfg.BlockSize*bpt)
	s := &Seq{Hashes: hashes, PromptTokens: j.PromptTokens, MaxTokens: j.MaxTokens, Adapter: j.Adapter}
	l.mu.Lock()
	if l.kv != nil {
		s.Tokens = Tokens(j.Prompt)
	}
	l.mu.Unlock()
	// The server's own work on the request comes before its scheduler
	// sees it.
	if d := time.Duration(float64(l.eng.cfg.Cost.Intake(j.PromptTokens)) / l.speed); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		}
	}
	wake := make(chan struct{}, 1)
	l.mu.Lock()
	if transferred(ctx) { // a decode leg: the prompt's KV cache arrived from its prefill server
		l.eng.Receive(hashes)
	}
	if err := l.eng.Add(s); err != nil {
		l.mu.Unlock()
		return 0, err
	}
	l.subs[s] = wake
	if !l.looping {
		l.looping = true
		go l.loop()
	}
	l.mu.Unlock()

	abort := func() {
		l.mu.Lock()
		l.eng.Abort(s)
		delete(l.subs, s)
		l.mu.Unlock()
	}
	sent := 0
	for {
		select {
		case <-wake:
		case <-ctx.Done():
			abort()
			return 0, ctx.Err()
		}
		l.mu.Lock()
		generated, done, cached := s.Generated, s.state == seqDone, s.CachedTokens
		l.mu.Unlock()
		for ; sent < generated; sent++ {
			if err := emit(); err != nil {
				abort()
				return cached, err
			}
		}
		if done {
			return cached, nil
		}
	}
}

// loop steps the engine until it has nothing to do. Each step's end is
// scheduled from the previous one's, so timer lateness does not add up.
func (l *Live) loop() {
	var out []Output
	var events []KVEvent
	next := time.Now()
	for {
		l.mu.Lock()
		var d time.Duration
		out, d = l.eng.Step(out[:0])
		kv := l.kv
		events = l.eng.TakeKVEvents(events[:0])
		for _, o := range out {
			if ch := l.subs[o.Seq]; ch != nil {
				select {
				case ch <- struct{}{}:
				default:
				}
				if o.Done {
					delete(l.subs, o.Seq)
				}
			}
		}
		if d == 0 {
			l.looping = false
			l.mu.Unlock()
			publishKV(kv, events)
			return
		}
		l.mu.Unlock()
		publishKV(kv, events)
		now := time.Now()
		if next.Before(now.Add(-time.Second)) {
			next = now // after a long stall, do not race to catch up
		}
		next = next.Add(time.Duration(float64(d) / l.speed))
		time.Sleep(time.Until(next))
	}
}

// Stats implements [Model].
func (l *Live) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng.Stats()
}

// Capacity is the most tokens one request may hold: the whole KV cache.
func (l *Live) Capacity() int {
	return l.eng.cfg.BlockSize * l.eng.cfg.NumBlocks // cfg is immutable
}

// publishKV sends one step's events; a publisher that fails (its sockets
// closed at shutdown) loses them, as a subscriber then finds by the
// numbering.
func publishKV(p *KVPublisher, events []KVEvent) {
	if p != nil {
		_ = p.Publish(events)
	}
}
