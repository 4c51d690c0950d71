package balancer

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Ledger holds one backend's counters that survive snapshot rebuilds. All
// methods are safe for concurrent use; the zero value is ready.
type Ledger struct {
	inFlight atomic.Int64 // requests sent and not yet finished
	total    atomic.Int64 // requests sent, ever
	failures atomic.Int64 // requests that failed at the transport or with 5xx
	streak   atomic.Int64 // consecutive failures since the last success
	ttftBits atomic.Uint64

	// Monotonic counts the scrape-time mark is taken of, so that what was
	// sent since the last scrape can be added to the scraped values.
	started   atomic.Int64 // requests attached
	prefilled atomic.Int64 // requests that left the queue: first byte, or ended without one
	finished  atomic.Int64 // requests released
	// Levels of the requests in flight.
	pending       atomic.Int64 // requests without a first byte yet
	pendingTokens atomic.Int64 // their uncached prompt tokens
	openTokens    atomic.Int64 // KV tokens of requests in flight: uncached prompt plus decode
	openPrompt    atomic.Int64 // uncached prompt tokens of requests in flight
	// drainAt is when the prefill of our pending requests should be done
	// (Unix nanoseconds; 0 never set): each attach extends it by the
	// request's estimated prefill time ([Work.PrefillSeconds]).
	drainAt atomic.Int64
	// placed is the new prompts a balancer alone placed here
	// ([TTFTPicker.place]): their tokens, decayed by [placedDecay] for
	// every new prompt placed anywhere since, as of the placement numbered
	// placedAt on the picker's count. Read and written without a lock:
	// picks that race lose a placement's weight.
	placed   atomic.Uint64 // float64 bits
	placedAt atomic.Uint64
	// sentSize is the mean uncached prompt tokens of the requests sent
	// here, each new one weighted sentSizeWeight (float64 bits; 0 before
	// the first): the size a queued request this balancer did not send
	// is guessed at ([Candidate.AheadTokens]).
	sentSize atomic.Uint64
	// eventsAt is the step time (Unix nanoseconds) of the last prefills
	// the backend's KV events showed that a pick read, and
	// eventsPrefilled the prefilled count when it first read them: our
	// requests that left the queue since were among those prefills.
	eventsAt        atomic.Int64
	eventsPrefilled atomic.Int64

	slots slotLearner // how many requests the backend runs at once

	// peers is what the replicas this balancer shares a ledger with
	// ([Ledger.SetPeers]) have in flight on the backend; nil: none.
	peers atomic.Pointer[Load]

	est   estimator         // the cost's first-token model, which routes
	first firstTokenLearner // the learned one, which deadlines are judged by
	tok   tokenRate         // the backend's bytes per token and the index's fit to its cache

	health health // passive health: ejection and the outlier averages

	amu      sync.Mutex
	adapters map[string]adapterLoad // guarded by amu; LoRA adapters in flight
}

// adapterLoad is one LoRA adapter's requests in flight on a backend: those
// sent, and of them those started, whose first byte came, so that the
// server runs the adapter now; the others may still wait for a slot.
type adapterLoad struct{ sent, started int }

// mark is a ledger's monotonic counts at one moment, and the levels its
// peers had then.
type mark struct {
	started, prefilled, finished, openTokens int64
	peers                                    Load
}

func (l *Ledger) mark() mark {
	return mark{started: l.started.Load(), prefilled: l.prefilled.Load(), finished: l.finished.Load(), openTokens: l.openTokens.Load(), peers: l.Peers()}
}

// Load is the work one balancer, or several summed, has in flight on a
// backend: what replicas publish to each other so that each pick counts
// the work the others sent.
type Load struct {
	InFlight   int64 // requests sent and not finished
	OpenTokens int64 // their KV tokens: uncached prompt plus decode
}

// Add returns the sum of l and o.
func (l Load) Add(o Load) Load {
	return Load{InFlight: l.InFlight + o.InFlight, OpenTokens: l.OpenTokens + o.OpenTokens}
}

