package balancer

import (
	"errors"
	"time"
)

// ErrDeadline: no backend's estimate meets a sheddable request's
// deadline, so it is refused at once rather than served late (429).
var ErrDeadline = errors.New("no backend can meet the sheddable request's deadline")

// left is the time left of req's TTFT deadline at now, and whether it has
// one.
func (r *Request) left(now time.Time) (time.Duration, bool) {
	if r.TTFTDeadline <= 0 {
		return 0, false
	}
	from := r.Arrived
	if from.IsZero() {
		return r.TTFTDeadline, true
	}
	return r.TTFTDeadline - now.Sub(from), true
}

// deadline applies a request's TTFT deadline to the scored candidates, by
// the estimates the policy wrote ([Candidate.FirstToken]; a policy that
// writes none leaves the pick alone): the candidates that miss it are dropped
// when some meet it, so that the policy chooses among those; when none
// does, the one that misses by least is returned (ReasonDeadline), or for
// a sheddable request [ErrDeadline]. It returns -1 when the policy goes on
// choosing, with total compacted as p.Cands is.
func (b *Balancer) deadline(p *PickInfo, total []float64, ex *Explanation) ([]float64, int, error) {
	left, ok := p.Req.left(b.now())
	if !ok {
		return total, -1, nil
	}
	meets, estimated, least := 0, false, 0
	for i := range p.Cands {
		c := &p.Cands[i]
		estimated = estimated || c.FirstToken() > 0
		if c.FirstToken() <= left.Seconds() {
			meets++
		}
		if c.FirstToken() < p.Cands[least].FirstToken() {
			least = i
		}
	}
	switch {
	case !estimated || meets == len(p.Cands):
		return total, -1, nil
	case meets == 0 && p.Req.Priority < 0:
		return total, -1, ErrDeadline
	case meets == 0:
		return total, least, nil
	}
	n := 0
	for i := range p.Cands {
		if p.Cands[i].FirstToken() <= left.Seconds() {
			p.Cands[n], total[n] = p.Cands[i], total[i]
			n++
		} else {
			ex.add(&p.Cands[i], total[i], "misses the deadline")
		}
	}
	p.Cands, total = p.Cands[:n], total[:n]
	return total, -1, nil
}
