package balancer

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// PassiveConfig is passive health: what the proxy sees of each request
// decides whether a backend stays in rotation (issue 17), as Caddy's
// passive health checks count failures at selection and Envoy's outlier
// detection ejects consecutive failures and outliers with a growing
// ejection time, capped at a share of the fleet. An ejected backend is
// skipped by every pick until its ejection time is over and its health
// check answers again; scrape's loop probes it for that.
type PassiveConfig struct {
	// EjectAfter is the number of failed requests in a row that ejects a
	// backend: a broken connection, a 5xx or 429 answer, a stream whose
	// headers did not come within proxy.stream_first_byte_timeout, one
	// that went silent for proxy.stream_idle_timeout, or one cut after
	// its first byte. A refused connection ([FailRefused]) ejects at
	// once. 0 disables ejection on failures, refusals included.
	// (default 5)
	EjectAfter int `mapstructure:"eject_after"`
	// EjectBackoff is how long the first ejection lasts; each further one
	// in a row doubles it, up to EjectBackoffMax, whatever the health
	// check says meanwhile. A backend readmitted is on probation: one
	// more failure before a success ejects it again. (default 1s)
	EjectBackoff time.Duration `mapstructure:"eject_backoff"`
	// EjectBackoffMax caps the ejection time; a backend readmitted longer
	// ago than this starts again from EjectBackoff. (default 30s)
	EjectBackoffMax time.Duration `mapstructure:"eject_backoff_max"`
	// MaxEjectionPercent caps the backends ejected at once, as a
	// percentage of those not draining, so that a problem of the whole
	// fleet (or of llmlb's own network) does not empty the pool; one
	// backend may always be ejected. 0..100. (default 50)
	MaxEjectionPercent int `mapstructure:"max_ejection_percent"`
	// OutlierTTFTFactor ejects a backend whose time to first token, in
	// its moving average, is more than this many times the fleet's median
	// for prompts of the same size class (uncached prompt tokens, in
	// powers of two from 256). Set it above the speed ratio of the
	// slowest and fastest GPUs the fleet mixes. 0 disables outlier
	// ejection. (default 3)
	OutlierTTFTFactor float64 `mapstructure:"outlier_ttft_factor"`
	// OutlierMinExcess is how far beyond the fleet's median a backend's
	// time to first token must also be, so that a few times a short
	// median, a few milliseconds, is not an outlier. (default 1s)
	OutlierMinExcess time.Duration `mapstructure:"outlier_min_excess"`
	// OutlierMinSamples is the first tokens a backend must have answered
	// in a size class, since it was last readmitted, before it is judged
	// or counted in the fleet's median. (default 10)
	OutlierMinSamples int `mapstructure:"outlier_min_samples"`
	// OutlierMinBackends is how many backends, the one judged included,
	// must have OutlierMinSamples in a size class for a median to be
	// taken. (default 3)
	OutlierMinBackends int `mapstructure:"outlier_min_backends"`
}

// DefaultPassiveConfig returns passive health's defaults.
func DefaultPassiveConfig() PassiveConfig {
	return PassiveConfig{
		EjectAfter:         5,
		EjectBackoff:       time.Second,
		EjectBackoffMax:    30 * time.Second,
		MaxEjectionPercent: 50,
		OutlierTTFTFactor:  3,
		OutlierMinExcess:   time.Second,
		OutlierMinSamples:  10,
		OutlierMinBackends: 3,
	}
}

func (c PassiveConfig) validate(bad func(field, format string, args ...any)) {
	if c.EjectAfter < 0 {
		bad("passive.eject_after", "must not be negative, got %d", c.EjectAfter)
	}
	if c.EjectBackoff <= 0 {
		bad("passive.eject_backoff", "must be positive, got %s", c.EjectBackoff)
	}
	if c.EjectBackoffMax < c.EjectBackoff {
		bad("passive.eject_backoff_max", "must be at least eject_backoff (%s), got %s", c.EjectBackoff, c.EjectBackoffMax)
	}
	if c.MaxEjectionPercent < 0 || c.MaxEjectionPercent > 100 {
		bad("passive.max_ejection_percent", "must be 0..100, got %d", c.MaxEjectionPercent)
	}
	if c.OutlierTTFTFactor != 0 && c.OutlierTTFTFactor <= 1 || math.IsNaN(c.OutlierTTFTFactor) {
		bad("passive.outlier_ttft_factor", "must be 0 (off) or above 1, got %g", c.OutlierTTFTFactor)
	}
	if c.OutlierMinExcess < 0 {
		bad("passive.outlier_min_excess", "must not be negative, got %s", c.OutlierMinExcess)
	}
	if c.OutlierMinSamples < 1 {
		bad("passive.outlier_min_samples", "must be at least 1, got %d", c.OutlierMinSamples)
	}
	if c.OutlierMinBackends < 2 {
		bad("passive.outlier_min_backends", "must be at least 2, got %d", c.OutlierMinBackends)
	}
}