// Own returns this balancer's own load on the backend, the part it
// publishes to its peers.
func (l *Ledger) Own() Load {
	return Load{InFlight: l.inFlight.Load(), OpenTokens: l.openTokens.Load()}
}

// SetPeers replaces what the other replicas have in flight on the
// backend, summed; the zero Load when there are none or they are not
// heard from. A pick counts it as running work and KV use (whole where
// the backend reports neither, else as its change since the last scrape,
// which counts what the peers had sent before it), never as queued
// prefill ahead of the request, which this balancer's drain estimate
// cannot age (docs/design/cluster.md#load-in-flight-counted-from-the-scrape).
func (l *Ledger) SetPeers(p Load) {
	if p == (Load{}) {
		if l.peers.Load() != nil {
			l.peers.Store(nil)
		}
		return
	}
	l.peers.Store(&p)
}

// Peers returns the load [Ledger.SetPeers] last set.
func (l *Ledger) Peers() Load {
	if p := l.peers.Load(); p != nil {
		return *p
	}
	return Load{}
}

// InFlight returns the number of requests sent to the backend and not yet
// finished.
func (l *Ledger) InFlight() int64 { return l.inFlight.Load() }

// Total returns the number of requests ever sent to the backend.
func (l *Ledger) Total() int64 { return l.total.Load() }

// Failures returns the number of requests to the backend that failed.
func (l *Ledger) Failures() int64 { return l.failures.Load() }

// Pending returns the requests sent that have not produced a first byte,
// and their uncached prompt tokens.
func (l *Ledger) Pending() (requests, tokens int64) {
	return l.pending.Load(), l.pendingTokens.Load()
}

// OpenPrompt returns the uncached prompt tokens of the requests in flight:
// the prompt blocks each brought the backend that it did not hold.
func (l *Ledger) OpenPrompt() int64 { return l.openPrompt.Load() }

// aheadTokens estimates how many of the pending prefill tokens of our
// requests (requests of them) are still to be done at now. The server
// prefills one request at a time for the most part, so at most one of
// them, at the mean size, is part done: what the drain time says is left
// at the backend's learned rate, but no less than the others whole, and
// all of it for a backend with no learned rate or past its drain time (a
// server slower than learned). Counting the request in progress whole
// makes a holder that has just taken a request look as slow as prefilling
// the prompt elsewhere; discounting more than one makes an overloaded
// server look emptier than it is. See docs/design/ttft.md#ahead-tokens.
func (l *Ledger) aheadTokens(requests, tokens int64, now time.Time) float64 {
	if requests <= 0 || tokens <= 0 {
		return 0
	}
	all := float64(tokens)
	at := l.drainAt.Load()
	if at == 0 {
		return all
	}
	est := l.est.load()
	if !est.learned() {
		return all
	}
	left := time.Duration(at - now.UnixNano()).Seconds()
	if left <= 0 {
		return all
	}
	rest := all - all/float64(requests) // the others, not started
	return min(all, max(rest, left*est.Rate))
}

// sentSizeWeight is the weight of each new request in [Ledger.sentSize]:
// the mean follows the last ten or so requests sent to the backend.
const sentSizeWeight = 0.1

