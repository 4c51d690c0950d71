package balancer

import (
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
