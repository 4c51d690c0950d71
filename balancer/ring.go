package balancer

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// RingPicker is KubeAI's CHWBL, consistent hashing with bounded loads
// (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
// Loads", 2018; kubeai-project/kubeai internal/loadbalancer and
// api/openai/v1/chat_completions.go at f442a2cd): the key is the model or
// adapter name and the first 100 characters of the first user message
// (the system prompt skipped; a completion's prompt), hashed with xxhash64
// onto a ring of VirtualNodes points per backend. The request goes to the
// first backend clockwise whose requests in flight are at most LoadFactor
// times the average counting this one; when none is, to the key's first
// backend, so it never queues.
//
// The picker keeps the ring it built for the current snapshot generation
// and rebuilds it when the set of backends changes.
type RingPicker struct {
	cfg   ConsistentHashConfig // immutable
	built atomic.Pointer[ring] // the last generation's ring; nil before the first pick
	mu    sync.Mutex           // serialises ring builds
}

var _ Picker = (*RingPicker)(nil)

// ring is the points of every backend of one snapshot generation.
type ring struct {
	gen    uint64
	points []ringPoint
}

type ringPoint struct {
	hash uint64
	id   uint64 // backend idHash
}

func (r *RingPicker) ringFor(snap *Snapshot) *ring {
	if rg := r.built.Load(); rg != nil && rg.gen == snap.gen {
		return rg
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rg := r.built.Load(); rg != nil && rg.gen == snap.gen {
		return rg
	}
	rg := &ring{gen: snap.gen, points: make([]ringPoint, 0, len(snap.Backends)*r.cfg.VirtualNodes)}
	for _, be := range snap.Backends {
		for v := range r.cfg.VirtualNodes {
			rg.points = append(rg.points, ringPoint{hash: mix(be.idHash + uint64(v)*0x9e3779b97f4a7c15), id: be.idHash})
		}
	}
	slices.SortFunc(rg.points, func(a, b ringPoint) int { return cmp.Compare(a.hash, b.hash) })
	r.built.Store(rg)
	return rg
}

// Choose implements [Picker].
func (r *RingPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	key := p.Req.UserText
	if key == nil {
		key = p.Req.Prompt
	}
	if n := r.cfg.PrefixBytes; len(key) > n {
		key = key[:n]
	}
	var d xxhash.Digest
	_, _ = d.WriteString(p.Req.Model)
	_, _ = d.Write(key)
	h := d.Sum64()
	var inFlight int64
	for i := range p.Cands {
		inFlight += p.Cands[i].InFlight
	}
	bound := r.cfg.LoadFactor * float64(inFlight+1) / float64(len(p.Cands))
	rg := r.ringFor(p.snap)
	start, _ := slices.BinarySearchFunc(rg.points, h, func(pt ringPoint, h uint64) int { return cmp.Compare(pt.hash, h) })
	home := -1
	for k := range rg.points {
		pt := rg.points[(start+k)%len(rg.points)]
		for i := range p.Cands {
			if p.Cands[i].Backend.idHash != pt.id {
				continue
			}
			if home < 0 {
				home = i
			}
			if float64(p.Cands[i].InFlight) <= bound {
				return i, ReasonConsistentHash
			}
		}
	}
	return max(home, 0), ReasonConsistentHash
}
