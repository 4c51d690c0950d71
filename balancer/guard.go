package balancer

import (
	"sync"
	"time"
)

// Work is what one request costs the backend it is sent to, as the picker
// estimated it; the guard adds it to the backend's ledger while the request
// is in flight.
type Work struct {
	// UncachedTokens is the prompt tokens the backend must prefill (the
	// rest it is expected to hold in its prefix cache).
	UncachedTokens int
	// DecodeTokens is the output tokens the request may generate.
	DecodeTokens int
	// Adapter is the LoRA adapter the request runs on, or "".
	Adapter string
	// AheadTokens and QueuedAhead are the prefill tokens and requests the
	// picker saw ahead of this one; the first byte's time teaches the
	// backend's estimate with them.
	AheadTokens float64
	QueuedAhead float64
	// Running is the requests the picker saw running on the backend, and
	// LoadsAdapter that the request's adapter was to be loaded there:
	// terms of the learned first-token model ([FirstTokenModel]) as well.
	Running      float64
	LoadsAdapter bool
	// PrefillSeconds is the estimated prefill time of UncachedTokens on
	// the backend; it extends the backend's drain time ([Ledger]).
	PrefillSeconds float64
	// Estimate is the pick's estimate of the request's first token there
	// ([Candidate.FirstToken]); 0 from a policy that makes none. The first
	// byte's time against it judges the backend's slots ([slotLearner]).
	Estimate float64
	// SlotWait is set when the request's adapter was not known to run on
	// the backend at the pick (every slot held by other adapters, requests
	// already waiting for one, or only our own requests that have not
	// started): its first byte may include a wait for a LoRA slot, which
	// says nothing of the backend's prefill, so it does not teach the
	// learned estimate.
	SlotWait bool
	// Remote is set for the decode leg of a disaggregated request, whose
	// prompt a prefill server took: its first byte waits on another
	// server's prefill and a KV transfer, so it teaches neither the
	// learned estimate nor outlier detection.
	Remote bool
	// PromptBytes is the canonical prompt's length; with the answer's
	// prompt tokens it teaches the backend's bytes per token.
	PromptBytes int
	// Matched says llmlb's own prefix index was asked: MatchedBytes is
	// how much of the prompt it said the backend holds, and NextEvicted
	// that the first block past that is one the index dropped from the
	// backend. The answer's cached_tokens judge them ([Balancer.learnUsage]).
	Matched      bool
	MatchedBytes int
	NextEvicted  bool
}

// Guard accounts one request in the in-flight ledger. The proxy makes one
// Guard per request, attaches it to each backend it tries in turn, and
// releases it when the request ends, whatever the path: success, upstream
// error, retry, client gone, timeout or panic. Release is idempotent, so a
// deferred Release is always safe. A Guard is safe for concurrent use.
type Guard struct {
	onRelease func()      // immutable; may be nil
	bal       *Balancer   // immutable; nil for NewGuard's: no passive health
	cfg       *TTFTConfig // immutable; nil for NewGuard's: first bytes teach no estimate

	mu       sync.Mutex
	backend  *Backend  // guarded by mu; nil when not attached
	work     Work      // guarded by mu
	attached time.Time // guarded by mu
	first    bool      // guarded by mu; the first byte arrived
	stream   bool      // guarded by mu; the first byte is the first token
}

// NewGuard returns a guard attached to no backend.
func NewGuard() *Guard { return new(Guard) }

// NewGuard returns a guard whose releases wake the balancer's admission
// queue: a request that ends frees capacity.
func (b *Balancer) NewGuard() *Guard {
	return &Guard{onRelease: b.adm.notify, bal: b, cfg: &b.cfg.TTFT}
}

// Attach moves the request onto be with the work w: it releases the backend
// the guard held, if any, and counts the request in be's ledger.
func (g *Guard) Attach(be *Backend, w Work, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
	l := be.Ledger
	l.inFlight.Add(1)
	l.total.Add(1)
	l.started.Add(1)
	l.pending.Add(1)
	l.pendingTokens.Add(int64(w.UncachedTokens))
	l.openTokens.Add(int64(w.UncachedTokens + w.DecodeTokens))
	l.openPrompt.Add(int64(w.UncachedTokens))
	l.extendDrain(w.PrefillSeconds, now)
	l.noteSent(w.UncachedTokens)
	l.addAdapter(w.Adapter, 1, 0)
	g.backend, g.work, g.attached, g.first = be, w, now, false
}

