package balancer

import (
	"math"
	"sync"
	"sync/atomic"
)

// slotLearner learns how many requests a backend runs at once (vLLM's
// max_num_seqs, SGLang's max_running_requests, llm-d-inference-sim's
// --max-num-seqs), which no engine's metrics state: a request beyond them
// waits for a running one to finish, a whole request's time, however
// little of it is left to prefill.
//
// Two kinds of evidence must agree. The readings propose a count: the
// most requests any reading showed running, once [slotsReadings] readings
// in a row showed that many with requests waiting and KV to spare. On an
// engine whose batch is bounded by a token budget or by KV the proposal is
// often wrong (running holds still for a reading or two while warming up),
// so the first bytes judge it: requests picked with at least that many
// running and queued must take far longer than the cost estimated, against
// those picked with fewer ([slotStallRatio]). See docs/design/ttft.md#slots.
type slotLearner struct {
	top  atomic.Int64 // the most running any reading showed
	held atomic.Int64 // readings in a row since at top with requests waiting
	// slots is the count the first bytes confirmed, 0 for none; lent is
	// the one a backend of the class confirmed ([Balancer.lendSlotsLocked]),
	// and lending what slots held when it was last lent.
	slots   atomic.Int64
	lent    atomic.Int64
	lending atomic.Int64

	mu sync.Mutex
	ev slotEvidence // guarded by mu
}

// slotEvidence is the first bytes' log ratios of observed to estimated
// time, decayed, for requests picked at or past a count (hi) and below it
// (lo).
type slotEvidence struct {
	count      int64
	nHi, sumHi float64
	nLo, sumLo float64
	hi, lo     int // first bytes each side, not decayed
}

const (
	// minSlots is the fewest requests a backend may be learned to run at
	// once.
	minSlots = 4
	// slotsReadings is how many readings in a row must show a plateau.
	slotsReadings = 2
	// slotsKV is the KV-cache use from which requests waiting are taken
	// to wait for KV rather than for a slot.
	slotsKV = 0.9
	// slotStallRatio is how many times longer than its estimate, against
	// the requests picked below the count, a request picked at it must
	// wait (in the geometric mean) for the count to be the slots.
	slotStallRatio = 2
	// slotSamples is the first bytes each side needs before judging.
	slotSamples = 3
	// slotDecay weighs old first bytes: about the last 50 dominate.
	slotDecay = 0.98
)

// reading folds in one reading of the backend's metrics: requests running
// and waiting, and KV-cache use. Called by the one goroutine that
// publishes readings ([Balancer.Update]).
func (s *slotLearner) reading(running, waiting, kv Value) {
	if !running.Known || !waiting.Known {
		return
	}
	r, queue := int64(running.V), waiting.V >= 1
	if n := s.slots.Load(); n > 0 && r > n {
		s.slots.Store(0) // more ran at once: that was not the limit
	}
	// Requests that wait while the cache is nearly full wait for KV, not
	// for a slot.
	kvBound := kv.Known && kv.V >= slotsKV
	switch top := s.top.Load(); {
	case r > top:
		s.top.Store(r)
		s.held.Store(0)
		if queue && !kvBound {
			s.held.Store(1)
		}
	case queue && (r < top || kvBound):
		// Requests wait below the most ever run, or for KV: what bounds
		// the batch now is not the slots, so the plateau seen so far may
		// not be one either.
		s.held.Store(0)
	case queue:
		s.held.Add(1)
	}
}

// proposed is the count the readings propose, or 0.
func (s *slotLearner) proposed() int64 {
	if top := s.top.Load(); top >= minSlots && s.held.Load() >= slotsReadings {
		return top
	}
	return 0
}

// firstByte folds in one first byte: the requests running and queued the
// pick saw (n), the cost's estimate of its first token and the time it
// took, in seconds.
func (s *slotLearner) firstByte(n, estimate, took float64) {
	if !(estimate > 0) || !(took > 0) || math.IsInf(took, 0) || math.IsNaN(n) {
		return
	}
	count := s.slots.Load()
	if count == 0 {
		count = s.proposed()
	}
	if count == 0 {
		return
	}
	r := math.Log(took / estimate)
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := &s.ev
	if ev.count != count {
		*ev = slotEvidence{count: count}
	}
	if n >= float64(count) {
		ev.nHi, ev.sumHi, ev.hi = ev.nHi*slotDecay+1, ev.sumHi*slotDecay+r, ev.hi+1
	} else {
		ev.nLo, ev.sumLo, ev.lo = ev.nLo*slotDecay+1, ev.sumLo*slotDecay+r, ev.lo+1
	}
	if ev.hi < slotSamples || ev.lo < slotSamples {
		return
	}
	if ev.sumHi/ev.nHi-ev.sumLo/ev.nLo > math.Log(slotStallRatio) {
		s.slots.Store(count)
	} else if s.slots.Load() == count {
		s.slots.Store(0)
	}
}

// own is the count this backend's own evidence confirmed, or 0.
func (s *slotLearner) own() int64 { return s.slots.Load() }

// Slots returns how many requests the backend runs at once: the count its
// own readings and first bytes confirmed, else the one a backend of its
// class confirmed, else 0 (not known).
func (l *Ledger) Slots() int64 {
	if n := l.slots.own(); n > 0 {
		return n
	}
	return l.slots.lent.Load()
}