// backoff is the length of the n-th ejection in a row: EjectBackoff
// doubled for each after the first, capped at EjectBackoffMax.
func (c PassiveConfig) backoff(n int) time.Duration {
	d := c.EjectBackoff
	for i := 1; i < n && d < c.EjectBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.EjectBackoffMax)
}

// Failure is a kind of failed request that passive health counts.
type Failure int

// The failures the proxy reports with [Balancer.Failed].
const (
	// FailConnect: the connection failed before any answer, other than
	// by a refusal: reset or closed, a dial that timed out or found no
	// route.
	FailConnect Failure = iota
	// FailStatus: the backend answered 5xx.
	FailStatus
	// FailOverloaded: the backend answered 429.
	FailOverloaded
	// FailFirstByte: a stream's headers did not come in time.
	FailFirstByte
	// FailStall: a stream sent nothing for the idle limit.
	FailStall
	// FailCut: a stream ended without its end, after its first byte.
	FailCut
	// FailRefused: the dial was refused (ECONNREFUSED): nothing listens
	// at the backend's address, as after its process died. Unlike the
	// other kinds it ejects the backend at its first occurrence, not
	// after EjectAfter in a row: a refusal says the server is gone, not
	// that one request went wrong, and every pick until its ejection
	// would try it again, most of all when the live backends look
	// saturated and it, unloaded, is the only candidate left (issue 53).
	// nginx's upstream max_fails counts connect errors and defaults to 1
	// (nginx.org/en/docs/http/ngx_http_upstream_module.html#server).
	FailRefused

	failureKinds
)

// reasonOutlier indexes ejections by TTFT outlier among the failure kinds.
const reasonOutlier = int(failureKinds)

// ejectReasons names each [Failure], in order, and then reasonOutlier:
// the ejection metric's reason label.
var ejectReasons = [...]string{"connect", "5xx", "429", "first-byte-timeout", "stall", "stream-cut", "refused", "ttft-outlier"}

// A Failure added without its name, or a name without its Failure, makes
// this index constant out of range and the package fail to compile.
var _ = [1]struct{}{}[len(ejectReasons)-reasonOutlier-1]

// String returns the failure's name, as the ejection metric's reason
// label shows it.
func (f Failure) String() string {
	if f < 0 || f >= failureKinds {
		return "unknown"
	}
	return ejectReasons[f]
}

// EjectReasons lists the reasons [Balancer.Ejections] counts by: each
// [Failure]'s name and "ttft-outlier".
func EjectReasons() []string { return slices.Clone(ejectReasons[:]) }

// health is a backend's passive-health state in its ledger.
type health struct {
	ejected atomic.Bool // read by every pick

	mu         sync.Mutex
	until      time.Time // guarded by mu; no readmission before
	reason     string    // guarded by mu; why, for /debug/backends
	inARow     int       // guarded by mu; ejections without a good spell between
	total      int       // guarded by mu
	readmitted time.Time // guarded by mu

	ttft ttftStats
}

// Ejection is a backend's passive-health state, for /debug/backends and
// the status page.
type Ejection struct {
	Ejected bool      `json:"ejected"`
	Until   time.Time `json:"until,omitzero"`
	Reason  string    `json:"reason,omitempty"`
	Total   int       `json:"total"`
}

// Ejected reports whether passive health has taken the backend out of
// rotation.
func (l *Ledger) Ejected() bool { return l.health.ejected.Load() }

// Ejection returns the backend's passive-health state.
func (l *Ledger) Ejection() Ejection {
	h := &l.health
	h.mu.Lock()
	defer h.mu.Unlock()
	e := Ejection{Ejected: h.ejected.Load(), Total: h.total}
	if e.Ejected {
		e.Until, e.Reason = h.until, h.reason
	}
	return e
}

