// Package balancer holds the set of model-server backends, the immutable
// snapshot the request path reads, the in-flight ledger and the picker.
//
// Writers (discovery, health checks, model discovery) call [Balancer.Update];
// each call builds a new immutable [Snapshot] and swaps it in atomically.
// Readers ([Balancer.Pick], [Balancer.Snapshot]) never lock. Counters that must
// survive a rebuild (requests in flight, request totals, time-to-first-byte
// estimates) live in a long-lived [Ledger] per backend whose pointer every
// snapshot copies, as grpc-go's leastrequest balancer does.
package balancer

import (
	"math"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// State is a backend's place in its life cycle as the balancer sees it.
type State int

const (
	// StateUnknown is a backend that has not answered yet. It gets traffic
	// only when no ready backend can serve the request.
	StateUnknown State = iota
	// StateReady is a backend that answers and takes new requests.
	StateReady
	// StateDown is a backend that stopped answering. It gets no traffic until
	// it answers again.
	StateDown
	// StateDraining is a backend that left discovery: it takes no new
	// requests, and the ones in flight finish.
	StateDraining
)

// String returns the lower-case name of s, as /debug/backends shows it.
func (s State) String() string {
	switch s {
	case StateReady:
		return "ready"
	case StateDown:
		return "down"
	case StateDraining:
		return "draining"
	default:
		return "unknown"
	}
}

// MarshalText writes s as its name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Backend is one model-server port as a [Snapshot] holds it. A Backend is
// immutable once published, except through its [Ledger], which is safe for
// concurrent use.
type Backend struct {
	// ID names the backend in metrics, headers and logs: its URL as written.
	ID string
	// URL is the base URL requests are forwarded to.
	URL *url.URL
	// Engine names the engine row the backend is scraped with ("vllm", ...).
	Engine string
	// Models are the base models the backend serves. Nil means not known yet
	// (neither configured nor learned from /v1/models).
	Models []string
	// Adapters are the LoRA adapters the backend serves, each with the base
	// model it runs on.
	Adapters []Adapter
	// State is the backend's health as last seen.
	State State
	// Since is when State last changed.
	Since time.Time
	// Reason says why the backend is in State, e.g. "health check failed"
	// or "ejected after 5 consecutive failures"; empty when ready.
	Reason string
	// Metrics is the last good reading of the backend's /metrics page.
	// Metrics.At is zero before the first one.
	Metrics Metrics
	// Stale reports that Metrics is older than the scrape staleness limit
	// (or that no reading has arrived yet, or the last ones failed). A stale
	// backend gets requests only when no fresh one can serve.
	Stale bool

	// Ledger holds the counters that outlive snapshots. Never nil in a
	// published snapshot.
	Ledger *Ledger
}

// Value is a scraped reading that may be unknown: a signal the engine does
// not export, or one not read yet, is unknown, never 0.
type Value struct {
	V     float64
	Known bool
}

// Known returns a known Value.
func Known(v float64) Value { return Value{V: v, Known: true} }

// MarshalJSON writes the value, or null when unknown.
func (v Value) MarshalJSON() ([]byte, error) {
	if !v.Known || math.IsNaN(v.V) || math.IsInf(v.V, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v.V, 'g', -1, 64), nil
}

// LoRAInfo is what a server reports of its LoRA adapters: how many it can
// hold at once, which are loaded and running, and which requests wait for.
type LoRAInfo struct {
	Max     int      `json:"max"`
	Running []string `json:"running"`
	Waiting []string `json:"waiting"`
}

// Metrics is one reading of a backend's /metrics page, in the engine's
// units translated to ours.
type Metrics struct {
	// Queued and Running are request counts.
	Queued  Value `json:"queued"`
	Running Value `json:"running"`
	// KVUsage is the used fraction of the KV cache, 0..1.
	KVUsage Value `json:"kv_usage"`
	// BlockSize is tokens per KV-cache block; NumBlocks the block count.
	BlockSize Value `json:"block_size"`
	NumBlocks Value `json:"num_blocks"`
	// LoRA is nil when the engine reports no LoRA information.
	LoRA *LoRAInfo `json:"lora"`
	// At is when the page was read.
	At time.Time `json:"at"`
}

// Adapter is a LoRA adapter served on top of a base model.
type Adapter struct {
	Name   string `json:"name"`
	Parent string `json:"parent"`
}

// Serves reports whether b serves model as a base model or as an adapter.
func (b *Backend) Serves(model string) bool {
	if slices.Contains(b.Models, model) {
		return true
	}
	for _, a := range b.Adapters {
		if a.Name == model {
			return true
		}
	}
	return false
}

// ModelsKnown reports whether b's model list is known, configured or learned.
func (b *Backend) ModelsKnown() bool { return b.Models != nil }

// Ledger holds one backend's counters that survive snapshot rebuilds. All
// methods are safe for concurrent use; the zero value is ready.
type Ledger struct {
	inFlight atomic.Int64 // requests sent and not yet finished
	total    atomic.Int64 // requests sent, ever
	failures atomic.Int64 // requests that failed at the transport or with 5xx
	streak   atomic.Int64 // consecutive failures since the last success
	ttftBits atomic.Uint64
}

// InFlight returns the number of requests sent to the backend and not yet
// finished.
func (l *Ledger) InFlight() int64 { return l.inFlight.Load() }

// Total returns the number of requests ever sent to the backend.
func (l *Ledger) Total() int64 { return l.total.Load() }

// Failures returns the number of requests to the backend that failed.
func (l *Ledger) Failures() int64 { return l.failures.Load() }

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

// ObserveFailure counts a request that failed to connect or got a 5xx.
func (l *Ledger) ObserveFailure() {
	l.failures.Add(1)
	l.streak.Add(1)
}

// ObserveSuccess records an answer below 500, ending a failure streak. It
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

// ResetFailureStreak forgets the current streak, when a backend that was
// ejected answers its health check again.
func (l *Ledger) ResetFailureStreak() { l.streak.Store(0) }
