package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// backendOf returns the snapshot entry of the backend at u.
func backendOf(t *testing.T, bal *balancer.Balancer, u string) *balancer.Backend {
	t.Helper()
	for _, be := range bal.Snapshot().Backends {
		if be.ID == u {
			return be
		}
	}
	t.Fatalf("no backend %s", u)
	return nil
}

// preferFirst makes every backend but first look busier, so the
// least-request pick tries first before them.
func preferFirst(t *testing.T, bal *balancer.Balancer, first string) {
	for _, be := range bal.Snapshot().Backends {
		if be.ID != first {
			g := balancer.NewGuard()
			g.Attach(be, balancer.Work{}, time.Now())
			t.Cleanup(g.Release)
		}
	}
}

// TestOverloadedAnswerGoesElsewhere: a 429 before the first byte sends the
// request to the next backend, whatever retry_statuses says, and counts
// against the backend that sent it (issue 17).
func TestOverloadedAnswerGoesElsewhere(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusTooManyRequests)
	}))
	defer busy.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer good.Close()
	cfg := DefaultConfig()
	cfg.RetryStatuses = nil
	f := newFront(t, cfg, busy.URL, good.URL)
	preferFirst(t, f.bal, busy.URL)
	resp, err := http.Post(f.URL+"/v1/completions", "application/json", strings.NewReader(body("completion", "")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d, want 200 from the second backend", resp.StatusCode)
	}
	if got := backendOf(t, f.bal, busy.URL).Ledger.FailureStreak(); got != 1 {
		t.Errorf("the 429 backend's failure streak = %d, want 1", got)
	}

	// With nowhere else to go, the client gets the 429 as sent.
	only := newFront(t, cfg, busy.URL)
	resp, err = http.Post(only.URL+"/v1/completions", "application/json", strings.NewReader(body("completion", "")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("single 429 backend: status %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestStreamEndJudgesTheBackend: a stream cut by the backend after its
// first event counts as a failure, however good its headers; a whole one
// ends the failure streak; a client that leaves says nothing of the
// backend. Before issue 17 the headers counted as a success, so a server
// that died mid-stream every time was never ejected.
func TestStreamEndJudgesTheBackend(t *testing.T) {
	cut := make(chan bool, 1)
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case c := <-cut:
			if c {
				panic(http.ErrAbortHandler)
			}
		case <-r.Context().Done():
			return
		case <-hold:
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	defer close(hold)
	f := newFront(t, DefaultConfig(), srv.URL)
	be := backendOf(t, f.bal, srv.URL)
	stream := func() {
		resp, err := http.Post(f.URL+"/v1/completions", "application/json", strings.NewReader(body("completion", `,"stream":true`)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
	}
	for i := range 3 {
		cut <- true
		stream()
		if got := be.Ledger.FailureStreak(); got != int64(i+1) {
			t.Fatalf("after %d cut streams: failure streak %d, want %d", i+1, got, i+1)
		}
	}
	cut <- false
	stream()
	if got := be.Ledger.FailureStreak(); got != 0 {
		t.Errorf("after a whole stream: failure streak %d, want 0", got)
	}
	for range 5 {
		cut <- true
		stream()
	}
	if !be.Ledger.Ejected() {
		t.Errorf("not ejected after 5 streams cut in a row")
	}

	// A client that leaves mid-stream is not the backend's failure.
	f2 := newFront(t, DefaultConfig(), srv.URL)
	be2 := backendOf(t, f2.bal, srv.URL)
	resp, err := http.Post(f2.URL+"/v1/completions", "application/json", strings.NewReader(body("completion", `,"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	_, _ = resp.Body.Read(buf)
	resp.Body.Close()
	f2.waitHandler(t, 1)
	if got := be2.Ledger.FailureStreak(); got != 0 {
		t.Errorf("a client that left counted against the backend: streak %d", got)
	}
	if got := be2.Ledger.InFlight(); got != 0 {
		t.Errorf("in flight %d after the client left, want 0", got)
	}
}