// noteSent adds a request of uncached prompt tokens to the mean size of
// the requests sent here.
func (l *Ledger) noteSent(tokens int) {
	v := float64(max(tokens, 1))
	for {
		old := l.sentSize.Load()
		next := v
		if old != 0 {
			m := math.Float64frombits(old)
			next = m + sentSizeWeight*(v-m)
		}
		if l.sentSize.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// queuedSize is the size a request queued on the backend that this
// balancer did not send is guessed at: the mean of our own pending
// requests when there are any (they share its queue now), else the
// recent mean of what we sent there, else def. Another balancer's
// requests to a server are guessed to look like ours to it; the prompt
// being placed (def) is the guess only before we have sent it any. See
// docs/design/ttft.md#queued-size.
func (l *Ledger) queuedSize(pending, pendingTok int64, def int) float64 {
	if pending > 0 {
		return float64(pendingTok) / float64(pending)
	}
	if b := l.sentSize.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return float64(def)
}

// extendDrain adds a request's prefill time to the drain time.
func (l *Ledger) extendDrain(d float64, now time.Time) {
	if d <= 0 {
		return
	}
	for {
		old := l.drainAt.Load()
		next := max(old, now.UnixNano()) + int64(d*1e9)
		if l.drainAt.CompareAndSwap(old, next) {
			return
		}
	}
}

// AdapterInFlight reports whether a request for the LoRA adapter is in
// flight on the backend: the server has it loaded, whatever its last
// scrape said.
func (l *Ledger) AdapterInFlight(name string) bool {
	l.amu.Lock()
	defer l.amu.Unlock()
	return l.adapters[name].sent > 0
}

// adapterLoad returns the adapter's requests in flight on the backend.
func (l *Ledger) adapterLoad(name string) adapterLoad {
	l.amu.Lock()
	defer l.amu.Unlock()
	return l.adapters[name]
}

// adaptersInFlight appends the adapters in flight to dst.
func (l *Ledger) adaptersInFlight(dst []string) []string {
	l.amu.Lock()
	defer l.amu.Unlock()
	for a, n := range l.adapters {
		if n.sent > 0 {
			dst = append(dst, a)
		}
	}
	return dst
}

// addAdapter adds sent and started to the adapter's requests in flight.
func (l *Ledger) addAdapter(name string, sent, started int) {
	if name == "" {
		return
	}
	l.amu.Lock()
	defer l.amu.Unlock()
	if l.adapters == nil {
		l.adapters = make(map[string]adapterLoad)
	}
	a := l.adapters[name]
	a.sent += sent
	a.started += started
	if a.sent <= 0 {
		delete(l.adapters, name)
		return
	}
	l.adapters[name] = a
}

// TTFB returns the backend's smoothed time to first byte, or 0 before the
// first sample.
func (l *Ledger) TTFB() time.Duration {
	return time.Duration(math.Float64frombits(l.ttftBits.Load()) * float64(time.Second))
}

// ttfbAlpha weighs a new time-to-first-byte sample in the moving average:
// about the last ten requests dominate.
const ttfbAlpha = 0.2

// ObserveTTFB folds one time-to-first-byte sample into the moving average.
func (l *Ledger) ObserveTTFB(d time.Duration) {
	s := d.Seconds()
	for {
		old := l.ttftBits.Load()
		prev := math.Float64frombits(old)
		next := s
		if old != 0 {
			next = prev + ttfbAlpha*(s-prev)
		}
		if l.ttftBits.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// ObserveFailure counts a failed request and returns the failures in a row
// it makes. [Balancer.Failed] calls it and decides on ejection.
func (l *Ledger) ObserveFailure() int64 {
	l.failures.Add(1)
	return l.streak.Add(1)
}

// ObserveSuccess records a request that did not fail, ending a failure streak. It
// runs on every request, so it writes only when there is a streak to end:
// a load keeps the counter's cache line shared between cores.
func (l *Ledger) ObserveSuccess() {
	if l.streak.Load() != 0 {
		l.streak.Store(0)
	}
}

// FailureStreak returns the number of failures since the last success, which
// passive health checking ejects on.
func (l *Ledger) FailureStreak() int64 { return l.streak.Load() }

// Estimate is a backend's learned first-token model: TTFT = Base +
// work/Rate + queued×QueueWait, where work is the prefill tokens ahead of
// and in the request.
type Estimate struct {
	Base      float64 `json:"base_seconds"`
	Rate      float64 `json:"prefill_tokens_per_second"`
	QueueWait float64 `json:"queue_wait_seconds"`
	Samples   int64   `json:"samples"`
}

// learned reports whether e has enough samples and a prefill rate to
// stand for its backend; until then the fleet's or the config's is used.
func (e Estimate) learned() bool { return e.Samples >= minSamples && e.Rate > 0 }

// Estimate returns the backend's learned first-token model; zero fields
// are not learned yet.
func (l *Ledger) Estimate() Estimate { return l.est.load() }

// estimator learns Base and 1/Rate by exponentially weighted least squares
// over (work, TTFT) samples taken with no queue ahead, and QueueWait as the
// smoothed residual per queued request of samples taken with one. Readers
// use the atomics; writers (first bytes) hold mu.
type estimator struct {
	base, invRate, wait atomic.Uint64 // float64 bits; 0 = not learned
	samples             atomic.Int64

	mu                  sync.Mutex
	n, sx, sy, sxx, sxy float64 // guarded by mu; decayed sums
}

// estDecay weighs old samples: about the last 20 dominate.
const estDecay = 0.95

func (e *estimator) load() Estimate {
	inv := math.Float64frombits(e.invRate.Load())
	r := 0.0
	if inv > 0 {
		r = 1 / inv
	}
	return Estimate{Base: math.Float64frombits(e.base.Load()), Rate: r, QueueWait: math.Float64frombits(e.wait.Load()), Samples: e.samples.Load()}
}

// observe folds in one first byte: work prefill tokens (ahead and own),
// queued requests ahead, and the time it took.
func (e *estimator) observe(work, queued, ttft, defInv, defBase float64) {
	if ttft <= 0 || math.IsNaN(work) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.samples.Add(1)
	inv := math.Float64frombits(e.invRate.Load())
	if inv == 0 {
		inv = defInv
	}
	base := math.Float64frombits(e.base.Load())
	if e.n == 0 && base == 0 {
		base = defBase
	}
	if queued >= 0.5 {
		// Time beyond the prefill model is waiting for a slot.
		w := max(0, ttft-base-work*inv) / queued
		old := math.Float64frombits(e.wait.Load())
		if old != 0 {
			w = old + 0.2*(w-old)
		}
		e.wait.Store(math.Float64bits(max(w, 1e-9)))
		return
	}
	e.n = e.n*estDecay + 1
	e.sx = e.sx*estDecay + work
	e.sy = e.sy*estDecay + ttft
	e.sxx = e.sxx*estDecay + work*work
	e.sxy = e.sxy*estDecay + work*ttft
	mx, my := e.sx/e.n, e.sy/e.n
	varX := e.sxx/e.n - mx*mx
	if e.samples.Load() >= 5 && varX > 1e-6*mx*mx+1 {
		if slope := (e.sxy/e.n - mx*my) / varX; slope > 0 {
			// A rate more than 10x off the configured one is noise (a
			// burst prefilled in one batch, a stalled sample), not a GPU.
			inv = min(max(slope, defInv/10), defInv*10)
		}
	}
	base = max(0, my-inv*mx)
	e.invRate.Store(math.Float64bits(inv))
	e.base.Store(math.Float64bits(max(base, 1e-9)))
}

// placedDecay is what a new prompt placed anywhere leaves of the weight of
// those placed before it ([Ledger.placedWeight]): a backend's earlier
// prompts count for half after some 35 more.
const placedDecay = 0.98

// placedWeight returns the decayed tokens of the new prompts placed here
// as of placement n.
func (l *Ledger) placedWeight(n uint64) float64 {
	w := math.Float64frombits(l.placed.Load())
	if at := l.placedAt.Load(); n > at {
		w *= math.Pow(placedDecay, float64(n-at))
	}
	return w
}

// place adds a new prompt of tokens placed here as placement n.
func (l *Ledger) place(tokens int, n uint64) {
	l.placed.Store(math.Float64bits(l.placedWeight(n) + float64(tokens)))
	l.placedAt.Store(n)
}
