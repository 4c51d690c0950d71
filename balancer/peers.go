package balancer

import "sync/atomic"

// RoundRobinPicker cycles through the candidates in snapshot order, as
// nginx's default round-robin does (unweighted). Its position is its own,
// as Caddy's RoundRobinSelection owns its counter: a balancer builds its
// policy once, so the position lasts as long as the balancer.
type RoundRobinPicker struct {
	pos atomic.Uint64 // the next pick's turn
}

var _ Picker = (*RoundRobinPicker)(nil)

// Choose implements [Picker].
func (r *RoundRobinPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	var n uint64
	if p.Dry {
		n = r.pos.Load()
	} else {
		n = r.pos.Add(1) - 1
	}
	return int(n % uint64(len(p.Cands))), ReasonRoundRobin
}

// RandomPicker picks uniformly at random, as the SGLang model gateway's
// random policy does.
type RandomPicker struct{ rand func() uint64 }

var _ Picker = (*RandomPicker)(nil)

// Choose implements [Picker].
func (r *RandomPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	return int(r.rand() % uint64(len(p.Cands))), ReasonRandom
}

// LeastRequestPicker picks the candidate with the fewest requests in flight
// from this balancer, as nginx's least_conn does; ties go to the one that
// has served fewer requests in total, then to snapshot (ID) order.
type LeastRequestPicker struct{}

var _ Picker = LeastRequestPicker{}

// Choose implements [Picker].
func (LeastRequestPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	best := 0
	for i := 1; i < len(p.Cands); i++ {
		a, b := &p.Cands[i], &p.Cands[best]
		if a.InFlight < b.InFlight || (a.InFlight == b.InFlight && a.Backend.Ledger.Total() < b.Backend.Ledger.Total()) {
			best = i
		}
	}
	return best, ReasonLeastLoad
}

// PowerOfTwoPicker samples two distinct candidates at random and takes the
// one with fewer requests in flight (Mitzenmacher, "The Power of Two
// Choices in Randomized Load Balancing", 2001; grpc-go's leastrequest with
// choiceCount 2). Ties go to the first drawn.
type PowerOfTwoPicker struct{ rand func() uint64 }

var _ Picker = (*PowerOfTwoPicker)(nil)

// Choose implements [Picker].
func (r *PowerOfTwoPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	n := uint64(len(p.Cands))
	if n == 1 {
		return 0, ReasonLeastLoad
	}
	a := int(r.rand() % n)
	b := int(r.rand() % (n - 1))
	if b >= a {
		b++
	}
	if p.Cands[b].InFlight < p.Cands[a].InFlight {
		return b, ReasonLeastLoad
	}
	return a, ReasonLeastLoad
}