// ReadmitDue reports whether the backend is ejected and its ejection time
// is over at now: its health check decides whether it returns (see
// [Balancer.Probed]).
func (l *Ledger) ReadmitDue(now time.Time) bool {
	h := &l.health
	if !h.ejected.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !now.Before(h.until)
}

// skipEjected is the pick's passive-health filter: it reports whether be
// is ejected, and says so in the explanation.
func skipEjected(be *Backend, ex *Explanation) bool {
	if !be.Ledger.Ejected() {
		return false
	}
	ex.skip(be, "ejected")
	return true
}

// Failed counts a failed request on be, and ejects be when EjectAfter
// failures come in a row, or at once when f is [FailRefused]; the
// ejection cap (MaxEjectionPercent) bounds both. The proxy calls it for
// every failure it sees; it may be called concurrently.
func (b *Balancer) Failed(be *Backend, f Failure) {
	n := be.Ledger.ObserveFailure()
	pc := b.cfg.Passive
	if pc.EjectAfter <= 0 || be.Ledger.Ejected() {
		return
	}
	switch {
	case f == FailRefused:
		b.eject(be, int(f), "the connection was refused: nothing listens at its address")
	case n >= int64(pc.EjectAfter):
		b.eject(be, int(f), fmt.Sprintf("%d failed requests in a row, the last %s", n, f))
	}
}

// Succeeded records a request on be that did not fail, ending its failure
// streak.
func (b *Balancer) Succeeded(be *Backend) { be.Ledger.ObserveSuccess() }

// eject takes be out of rotation unless the ejection cap forbids it, and
// reports whether it did.
func (b *Balancer) eject(be *Backend, reason int, detail string) bool {
	b.ejectMu.Lock()
	defer b.ejectMu.Unlock()
	l := be.Ledger
	if l.Ejected() {
		return false
	}
	pc := b.cfg.Passive
	fleet, out := 0, 0
	for _, x := range b.snap.Load().Backends {
		if x.State == StateDraining {
			continue
		}
		fleet++
		if x.Ledger.Ejected() {
			out++
		}
	}
	if out+1 > max(1, fleet*pc.MaxEjectionPercent/100) {
		level := slog.LevelDebug
		if b.capped.Add(1) == 1 {
			level = slog.LevelWarn // said loudly once; counted in llmlb_backend_ejections_capped_total
		}
		b.logger.Log(context.Background(), level, "backend not ejected: the ejection cap is reached", "backend", be.ID,
			"reason", ejectReasons[reason], "ejected", out, "backends", fleet, "max_ejection_percent", pc.MaxEjectionPercent)
		return false
	}
	now := b.now()
	h := &l.health
	h.mu.Lock()
	if h.inARow > 0 && now.Sub(h.readmitted) > pc.EjectBackoffMax {
		h.inARow = 0 // a good spell since the last one: start short again
	}
	h.inARow++
	h.total++
	d := pc.backoff(h.inARow)
	h.until, h.reason = now.Add(d), ejectReasons[reason]+": "+detail
	h.ttft.reset() // judged afresh once back
	h.ejected.Store(true)
	h.mu.Unlock()
	b.ejections[reason].Add(1)
	b.logger.Warn("backend ejected", "backend", be.ID, "reason", ejectReasons[reason], "detail", detail, "for", d)
	return true
}

// Probed takes the outcome of the health probe scrape's loop runs on an
// ejected backend once [Ledger.ReadmitDue]: a backend that answers returns
// to rotation on probation (one failure before a success ejects it
// again); one that does not stays out for the next, longer, ejection time.
func (b *Balancer) Probed(id string, healthy bool) {
	b.mu.Lock()
	l := b.ledgers[id]
	b.mu.Unlock()
	if l == nil || !l.health.ejected.Load() {
		return
	}
	h := &l.health
	now := b.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Before(h.until) {
		return
	}
	if !healthy {
		h.inARow++
		d := b.cfg.Passive.backoff(h.inARow)
		h.until = now.Add(d)
		b.logger.Debug("ejected backend still failing", "backend", id, "for", d)
		return
	}
	h.readmitted = now
	if n := int64(b.cfg.Passive.EjectAfter); n > 0 {
		l.streak.Store(n - 1)
	}
	h.ejected.Store(false)
	b.logger.Info("backend readmitted", "backend", id)
}

