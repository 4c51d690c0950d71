package balancer

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Admission errors, returned by [Balancer.PickWait].
var (
	// ErrQueueFull: every backend is saturated and the admission queue is
	// full (429 with Retry-After).
	ErrQueueFull = errors.New("every backend is saturated and the admission queue is full")
	// ErrQueueTimeout: the request waited the whole admission timeout (503).
	ErrQueueTimeout = errors.New("every backend stayed saturated for the admission timeout")
	// ErrShed: a sheddable request (negative priority) met saturation with
	// the queue filling ([AdmissionConfig.ShedAt]) (429).
	ErrShed = errors.New("every backend is saturated and the request is sheddable")
	// ErrEvicted: a sheddable request in flight was ended for a request
	// of higher priority that waited [AdmissionConfig.EvictAfter] (429).
	// It is the cause its work is cancelled with, never returned by a
	// pick.
	ErrEvicted = errors.New("a sheddable request was ended for a request of higher priority")
)

// ErrSaturated is returned by [Balancer.Pick] when every backend that could
// take the request is saturated and the admission queue is on:
// [Balancer.PickWait] then waits for capacity.
var ErrSaturated = errors.New("every backend is saturated")

// Fairness rules for the requests of one priority ([AdmissionConfig.Fairness]).
const (
	FairRoundRobin = "round-robin"
	FairTokens     = "tokens"
	FairOff        = "off"
)

// FairnessNames lists the fairness rules config may name.
func FairnessNames() []string { return []string{FairRoundRobin, FairTokens, FairOff} }

// Token weights of the tokens rule: a request costs its prompt tokens plus
// twice its output tokens, since each output token takes a decode step of
// its own while a prompt's tokens are prefilled together. These are the
// weights of AIBrix's VTC (vllm-project/aibrix,
// pkg/plugins/gateway/algorithms/vtc/vtc_basic.go at
// 0d536acf6984119e86b716cf4fbca07a44cafcf1: input 1, output 2), and of the
// VTC paper it follows (Sheng et al., "Fairness in Serving Large Language
// Models", OSDI 2024).
const (
	promptTokenWeight = 1
	outputTokenWeight = 2
)

// admission is the bounded queue of requests waiting for capacity. It has
// two tiers, as the Inference Extension's flow control has priority bands
// and, within a band, one queue per flow chosen by an inter-flow policy
// (kubernetes-sigs/gateway-api-inference-extension,
// pkg/epp/flowcontrol/framework/policies.go at
// 0e05556d3ffe8a641a0fc2aa22c21847dc35bd45): a band per priority, highest
// first, and in a band one FIFO queue per tenant ([Request.Tenant]), so
// that one tenant's burst does not hold the others' requests behind all of
// it. The head, the one waiter that may pick, is the first request of the
// tenant the fairness rule chooses in the highest band:
//
//   - round-robin: the band's waiting tenants take turns, one admission
//     each; a tenant that starts waiting joins the end of the round.
//   - tokens: the tenant with the least weighted tokens admitted from the
//     band goes next (a virtual token counter, as in VTC), ties in turn. A
//     tenant that starts waiting starts at the least counter among the
//     band's waiting tenants, or at its own if that is higher, so time
//     with nothing waiting banks no credit, and leaving the queue for a
//     moment forgives nothing.
//   - off: FIFO within the band; tenants are ignored.
//
// Only the head is woken when capacity may have freed (a request ended or
// started producing, a scrape arrived); it tries to pick, and when it
// leaves, the next head is woken, so capacity goes out in that order. A
// band's turn and counters last while it has waiters: fairness is among
// requests that contend, and an empty band starts afresh.
type admission struct {
	// immutable after newAdmission
	max       int
	fairness  string
	shedAt    float64
	outTokens int // output tokens assumed for a request without MaxTokens
	rand      func() uint64
	// evictAfter is how long a waiter of priority 0 or more waits before
	// each eviction; 0 is off.
	evictAfter time.Duration

	// ev is the sheddable requests in flight, for eviction; empty when it
	// is off.
	ev evictables

	mu    sync.Mutex
	bands []*band // guarded by mu; the bands with waiters, highest priority first
	n     int     // guarded by mu; waiters in all bands
	head  *waiter // guarded by mu; the waiter that may pick, nil when none waits

	// atomic
	length   atomic.Int64
	waitBits atomic.Uint64 // smoothed wait, seconds
	refused  sync.Map      // reason → *atomic.Int64
}

