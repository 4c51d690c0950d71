package bench

import (
	"container/heap"
	"math"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// event kinds
const (
	evArrival = iota
	evStep
	evScrape
	evEnter
	evTokenized   // a request's tokens are back; its pick comes now
	evKV          // server i's KV events reach the balancers
	evTransferred // a disaggregated request's KV cache reached its decode server
	evShare       // the replicas share their ledgers ([Cluster.SharedLedger])
)

type event struct {
	at   time.Duration
	kind int
	i    int     // request index or server index
	rep  int     // replica, for scrapes
	f    *flight // for evEnter, evTokenized and evTransferred
	gen  uint64  // for evStep: the server's step it is
	seq  uint64  // insertion order, to break ties deterministically
}

type events []event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (r *run) push(e event) {
	r.nseq++
	e.seq = r.nseq
	heap.Push(&r.q, e)
}

func (r *run) pushScrape(rep, i int) {
	j := 0.9 + 0.2*r.rng.Float64()
	r.push(event{at: r.now + time.Duration(float64(r.reps[rep].scrape)*j), kind: evScrape, i: i, rep: rep})
}

// busy reports whether arrivals are still to come or requests are still
// queued, on their way or in flight: until then the periodic events
// (scrapes, shared-ledger ticks) go on.
func (r *run) busy() bool {
	return r.pending > 0 || len(r.flights)+r.queued+r.entering > 0
}

// share is one tick of the shared ledger: each replica's own load on each
// server is read, then every replica's ledger for the server is set to
// the sum of the others', as each replica would read what the others
// last published.
func (r *run) share() {
	for _, rep := range r.reps {
		for i, l := range rep.ledgers {
			rep.own[i] = l.Own()
		}
	}
	for k, rep := range r.reps {
		for i, l := range rep.ledgers {
			var peers balancer.Load
			for j, o := range r.reps {
				if j != k {
					peers = peers.Add(o.own[i])
				}
			}
			l.SetPeers(peers)
		}
	}
}

// loop runs events until every request is answered or refused; scrapes
// stop once nothing is left to do.
func (r *run) loop() {
	r.advance(math.MaxInt64)
	r.finish()
}

// gaveUp counts the requests that had no first token by their arrival
// plus the give-up TTFT (served late, or not at all) and reports whether
// they are enough to give up ([Cluster.GiveUp]).
func (r *run) gaveUp() bool {
	g := r.c.GiveUp
	for ; r.scanned < len(r.w.Requests) && r.w.Requests[r.scanned].At+g.TTFT < r.now; r.scanned++ {
		if d := r.ttft[r.scanned]; d < 0 || d > g.TTFT {
			r.late++
		}
	}
	r.res.GaveUp = r.late >= g.Late
	return r.res.GaveUp
}

// advance runs the events due at or before until, in order.
func (r *run) advance(until time.Duration) {
	for r.q.Len() > 0 && r.q[0].at <= until {
		if r.c.GiveUp.TTFT > 0 && r.gaveUp() {
			return
		}
		e := heap.Pop(&r.q).(event)
		r.now = e.at
		switch e.kind {
		case evArrival:
			r.pending--
			r.arrive(e.i)
		case evEnter:
			r.entering--
			r.enter(e.f)
		case evTokenized:
			r.entering--
			r.dispatch(e.f)
		case evTransferred:
			r.entering--
			r.transferred(e.f)
		case evKV:
			r.deliverKV(e.i)
		case evStep:
			if e.gen == r.servers[e.i].gen { // else an eager engine was stepped since
				r.step(e.i)
			}
		case evScrape:
			r.scrapeServer(e.rep, e.i)
			if r.busy() {
				r.pushScrape(e.rep, e.i)
			}
		case evShare:
			r.share()
			if r.busy() {
				r.push(event{at: r.now + r.c.SharedLedger, kind: evShare})
			}
		}
		for i := range r.reps {
			r.admit(i)
		}
	}
}

// finish refuses what is left in the admission queues and gathers the
// run's results.
func (r *run) finish() {
	for _, rep := range r.reps {
		for _, f := range rep.waiting {
			f.ticket.Leave("timeout")
			r.res.Refused++
			r.drop(f.idx)
		}
		rep.waiting = nil
	}
	r.res.SLO, r.res.OwnTargets = r.c.SLO, r.w.OwnTargets()
	for i, d := range r.ttft {
		if d >= 0 {
			r.res.TTFT = append(r.res.TTFT, d)
			r.res.E2E = append(r.res.E2E, r.e2e[i])
			slo := r.c.SLO
			if r.res.OwnTargets {
				slo = r.w.Requests[i].SLO
			}
			if !r.res.judged() || r.e2e[i] < 0 || !slo.met(d, r.tpot[i]) {
				continue
			}
			r.res.Met++
			if r.w.Requests[i].SLO.set() {
				r.res.TargetedMet++
			}
		}
	}
	if len(r.w.Requests) > 0 {
		r.res.Duration = r.last
		if r.c.Clients <= 0 {
			r.res.Duration -= r.w.Requests[0].At
		}
	}
	if r.c.Pinned {
		r.res.ByRequest = make([]RequestTimes, len(r.ttft))
		for i, d := range r.ttft {
			r.res.ByRequest[i] = RequestTimes{TTFT: d, TPOT: r.tpot[i]}
		}
	}
	for i, s := range r.servers {
		r.res.PerBackend[i] = s.served
		r.res.Preemptions += s.eng.Stats().Preemptions
	}
}