// Ejections returns how many ejections each reason caused, indexed like
// [EjectReasons], and how many the ejection cap refused.
func (b *Balancer) Ejections() (byReason []int64, capped int64) {
	byReason = make([]int64, len(ejectReasons))
	for i := range byReason {
		byReason[i] = b.ejections[i].Load()
	}
	return byReason, b.capped.Load()
}

// ttftBuckets are the prompt size classes outliers are judged in: fewer
// than 256 uncached prompt tokens, then each power of two up to 16k and
// more.
const ttftBuckets = 8

func ttftBucket(tokens int) int { return min(bits.Len(uint(max(tokens, 0))>>8), ttftBuckets-1) }

// ttftAlpha weighs a new first-token time in a backend's outlier average:
// a backend that turns slow crosses the threshold within a few requests.
const ttftAlpha = 0.3

// ttftStats is a backend's moving average of time to first token per
// prompt size class, and the samples behind it. Lock-free: a lost update
// under a race costs one sample.
type ttftStats struct {
	avg [ttftBuckets]atomic.Uint64 // float64 seconds
	n   [ttftBuckets]atomic.Int64
}

func (s *ttftStats) observe(k int, v float64) (avg float64, n int64) {
	n = s.n[k].Add(1)
	if n == 1 {
		s.avg[k].Store(math.Float64bits(v))
		return v, n
	}
	for {
		old := s.avg[k].Load()
		next := math.Float64frombits(old) + ttftAlpha*(v-math.Float64frombits(old))
		if s.avg[k].CompareAndSwap(old, math.Float64bits(next)) {
			return next, n
		}
	}
}

func (s *ttftStats) reset() {
	for k := range s.n {
		s.n[k].Store(0)
		s.avg[k].Store(0)
	}
}

// fleetTTFT caches the fleet's median first-token time per size class,
// recomputed at most every fleetTTFTEvery, so that a first byte costs O(1)
// and not a walk over the fleet.
type fleetTTFT struct {
	at  [ttftBuckets]atomic.Int64  // unix nanoseconds of the computation
	med [ttftBuckets]atomic.Uint64 // float64 seconds; 0: too few backends
}

const fleetTTFTEvery = 100 * time.Millisecond

// firstByte feeds one first-token time of be, for a prompt of tokens
// uncached tokens, to outlier detection, and ejects be if it is far beyond
// the fleet's.
func (b *Balancer) firstByte(be *Backend, tokens int, d time.Duration) {
	pc := b.cfg.Passive
	if pc.OutlierTTFTFactor <= 0 || d <= 0 {
		return
	}
	k := ttftBucket(tokens)
	avg, n := be.Ledger.health.ttft.observe(k, d.Seconds())
	if n < int64(pc.OutlierMinSamples) || be.Ledger.Ejected() {
		return
	}
	med := b.fleetMedian(k)
	if med <= 0 || avg <= pc.OutlierTTFTFactor*med || avg-med < pc.OutlierMinExcess.Seconds() {
		return
	}
	b.eject(be, reasonOutlier, fmt.Sprintf("time to first token %.3gs against the fleet's median %.3gs for prompts of its size", avg, med))
}

// fleetMedian returns the median of the moving averages of the backends
// in rotation with enough samples in size class k, or 0 when fewer than
// OutlierMinBackends have.
func (b *Balancer) fleetMedian(k int) float64 {
	now := b.now().UnixNano()
	f := &b.fleet
	if at := f.at[k].Load(); at != 0 && now-at < int64(fleetTTFTEvery) {
		return math.Float64frombits(f.med[k].Load())
	}
	pc := b.cfg.Passive
	var buf [64]float64
	vals := buf[:0]
	for _, be := range b.snap.Load().Backends {
		h := &be.Ledger.health
		if be.State != StateReady || h.ejected.Load() || h.ttft.n[k].Load() < int64(pc.OutlierMinSamples) {
			continue
		}
		vals = append(vals, math.Float64frombits(h.ttft.avg[k].Load()))
	}
	med := 0.0
	if len(vals) >= pc.OutlierMinBackends {
		slices.Sort(vals)
		med = vals[len(vals)/2]
		if len(vals)%2 == 0 {
			med = (vals[len(vals)/2-1] + med) / 2
		}
	}
	f.med[k].Store(math.Float64bits(med))
	f.at[k].Store(now)
	return med
}
