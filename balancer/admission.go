package balancer

import (
	"context"
	"errors"
	"math"
	"slices"
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
	// ErrShed: a sheddable request (negative priority) met saturation (429).
	ErrShed = errors.New("every backend is saturated and the request is sheddable")
)

// ErrSaturated is returned by [Balancer.Pick] when every backend that could
// take the request is saturated and the admission queue is on:
// [Balancer.PickWait] then waits for capacity.
var ErrSaturated = errors.New("every backend is saturated")

// admission is the bounded queue of requests waiting for capacity: ordered
// by priority, highest first, FIFO within a priority. Only the head is
// woken when capacity may have freed (a request ended or started
// producing, a scrape arrived); it tries to pick, and when it leaves, the
// next head is woken, so capacity goes out in priority order.
type admission struct {
	max int

	mu      sync.Mutex
	waiters []*waiter // guarded by mu; sorted by (priority desc, seq asc)
	seq     uint64    // guarded by mu

	length   atomic.Int64
	waitBits atomic.Uint64 // smoothed wait, seconds
	refused  sync.Map      // reason → *atomic.Int64
}

type waiter struct {
	prio int
	seq  uint64
	ch   chan struct{} // buffered 1: a wake-up is never lost or blocking
}

func newAdmission(cfg AdmissionConfig) *admission {
	return &admission{max: cfg.MaxQueue}
}

// enter queues a waiter at its place, or refuses when the queue is full.
func (a *admission) enter(prio int) (*waiter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.waiters) >= a.max {
		a.refuseLocked("queue-full")
		return nil, ErrQueueFull
	}
	a.seq++
	w := &waiter{prio: prio, seq: a.seq, ch: make(chan struct{}, 1)}
	i, _ := slices.BinarySearchFunc(a.waiters, w, func(x, y *waiter) int {
		if x.prio != y.prio {
			return y.prio - x.prio
		}
		return int(x.seq - y.seq)
	})
	a.waiters = slices.Insert(a.waiters, i, w)
	a.length.Store(int64(len(a.waiters)))
	if i == 0 {
		wake(w) // a new head tries at once
	}
	return w, nil
}

// leave removes w, served or given up, and wakes the next head.
func (a *admission) leave(w *waiter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i := slices.Index(a.waiters, w); i >= 0 {
		a.waiters = slices.Delete(a.waiters, i, i+1)
	}
	a.length.Store(int64(len(a.waiters)))
	if len(a.waiters) > 0 {
		wake(a.waiters[0])
	}
}

// isHead reports whether w is first in line.
func (a *admission) isHead(w *waiter) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.waiters) > 0 && a.waiters[0] == w
}

// notify wakes the head, if any: capacity may have freed.
func (a *admission) notify() {
	if a.length.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.waiters) > 0 {
		wake(a.waiters[0])
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

// PickWait is Pick that waits in the admission queue, in priority order,
// while every backend is saturated, for at most the admission timeout or
// until ctx ends. A sheddable request (negative priority) is refused at
// once with [ErrShed]; a full queue gives [ErrQueueFull]; the timeout
// [ErrQueueTimeout].
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
	for {
		select {
		case <-t.w.ch:
		case <-ctx.Done():
			t.Leave("cancelled")
			return dec, ctx.Err()
		case <-timer.C:
			t.Leave("timeout")
			return dec, ErrQueueTimeout
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
// queue. A sheddable request is refused with [ErrShed], and a full queue
// with [ErrQueueFull].
func (b *Balancer) Enqueue(req *Request) (*Ticket, error) {
	if req.Priority < 0 {
		b.adm.refuse("shed")
		return nil, ErrShed
	}
	w, err := b.adm.enter(req.Priority)
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
	t.b.adm.leave(t.w)
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
	t.b.adm.leave(t.w)
	t.b.adm.refuse(reason)
}