// band is the waiters of one priority. Guarded by admission.mu.
type band struct {
	prio  int
	flows []*flow          // the tenants with waiters, in turn order
	turn  int              // index in flows of the tenant whose turn it is
	byID  map[string]*flow // flows by tenant
	// spent keeps the counters of tenants that stopped waiting (tokens
	// rule), for when they come back; nil until one does.
	spent map[string]float64
}

// flow is one tenant's waiters in a band. Guarded by admission.mu.
type flow struct {
	tenant  string
	waiters []*waiter // earliest deadline first, then FIFO
	spent   float64   // tokens rule: weighted tokens admitted from the band
}

type waiter struct {
	prio   int
	tenant string
	due    time.Time     // when its TTFT deadline passes; zero: none
	cost   float64       // weighted tokens, for the tokens rule
	ch     chan struct{} // buffered 1: a wake-up is never lost or blocking
}

func newAdmission(cfg Config, rand func() uint64) *admission {
	return &admission{
		max:        cfg.Admission.MaxQueue,
		fairness:   cfg.Admission.Fairness,
		shedAt:     cfg.Admission.ShedAt,
		outTokens:  cfg.TTFT.DefaultMaxTokens,
		rand:       rand,
		evictAfter: cfg.Admission.EvictAfter,
	}
}

// enter queues a waiter for req at its place, or refuses it: a sheddable
// request as [admission.shedLocked] says, any when the queue is full.
// Within its tenant's queue a request with a TTFT deadline goes before
// those whose deadline is later or who have none: earliest deadline
// first, after the tenants' fairness, so that no tenant's deadlines jump
// another's turn; requests without one keep their order, after all that
// have one.
func (a *admission) enter(req *Request, now time.Time) (*waiter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if req.Priority < 0 && a.shedLocked() {
		a.refuseLocked("shed")
		return nil, ErrShed
	}
	if a.n >= a.max {
		a.refuseLocked("queue-full")
		return nil, ErrQueueFull
	}
	w := &waiter{prio: req.Priority, ch: make(chan struct{}, 1)}
	if left, ok := req.left(now); ok {
		w.due = now.Add(left)
	}
	if a.fairness != FairOff {
		w.tenant = req.Tenant
	}
	if a.fairness == FairTokens {
		out := req.MaxTokens
		if out <= 0 {
			out = a.outTokens
		}
		w.cost = promptTokenWeight*float64(max(req.PromptTokens, 0)) + outputTokenWeight*float64(out)
	}
	b := a.bandLocked(w.prio)
	f := b.byID[w.tenant]
	if f == nil {
		f = &flow{tenant: w.tenant}
		if a.fairness == FairTokens {
			f.spent = b.floor()
			if s, ok := b.spent[w.tenant]; ok {
				f.spent = max(f.spent, s)
				delete(b.spent, w.tenant)
			}
		}
		// The end of the round is just before the tenant whose turn it is.
		b.flows = slices.Insert(b.flows, b.turn, f)
		if len(b.flows) > 1 {
			b.turn++
		}
		b.byID[w.tenant] = f
	}
	at := len(f.waiters)
	if !w.due.IsZero() {
		at = slices.IndexFunc(f.waiters, func(o *waiter) bool { return o.due.IsZero() || o.due.After(w.due) })
		if at < 0 {
			at = len(f.waiters)
		}
	}
	f.waiters = slices.Insert(f.waiters, at, w)
	a.n++
	a.length.Store(int64(a.n))
	a.setHeadLocked() // a new head tries at once
	return w, nil
}

// shedLocked reports whether a sheddable request that met saturation is
// refused at the queue's present length n: with L = ShedAt × MaxQueue, it
// is refused with probability n/L, and always once n ≥ L. Sheddable
// traffic thins as the queue fills, as in RED, and holds at most that
// share of the queue, which stays for the rest; L = 0 refuses it at once.
// The caller must hold mu.
func (a *admission) shedLocked() bool {
	limit := a.shedAt * float64(a.max)
	n := float64(a.n)
	if n >= limit {
		return true
	}
	u := float64(a.rand()>>11) * 0x1p-53 // uniform in [0, 1)
	return u*limit < n
}

// bandLocked returns the band of priority prio, made if none waits at it.
// The caller must hold mu.
func (a *admission) bandLocked(prio int) *band {
	i, found := slices.BinarySearchFunc(a.bands, prio, func(b *band, p int) int { return p - b.prio })
	if !found {
		a.bands = slices.Insert(a.bands, i, &band{prio: prio, byID: map[string]*flow{}})
	}
	return a.bands[i]
}

