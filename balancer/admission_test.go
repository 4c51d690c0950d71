package balancer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// admissionBal is one saturated backend ("a", queue 20) and the queue on.
func admissionBal(t *testing.T, maxQueue int, timeout time.Duration) *Balancer {
	b := newBal(t, "ttft", func(c *Config, _ *Deps) {
		c.Admission.MaxQueue = maxQueue
		c.Admission.Timeout = timeout
	})
	b.Update(ready("a", 20, 4, 0.5))
	return b
}

func TestAdmissionQueueDrainsInPriorityOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := admissionBal(t, 10, time.Minute)
		ctx := context.Background()
		hold := make(chan struct{})
		defer close(hold)
		var order []int
		done := make(chan int, 4)
		for i, prio := range []int{0, 5, 0, 1} {
			go func() {
				// The guard is attached inside the pick, as the proxy
				// does: attaching after PickWait returned let the next
				// head, woken as this one left the queue, see the slot
				// still free and overtake in the done channel.
				g := b.NewGuard()
				d, err := b.PickWait(ctx, &Request{Model: "m", Priority: prio, Guard: g}, nil)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
				if d.Waited <= 0 {
					t.Errorf("waiter %d waited %v", i, d.Waited)
				}
				done <- i
				// Hold the slot: the test frees capacity by scrapes.
				<-hold
				g.Release()
			}()
			synctest.Wait()
		}
		if b.QueueLen() != 4 {
			t.Fatalf("queue length %d, want 4", b.QueueLen())
		}
		// Each scrape shows room for exactly one more request.
		for len(order) < 4 {
			time.Sleep(time.Millisecond) // inside the synctest bubble, virtual time: the next scrape has a new reading time
			b.Update(ready("a", 15, 4, 0.5))
			synctest.Wait()
			select {
			case i := <-done:
				order = append(order, i)
			default:
				t.Fatalf("no waiter served after capacity freed (order so far %v)", order)
			}
			b.Update(ready("a", 20, 4, 0.5))
		}
		if fmt.Sprint(order) != "[1 3 0 2]" {
			t.Errorf("served in order %v, want [1 3 0 2] (priority 5, 1, then FIFO among 0)", order)
		}
	})
}

func TestAdmissionRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := admissionBal(t, 1, 5*time.Second)
		errc := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			_, err := b.PickWait(ctx, &Request{Model: "m"}, nil)
			errc <- err
		}()
		synctest.Wait()
		if _, err := b.PickWait(context.Background(), &Request{Model: "m"}, nil); !errors.Is(err, ErrQueueFull) {
			t.Errorf("second waiter: %v, want ErrQueueFull", err)
		}
		if _, err := b.PickWait(context.Background(), &Request{Model: "m", Priority: -1}, nil); !errors.Is(err, ErrShed) {
			t.Errorf("sheddable: %v, want ErrShed", err)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: %v", err)
		}
		if b.QueueLen() != 0 {
			t.Errorf("cancelled waiter still queued: %d", b.QueueLen())
		}
		start := time.Now()
		if _, err := b.PickWait(context.Background(), &Request{Model: "m"}, nil); !errors.Is(err, ErrQueueTimeout) {
			t.Errorf("deadline: %v, want ErrQueueTimeout", err)
		}
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("timed out after %v, want 5s", waited)
		}
		r := b.Refusals()
		if r["queue-full"] != 1 || r["shed"] != 1 || r["cancelled"] != 1 || r["timeout"] != 1 {
			t.Errorf("refusals %v", r)
		}
	})
}
