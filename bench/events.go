package bench

import (
	"container/heap"
	"time"
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

// loop runs events until every request is answered or refused; scrapes
// stop once nothing is left to do.
func (r *run) loop() {
	for r.q.Len() > 0 {
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
			if r.pending > 0 || len(r.flights)+r.queued+r.entering > 0 {
				r.pushScrape(e.rep, e.i)
			}
		}
		for i := range r.reps {
			r.admit(i)
		}
	}
	for _, rep := range r.reps {
		for _, f := range rep.waiting {
			f.ticket.Leave("timeout")
			r.res.Refused++
			r.drop(f.idx)
		}
		rep.waiting = nil
	}
	for i, d := range r.ttft {
		if d >= 0 {
			r.res.TTFT = append(r.res.TTFT, d)
			r.res.E2E = append(r.res.E2E, r.e2e[i])
		}
	}
	if len(r.w.Requests) > 0 {
		r.res.Duration = r.last
		if r.c.Clients <= 0 {
			r.res.Duration -= r.w.Requests[0].At
		}
	}
	for i, s := range r.servers {
		r.res.PerBackend[i] = s.served
		r.res.Preemptions += s.eng.Stats().Preemptions
	}
}