// leave removes w, served (picked) or given up, and wakes the next head.
// A served waiter ends its tenant's turn and, under the tokens rule, adds
// its cost to the tenant's counter; one that gives up leaves the turn where
// it was.
func (a *admission) leave(w *waiter, served bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	bi := slices.IndexFunc(a.bands, func(b *band) bool { return b.prio == w.prio })
	if bi < 0 {
		return
	}
	b := a.bands[bi]
	f := b.byID[w.tenant]
	wi := -1
	if f != nil {
		wi = slices.Index(f.waiters, w)
	}
	if wi < 0 {
		return
	}
	f.waiters = slices.Delete(f.waiters, wi, wi+1)
	a.n--
	a.length.Store(int64(a.n))
	fi := slices.Index(b.flows, f)
	if served {
		f.spent += w.cost
		b.turn = fi + 1
	}
	if len(f.waiters) == 0 {
		b.flows = slices.Delete(b.flows, fi, fi+1)
		delete(b.byID, f.tenant)
		if b.turn > fi {
			b.turn--
		}
		if len(b.flows) == 0 {
			a.bands = slices.Delete(a.bands, bi, bi+1)
		} else if a.fairness == FairTokens && f.spent > b.floor() {
			a.rememberLocked(b, f)
		}
	}
	if len(b.flows) > 0 {
		b.turn %= len(b.flows)
	}
	a.setHeadLocked()
}

// rememberLocked keeps the counter of f, whose tenant stopped waiting in
// b, for when it comes back. The kept counters are bounded by MaxQueue: a
// counter at or below the band's floor is dropped, since a returning
// tenant starts there anyway, and past the bound the lowest half go. A
// tenant was served only while its counter was the floor, so a dropped
// counter forgives at most one request's cost. The caller must hold mu.
func (a *admission) rememberLocked(b *band, f *flow) {
	if b.spent == nil {
		b.spent = map[string]float64{}
	}
	b.spent[f.tenant] = f.spent
	if len(b.spent) <= a.max {
		return
	}
	floor := b.floor()
	maps.DeleteFunc(b.spent, func(_ string, s float64) bool { return s <= floor })
	if len(b.spent) <= a.max {
		return
	}
	ids := slices.SortedFunc(maps.Keys(b.spent), func(x, y string) int {
		return cmp.Or(cmp.Compare(b.spent[x], b.spent[y]), strings.Compare(x, y))
	})
	for _, id := range ids[:len(ids)-a.max/2] {
		delete(b.spent, id)
	}
}

// floor returns the least counter among b's waiting tenants, 0 when none
// waits.
func (b *band) floor() float64 {
	if len(b.flows) == 0 {
		return 0
	}
	m := b.flows[0].spent
	for _, f := range b.flows[1:] {
		m = min(m, f.spent)
	}
	return m
}

// next returns the index in b.flows of the tenant served next under rule
// fairness.
func (b *band) next(fairness string) int {
	if fairness != FairTokens {
		return b.turn
	}
	best := b.turn
	for i := 1; i < len(b.flows); i++ {
		j := (b.turn + i) % len(b.flows)
		if b.flows[j].spent < b.flows[best].spent {
			best = j
		}
	}
	return best
}

// setHeadLocked finds the head and wakes it if it changed. The caller
// must hold mu.
func (a *admission) setHeadLocked() {
	var h *waiter
	if len(a.bands) > 0 {
		b := a.bands[0]
		h = b.flows[b.next(a.fairness)].waiters[0]
	}
	if h != a.head {
		a.head = h
		if h != nil {
			wake(h)
		}
	}
}

// isHead reports whether w is first in line.
func (a *admission) isHead(w *waiter) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.head == w
}

// notify wakes the head, if any: capacity may have freed.
func (a *admission) notify() {
	if a.length.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.head != nil {
		wake(a.head)
	}
}

