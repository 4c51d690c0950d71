package scrape

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// handlerTransport serves requests with an in-process handler, so a whole
// target runs inside a synctest bubble; down makes it fail like a server
// that does not answer, refused like one whose process died.
type handlerTransport struct {
	h        http.Handler
	down     atomic.Bool
	refused  atomic.Bool
	genFails atomic.Bool // completions answer 500 while health answers
}

func (ht *handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if ht.down.Load() {
		return nil, errors.New("dial tcp: i/o timeout")
	}
	if ht.refused.Load() {
		// What net.Dialer returns when nothing listens.
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	if ht.genFails.Load() && req.URL.Path == "/v1/completions" {
		rec := httptest.NewRecorder()
		rec.WriteHeader(http.StatusInternalServerError)
		return rec.Result(), nil
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
		case "/v1/completions":
			io.WriteString(w, "data: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: [DONE]\n\n")
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

// advance moves the bubble's fake clock on by d and returns once every
// goroutine in the bubble has done what that time let it do. Call it only
// from the bubble's root goroutine. It is the scrape tests' one
// time.Sleep: inside a synctest bubble, virtual time.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
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
		advance(150 * time.Millisecond) // one jittered interval (90-110ms) and then some
		if q := backend(bal).Metrics.Queued; q != balancer.Known(7) {
			t.Fatalf("queued = %v after an interval, want 7", q)
		}
		tr.down.Store(true)
		advance(time.Second)
		if be := backend(bal); be.Stale || be.Metrics.Queued != balancer.Known(7) {
			t.Fatalf("1s without answers: stale %v queued %v, want the last reading, fresh", be.Stale, be.Metrics.Queued)
		}
		advance(1200 * time.Millisecond)
		if !backend(bal).Stale {
			t.Fatal("metrics older than stale_after are not stale")
		}
		tr.down.Store(false)
		advance(150 * time.Millisecond)
		if backend(bal).Stale {
			t.Fatal("fresh reading did not clear staleness")
		}
		page.Store("vllm:num_requests_waiting{{{ garbage\n")
		advance(150 * time.Millisecond)
		if !backend(bal).Stale {
			t.Fatal("an unreadable page did not mark the metrics stale at once")
		}
	})
}

// TestRefusedScrapeMarksStaleAtOnce: a scrape whose connection is refused
// (the server's process died) makes the backend's metrics stale at once,
// not after stale_after: its last reading says it is idle, and fresh it
// drew the picks while the live servers looked saturated (issue 53). A
// reading once the server listens again makes them fresh.
func TestRefusedScrapeMarksStaleAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var queue atomic.Int64
		var page atomic.Value
		tr := &handlerTransport{h: fakeVLLM(&queue, &page)}
		bal, cancel := bubbleTarget(t, tr)
		defer cancel()
		synctest.Wait()
		if backend(bal).Stale {
			t.Fatal("stale after the first scrape")
		}
		tr.refused.Store(true)
		advance(150 * time.Millisecond) // one jittered interval (90-110ms) and then some
		if !backend(bal).Stale {
			t.Fatal("a refused scrape left the last reading fresh, want stale at once")
		}
		tr.refused.Store(false)
		advance(150 * time.Millisecond)
		if backend(bal).Stale {
			t.Fatal("a reading after the refusal did not clear staleness")
		}
	})
}

// TestEjectedBackendReadmittedAfterBackoff: the balancer ejects a backend
// at its fifth failure in a row; scrape's loop readmits it within a scrape
// interval of its ejection time, though its health check answered all
// along (issue 17); a second ejection in a row lasts twice as long; a
// readmitted backend is on probation, one failure ejecting it again; and
// one whose health check fails, or whose completions fail while its health
// check answers, when its time is over stays out until it answers both.
func TestEjectedBackendReadmittedAfterBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var queue atomic.Int64
		var page atomic.Value
		tr := &handlerTransport{h: fakeVLLM(&queue, &page)}
		bal, cancel := bubbleTarget(t, tr)
		defer cancel()
		synctest.Wait()
		fail := func(n int) {
			for range n {
				bal.Failed(backend(bal), balancer.FailStatus)
			}
		}
		out := func(wantFor time.Duration) {
			t.Helper()
			ejectedAt := time.Now()
			if !backend(bal).Ledger.Ejected() {
				t.Fatal("not ejected")
			}
			for backend(bal).Ledger.Ejected() {
				advance(10 * time.Millisecond)
			}
			took := time.Since(ejectedAt)
			if took < wantFor || took > wantFor+120*time.Millisecond {
				t.Errorf("ejected for %s, want %s and at most a scrape interval more", took, wantFor)
			}
		}
		fail(4)
		if backend(bal).Ledger.Ejected() {
			t.Fatal("ejected after 4 failures, want 5")
		}
		fail(1)
		out(time.Second)
		fail(1) // on probation
		out(2 * time.Second)
		bal.Succeeded(backend(bal))
		fail(4)
		if backend(bal).Ledger.Ejected() {
			t.Fatal("a success did not end probation")
		}
		fail(1)
		tr.down.Store(true)
		advance(4*time.Second + 200*time.Millisecond)
		if !backend(bal).Ledger.Ejected() {
			t.Fatal("readmitted while its health check fails")
		}
		tr.down.Store(false)
		tr.genFails.Store(true)
		advance(8*time.Second + 200*time.Millisecond)
		if !backend(bal).Ledger.Ejected() {
			t.Fatal("readmitted while its health check answers but its completions fail")
		}
		tr.genFails.Store(false)
		for backend(bal).Ledger.Ejected() {
			advance(10 * time.Millisecond)
		}
		if e := backend(bal).Ledger.Ejection(); e.Total != 3 {
			t.Errorf("ejections = %d, want 3", e.Total)
		}
	})
}
