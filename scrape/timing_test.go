package scrape

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// handlerTransport serves requests with an in-process handler, so a whole
// target runs inside a synctest bubble; down makes it refuse like a dead
// server.
type handlerTransport struct {
	h    http.Handler
	down atomic.Bool
}

func (ht *handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if ht.down.Load() {
		return nil, errors.New("connect: connection refused")
	}
	rec := httptest.NewRecorder()
	ht.h.ServeHTTP(rec, req)
	return rec.Result(), nil
}

// fakeVLLM answers health and a vLLM metrics page whose queue is *queue;
// page, when set, replaces the page.
func fakeVLLM(queue *atomic.Int64, page *atomic.Value) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/metrics":
			if p, _ := page.Load().(string); p != "" {
				io.WriteString(w, p)
				return
			}
			io.WriteString(w, "vllm:num_requests_waiting "+itoa(queue.Load())+"\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n")
		}
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func bubbleTarget(t *testing.T, tr *handlerTransport) (*balancer.Balancer, context.CancelFunc) {
	bal := testBalancer(t)
	cfg := DefaultConfig()
	m, err := NewManager(Setup{
		Config: cfg, Backends: []BackendConfig{{URL: "http://gpu-0:8000", Models: []string{"m"}}},
		DefaultEngine: "vllm", Balancer: bal, Client: &http.Client{Transport: tr},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	go m.Run(ctx)
	return bal, cancel
}

func backend(bal *balancer.Balancer) *balancer.Backend { return bal.Snapshot().Backends[0] }

// TestStaleness: readings arrive every interval; when the server stops
// answering, the last reading is kept until it is older than stale_after;
// a page that cannot be read marks the metrics stale at once.
func TestStaleness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var queue atomic.Int64
		var page atomic.Value
		tr := &handlerTransport{h: fakeVLLM(&queue, &page)}
		bal, cancel := bubbleTarget(t, tr)
		defer cancel()
		synctest.Wait()
		if be := backend(bal); be.Stale || be.Metrics.Queued != balancer.Known(0) {
			t.Fatalf("after the first scrape: stale %v queued %v", be.Stale, be.Metrics.Queued)
		}
		queue.Store(7)
		time.Sleep(150 * time.Millisecond) // one jittered interval (90-110ms) and then some
		synctest.Wait()
		if q := backend(bal).Metrics.Queued; q != balancer.Known(7) {
			t.Fatalf("queued = %v after an interval, want 7", q)
		}
		tr.down.Store(true)
		time.Sleep(time.Second)
		synctest.Wait()
		if be := backend(bal); be.Stale || be.Metrics.Queued != balancer.Known(7) {
			t.Fatalf("1s without answers: stale %v queued %v, want the last reading, fresh", be.Stale, be.Metrics.Queued)
		}
		time.Sleep(1200 * time.Millisecond)
		synctest.Wait()
		if !backend(bal).Stale {
			t.Fatal("metrics older than stale_after are not stale")
		}
		tr.down.Store(false)
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if backend(bal).Stale {
			t.Fatal("fresh reading did not clear staleness")
		}
		page.Store("vllm:num_requests_waiting{{{ garbage\n")
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if !backend(bal).Stale {
			t.Fatal("an unreadable page did not mark the metrics stale at once")
		}
	})
}

// TestPassiveEjectionBackoff: consecutive failed requests eject the backend
// within one scrape interval; it returns only after the backoff and a good
// health check; a second ejection in a row lasts twice as long.
func TestPassiveEjectionBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var queue atomic.Int64
		var page atomic.Value
		tr := &handlerTransport{h: fakeVLLM(&queue, &page)}
		bal, cancel := bubbleTarget(t, tr)
		defer cancel()
		synctest.Wait()
		fail := func() {
			l := backend(bal).Ledger
			for range 5 {
				l.ObserveFailure()
			}
		}
		eject := func(wantFor time.Duration) {
			t.Helper()
			fail()
			time.Sleep(110 * time.Millisecond)
			synctest.Wait()
			ejectedAt := time.Now()
			if be := backend(bal); be.State != balancer.StateDown {
				t.Fatalf("after 5 failures: %v, want down", be.State)
			}
			for backend(bal).State == balancer.StateDown {
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
			}
			took := time.Since(ejectedAt)
			if took < wantFor-110*time.Millisecond || took > wantFor+200*time.Millisecond {
				t.Errorf("ejected for %s, want about %s", took, wantFor)
			}
		}
		eject(time.Second)
		eject(2 * time.Second)
		// Four failures, then a success: no ejection.
		l := backend(bal).Ledger
		for range 4 {
			l.ObserveFailure()
		}
		l.ObserveSuccess()
		l.ObserveFailure()
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if s := backend(bal).State; s != balancer.StateReady {
			t.Errorf("failures broken by a success ejected the backend: %v", s)
		}
	})
}
