package balancer

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
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
	// StateDraining is a backend that left discovery or the config: it
	// takes no new requests, and the ones in flight finish.
	StateDraining
)

// HeaderDataParallelRank is the request header that sends a request, or a
// health probe, to one data-parallel rank of a server: vLLM reads it as
// the global rank (_get_data_parallel_rank in
// vllm/entrypoints/openai/engine/serving.py at 619e4b31).
const HeaderDataParallelRank = "X-data-parallel-rank"

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

// UnmarshalText reads a name MarshalText wrote.
func (s *State) UnmarshalText(b []byte) error {
	for _, st := range []State{StateUnknown, StateReady, StateDown, StateDraining} {
		if st.String() == string(b) {
			*s = st
			return nil
		}
	}
	return fmt.Errorf("unknown backend state %q", b)
}

// Backend is one model-server port as a [Snapshot] holds it. A Backend is
// immutable once published, except through its [Ledger], which is safe for
// concurrent use.
type Backend struct {
	// ID names the backend in metrics, logs and the admin pages: its URL
	// as written.
	ID string
	// Name is what clients may see of the backend (x-llmlb-backend): its
	// configured name, or b1, b2, ... in the order backends first
	// appeared. Never its address.
	Name string
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
	// Warning is a problem an operator must fix that does not take the
	// backend out of rotation, such as a declared engine that its metrics
	// page contradicts; empty when there is none.
	Warning string
	// Labels are the operator's names for the backend from config (a GPU
	// type, a rack), shown on the status page; nil when none. Never
	// written once published.
	Labels map[string]string
	// Metrics is the last good reading of the backend's /metrics page.
	// Metrics.At is zero before the first one.
	Metrics Metrics
	// Stale reports that Metrics is older than the scrape staleness limit
	// (or that no reading has arrived yet, or the last ones failed). A stale
	// backend gets requests only when no fresh one can serve.
	Stale bool

	// Ranked reports that the backend is one data-parallel rank of a
	// server that runs several engines behind one port (vllm serve
	// --data-parallel-size): each rank is a backend of its own, with its
	// own queue, KV cache and prefix index, and every request sent to it
	// carries [HeaderDataParallelRank]: Rank, the global rank, which is what
	// vLLM reads (vllm-project/router #210: local ranks misroute). A bool
	// beside Rank, since rank 0 is a rank and the zero Backend has none.
	Ranked bool
	// Rank is the global data-parallel rank; meaningless unless Ranked.
	Rank int
	// Role is the backend's part in a disaggregated prefill/decode fleet;
	// zero is [RoleBoth].
	Role Role
	// BootstrapPort is, for an SGLang prefill server, the port its
	// decode peers fetch KV cache through (--disaggregation-bootstrap-port),
	// which llmlb names in both legs of a P/D request; 0 for none.
	BootstrapPort int

	// Ledger holds the counters that outlive snapshots. Never nil in a
	// published snapshot.
	Ledger *Ledger

	slot   int    // the backend's small integer in prefix indexes, stable while it exists
	idHash uint64 // hash of ID, for ties and rings
	mark   mark   // Ledger's counts when Metrics was read
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

// UnmarshalJSON reads a number as a known value and null as unknown.
func (v *Value) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*v = Value{}
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return err
	}
	*v = Known(f)
	return nil
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

// rankMark separates a server's ID from the rank in a rank's ID.
const rankMark = "#rank="

// RankID returns the ID of the data-parallel rank of the server whose ID
// is server: server#rank=<rank>. A URL has no fragment when used as a
// backend, so the mark cannot clash with a configured URL's ID.
func RankID(server string, rank int) string {
	return server + rankMark + strconv.Itoa(rank)
}

// RankServer returns the ID of the server a rank's ID names, or id itself
// when it names no rank.
func RankServer(id string) string {
	if i := strings.LastIndex(id, rankMark); i >= 0 {
		return id[:i]
	}
	return id
}
