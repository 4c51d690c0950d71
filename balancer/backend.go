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

	// Ledger holds the counters that outlive snapshots. Never nil in a
	// published snapshot.
	Ledger *Ledger
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

// ObserveFailure counts a failed request.
func (l *Ledger) ObserveFailure() { l.failures.Add(1) }