// Rework replaces the work of the request on the guard's backend with w,
// the same adapter's, and restarts its clock at now, without counting
// another request: a disaggregated request's decode leg, picked as a
// whole request, prefills nothing there. It does nothing once the first
// byte came, or with no backend attached. The drain time the first work
// extended stays extended.
func (g *Guard) Rework(w Work, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.backend == nil || g.first {
		return
	}
	w.Adapter = g.work.Adapter
	l := g.backend.Ledger
	l.pendingTokens.Add(int64(w.UncachedTokens - g.work.UncachedTokens))
	l.openTokens.Add(int64(w.UncachedTokens + w.DecodeTokens - g.work.UncachedTokens - g.work.DecodeTokens))
	l.openPrompt.Add(int64(w.UncachedTokens - g.work.UncachedTokens))
	g.work, g.attached = w, now
}

// Stream marks the request as a stream, whose first byte is its first
// token: only those times feed outlier detection (a whole non-streaming
// answer's time depends on its length, not on the backend alone).
func (g *Guard) Stream() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stream = true
}

// Backend returns the backend the guard is attached to, or nil.
func (g *Guard) Backend() *Backend {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.backend
}

// FirstByte records that the attached backend's response began at now: the
// request left the backend's queue and prefill. It feeds the backend's
// time-to-first-byte average and learned estimate, and returns the time
// since Attach.
func (g *Guard) FirstByte(now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.backend == nil || g.first {
		return 0
	}
	g.first = true
	l := g.backend.Ledger
	d := now.Sub(g.attached)
	l.ObserveTTFB(d)
	l.prefilled.Add(1)
	l.pending.Add(-1)
	l.pendingTokens.Add(-int64(g.work.UncachedTokens))
	l.addAdapter(g.work.Adapter, 0, 1)
	if g.cfg != nil && !g.work.SlotWait && !g.work.Remote {
		l.est.observe(g.work.AheadTokens+float64(g.work.UncachedTokens), g.work.QueuedAhead, d.Seconds(),
			1/g.cfg.PrefillRate, g.cfg.BaseLatency.Seconds())
		pr := prior(g.cfg)
		l.first.observe(firstByte{Own: float64(g.work.UncachedTokens), Ahead: g.work.AheadTokens, Queued: g.work.QueuedAhead,
			Running: g.work.Running, Load: g.work.LoadsAdapter}, d.Seconds(), &pr)
		l.slots.firstByte(g.work.Running+g.work.QueuedAhead, g.work.Estimate, d.Seconds())
	}
	if g.bal != nil && g.stream && !g.work.Remote {
		g.bal.firstByte(g.backend, g.work.UncachedTokens, d)
	}
	if g.onRelease != nil {
		g.onRelease() // the request left the queue: room for another
	}
	return d
}

// Usage teaches the attached backend what its answer reported of the
// prompt: its tokenizer's rate and whether the prefix index's size matches
// its cache ([Balancer.learnUsage]). Call it before Release.
func (g *Guard) Usage(u Usage) {
	g.mu.Lock()
	be, w := g.backend, g.work
	g.mu.Unlock()
	if be != nil && g.bal != nil {
		g.bal.learnUsage(be, w, u)
	}
}

// Release ends the request's accounting. Calling it again does nothing.
func (g *Guard) Release() {
	g.mu.Lock()
	released := g.releaseLocked()
	g.mu.Unlock()
	if released && g.onRelease != nil {
		g.onRelease()
	}
}

// releaseLocked drops the request from its backend's ledger and reports
// whether it was attached. Caller must hold g.mu.
func (g *Guard) releaseLocked() bool {
	be := g.backend
	if be == nil {
		return false
	}
	l := be.Ledger
	if !g.first {
		l.prefilled.Add(1)
		l.pending.Add(-1)
		l.pendingTokens.Add(-int64(g.work.UncachedTokens))
	}
	l.openTokens.Add(-int64(g.work.UncachedTokens + g.work.DecodeTokens))
	l.openPrompt.Add(-int64(g.work.UncachedTokens))
	started := 0
	if g.first {
		started = -1
	}
	l.addAdapter(g.work.Adapter, -1, started)
	l.finished.Add(1)
	l.inFlight.Add(-1)
	g.backend = nil
	return true
}