func wake(w *waiter) {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

func (a *admission) observeWait(d time.Duration) {
	s := d.Seconds()
	old := math.Float64frombits(a.waitBits.Load())
	if old != 0 {
		s = old + 0.2*(s-old)
	}
	a.waitBits.Store(math.Float64bits(s))
}

func (a *admission) refuse(reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refuseLocked(reason)
}

func (a *admission) refuseLocked(reason string) {
	v, _ := a.refused.LoadOrStore(reason, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// QueueLen returns how many requests wait in the admission queue.
func (b *Balancer) QueueLen() int { return int(b.adm.length.Load()) }

// Refusals returns how many requests the admission queue turned away, by
// reason: queue-full, timeout, shed, cancelled.
func (b *Balancer) Refusals() map[string]int64 {
	out := map[string]int64{}
	b.adm.refused.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// RetryAfter suggests when a refused client should try again: the recent
// mean admission wait, at least one second.
func (b *Balancer) RetryAfter() time.Duration {
	s := math.Float64frombits(b.adm.waitBits.Load())
	return max(time.Second, time.Duration(math.Ceil(s))*time.Second)
}

// PickWait is Pick that waits in the admission queue while every backend
// is saturated, for at most the admission timeout or until ctx ends: by
// priority, then by tenant as [AdmissionConfig.Fairness] says, then by
// TTFT deadline, earliest first, then FIFO.
// A sheddable request (negative priority) may be refused with [ErrShed] as
// the queue fills ([AdmissionConfig.ShedAt]); a full queue gives
// [ErrQueueFull]; the timeout [ErrQueueTimeout]. With
// [AdmissionConfig.EvictAfter] set, a request of priority 0 or more ends a
// sheddable request in flight each time it has waited that long
// ([Ticket.Evict]).
func (b *Balancer) PickWait(ctx context.Context, req *Request, dst []*Backend) (Decision, error) {
	dec, err := b.Pick(req, dst)
	if !errors.Is(err, ErrSaturated) {
		return dec, err
	}
	t, err := b.Enqueue(req)
	if err != nil {
		return dec, err
	}
	timer := time.NewTimer(b.cfg.Admission.Timeout)
	defer timer.Stop()
	// A request that may evict does so each time it has waited
	// EvictAfter more: at most once a period, so that one that a
	// freed place did not reach (the head took it, or the backend's
	// queue did) does not empty the fleet of sheddable work at once.
	var evict *time.Timer
	var evictC <-chan time.Time // nil: never
	if t.mayEvict() {
		evict = time.NewTimer(b.adm.evictAfter)
		defer evict.Stop()
		evictC = evict.C
	}
	for {
		select {
		case <-t.w.ch:
		case <-ctx.Done():
			t.Leave("cancelled")
			return dec, ctx.Err()
		case <-timer.C:
			t.Leave("timeout")
			return dec, ErrQueueTimeout
		case <-evictC:
			t.Evict()
			evict.Reset(b.adm.evictAfter)
			continue // the evicted request's release wakes the head
		}
		dec, err = t.Pick(dst)
		if !errors.Is(err, ErrSaturated) {
			return dec, err
		}
	}
}

// Ticket is a request's place in the admission queue. [Balancer.PickWait]
// waits on one in real time; a driver with its own clock (the routing
// benchmark's virtual time) calls [Ticket.Pick] as capacity may free and
// [Ticket.Leave] when its timeout passes. A Ticket is used by one
// goroutine.
type Ticket struct {
	b     *Balancer
	w     *waiter
	req   *Request
	since time.Time
	done  bool
}

// Enqueue puts req, which [Balancer.Pick] found saturated, in the admission
// queue. A sheddable request may be refused with [ErrShed] (more likely as
// the queue fills: [AdmissionConfig.ShedAt]), and any with [ErrQueueFull]
// when the queue is full.
func (b *Balancer) Enqueue(req *Request) (*Ticket, error) {
	w, err := b.adm.enter(req, b.now())
	if err != nil {
		return nil, err
	}
	return &Ticket{b: b, w: w, req: req, since: b.now()}, nil
}

// Pick picks for the ticket's request if it is first in line and a
// backend has room; it returns [ErrSaturated] otherwise, and the ticket
// keeps its place. Any other outcome leaves the queue, with the decision's
// Waited set.
func (t *Ticket) Pick(dst []*Backend) (Decision, error) {
	if t.done || !t.b.adm.isHead(t.w) {
		return Decision{}, ErrSaturated
	}
	dec, err := t.b.Pick(t.req, dst)
	if errors.Is(err, ErrSaturated) {
		return dec, err
	}
	t.done = true
	t.b.adm.leave(t.w, err == nil)
	dec.Waited = t.b.now().Sub(t.since)
	t.b.adm.observeWait(dec.Waited)
	return dec, err
}

// Leave gives up the ticket's place; reason ("timeout", "cancelled") is
// counted among [Balancer.Refusals].
func (t *Ticket) Leave(reason string) {
	if t.done {
		return
	}
	t.done = true
	t.b.adm.leave(t.w, false)
	t.b.adm.refuse(reason)
}

// mayEvict reports whether the ticket's request may evict: eviction is on
// and the request is not sheddable itself.
func (t *Ticket) mayEvict() bool {
	return t.b.adm.evictAfter > 0 && t.req.Priority >= 0
}

// Evict ends one sheddable request in flight for the ticket's request,
// which has waited [AdmissionConfig.EvictAfter] (once more), and reports
// whether there was one to end: the one [evictables.take] chooses. Only a
// request of priority 0 or more that still waits evicts. Its place goes
// to the head of the queue, woken when the evicted request's guard is
// released. [Balancer.PickWait] calls it each time its request has waited
// EvictAfter more; a driver with its own clock does the same.
func (t *Ticket) Evict() bool {
	if t.done || !t.mayEvict() {
		return false
	}
	v := t.b.adm.ev.take(t.req)
	if v == nil {
		return false
	}
	v.evict()
	return true
}

// Evictable registers req, a sheddable request (negative priority) just
// picked with its Guard, as one eviction may end ([AdmissionConfig.EvictAfter]).
// evict must end the request's work at once without blocking (cancel its
// context with [ErrEvicted]); it is called at most once, from the evicting
// request's goroutine. done deregisters the request and must be called
// when it ends, on every path; an evict already under way may still run.
// A request that is not sheddable, has no Guard, or meets eviction off is
// not registered, and done does nothing. Safe for concurrent use.
func (b *Balancer) Evictable(req *Request, evict func()) (done func()) {
	if b.adm.evictAfter <= 0 || req.Priority >= 0 || req.Guard == nil || evict == nil {
		return func() {}
	}
	return b.adm.ev.add(&evictable{prio: req.Priority, guard: req.Guard, evict: evict})
}

// evictables is the sheddable requests in flight that eviction may end, in
// the order they were picked, newest last. Safe for concurrent use.
//
// The rule follows llm-d's in-flight eviction (llm-d/llm-d-router,
// docs/flow-control-eviction.md at
// 88d2b9dd9e454c003c76f83105330a2e1a194a24, from PR #2093): only
// negative priorities are revocable, lowest priority first and the newest
// first among equals, since it has the least work done and the fewest
// tokens delivered to throw away; the evicted client gets an error it may
// retry (429) and llmlb retries nothing. Where llm-d sizes each round of
// evictions from the pool's saturation gauge and waits for the last
// round's confirmations, llmlb's trigger is one waiter's wait: a request
// that waited EvictAfter ends one request, on a backend that could serve
// it, and no more until it has waited EvictAfter again.
type evictables struct {
	mu   sync.Mutex
	list []*evictable // guarded by mu; oldest first
}

// evictable is one sheddable request in flight. Immutable.
type evictable struct {
	prio  int
	guard *Guard // where the request is now: Guard.Backend
	evict func()
}

// add registers v and returns the function that deregisters it.
func (e *evictables) add(v *evictable) (done func()) {
	e.mu.Lock()
	e.list = append(e.list, v)
	e.mu.Unlock()
	return func() { e.remove(v) }
}

// remove drops v if it is still listed.
func (e *evictables) remove(v *evictable) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if i := slices.Index(e.list, v); i >= 0 {
		e.list = slices.Delete(e.list, i, i+1)
	}
}

// take removes and returns the request to evict for req: of those of
// lower priority than req's whose backend could serve req, the lowest
// priority, newest first; nil if there is none. A request between two
// backends (its guard attached to none) is passed over.
func (e *evictables) take(req *Request) *evictable {
	e.mu.Lock()
	defer e.mu.Unlock()
	best := -1
	for i := len(e.list) - 1; i >= 0; i-- {
		v := e.list[i]
		if v.prio >= req.Priority || best >= 0 && v.prio >= e.list[best].prio {
			continue
		}
		if couldServe(v.guard.Backend(), req) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	v := e.list[best]
	e.list = slices.Delete(e.list, best, best+1)
	return v
}

// couldServe reports whether be is one of the backends a pick for req
// may choose, whatever its load and health: it serves the model in the
// role asked, and is neither avoided nor other than the holder.
func couldServe(be *Backend, req *Request) bool {
	return be != nil && be.Serves(req.Model) && be.Role.takes(req.Role) &&
		(req.Avoid == "" || be.ID != req.Avoid) && (req.Holder == "" || be.ID == req.Holder)
}
