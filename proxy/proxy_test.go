package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
)

const testModel = "llama-3.1-8b"

// testFront is a proxy in front of test backends. handlerDone receives once
// per client request, after the proxy's handler has returned (and so after
// its guard was released), whatever the path.
type testFront struct {
	*httptest.Server
	bal         *balancer.Balancer
	px          *Server
	handlerDone chan struct{}
}

func newFront(t *testing.T, cfg Config, backendURLs ...string) *testFront {
	t.Helper()
	return newFrontOn(t, cfg, newTestBalancer(t, backendURLs...))
}

// newFrontOn is a proxy in front of bal's backends.
func newFrontOn(t *testing.T, cfg Config, bal *balancer.Balancer) *testFront {
	t.Helper()
	return newFrontOf(t, newServer(t, Options{Config: cfg, Balancer: bal, Registerer: prometheus.NewRegistry()}), bal)
}

// newFrontOf serves px, a proxy in front of bal's backends.
func newFrontOf(t *testing.T, px *Server, bal *balancer.Balancer) *testFront {
	t.Helper()
	h := px.Handler()
	done := make(chan struct{}, 1024)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return &testFront{Server: srv, bal: bal, px: px, handlerDone: done}
}

// metric returns the front's metrics.
func (f *testFront) metric(t *testing.T) *metrics {
	t.Helper()
	return f.px.metrics
}

// newServer is [New] for a test: an invalid o fails it.
func newServer(tb testing.TB, o Options) *Server {
	tb.Helper()
	s, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// newTestBalancer returns a balancer with each URL a ready backend serving
// testModel.
func newTestBalancer(tb testing.TB, backendURLs ...string) *balancer.Balancer {
	tb.Helper()
	return newTestBalancerCandidates(tb, 3, backendURLs...)
}

// newTestBalancerCandidates is newTestBalancer with picks of at most n
// candidates.
func newTestBalancerCandidates(tb testing.TB, n int, backendURLs ...string) *balancer.Balancer {
	tb.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Policy, cfg.MaxCandidates = "least-request", n
	bal, err := balancer.New(cfg, balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig()), Tree: prefix.NewTree(1 << 20)}, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	bal.Update(readySpecs(tb, backendURLs...)...)
	return bal
}

// readySpecs are ready vLLM backends at backendURLs serving testModel.
func readySpecs(tb testing.TB, backendURLs ...string) []balancer.Spec {
	tb.Helper()
	var specs []balancer.Spec
	for _, u := range backendURLs {
		pu, err := url.Parse(u)
		if err != nil {
			tb.Fatal(err)
		}
		specs = append(specs, balancer.Spec{ID: u, URL: pu, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady})
	}
	return specs
}

// waitHandler waits for n proxy handlers to return.
func (f *testFront) waitHandler(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-f.handlerDone:
		case <-time.After(10 * time.Second):
			t.Fatal("proxy handler did not return")
		}
	}
}

// name returns the name clients see of the backend at url, checking that
// it is not its address.
func (f *testFront) name(t *testing.T, url string) string {
	t.Helper()
	for _, be := range f.bal.Snapshot().Backends {
		if be.ID == url {
			if be.Name == "" || strings.Contains(be.Name, "127.0.0.1") {
				t.Fatalf("backend %s is named %q", url, be.Name)
			}
			return be.Name
		}
	}
	t.Fatalf("no backend %s", url)
	return ""
}

// checkLedgerZero fails if any backend still counts a request in flight.
func (f *testFront) checkLedgerZero(t *testing.T) {
	t.Helper()
	for _, be := range f.bal.Snapshot().Backends {
		if n := be.Ledger.InFlight(); n != 0 {
			t.Errorf("backend %s in flight = %d, want 0", be.ID, n)
		}
	}
}

// deadURL returns the URL of an address that refuses connections: bound,
// then closed (Caddy's deadUpstreamAddr).
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func body(kind, extra string) string {
	if kind == "chat" {
		return `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	return `{"model":"` + testModel + `","prompt":"hi"` + extra + `}`
}

func path(kind string) string {
	if kind == "chat" {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

func post(ctx context.Context, t *testing.T, url, b string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

// okBackend answers every request with a small JSON completion.
func okBackend(t *testing.T, hits *atomic.Int64) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits != nil {
			hits.Add(1)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestStreamEventsReachClientOneByOne: the backend writes an SSE event and
// then waits for the test, which must already have read that event through
// the proxy, for both streaming endpoints.
func TestStreamEventsReachClientOneByOne(t *testing.T) {
	for _, kind := range []string{"completions", "chat"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			next := make(chan struct{})
			const events = 4
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for i := range events {
					fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
					w.(http.Flusher).Flush()
					select {
					case <-next:
					case <-r.Context().Done():
						return
					}
				}
				io.WriteString(w, "data: [DONE]\n\n")
			}))
			defer backend.Close()
			f := newFront(t, DefaultConfig(), backend.URL)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := post(ctx, t, f.URL+path(kind), body(kind, `,"stream":true`))
			defer resp.Body.Close()
			if got, want := resp.Header.Get(HeaderBackend), f.name(t, backend.URL); got != want {
				t.Errorf("%s = %q, want %q", HeaderBackend, got, want)
			}
			rd := bufio.NewReader(resp.Body)
			for i := range events {
				line, err := rd.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if want := fmt.Sprintf("data: {\"i\":%d}\n", i); line != want {
					t.Fatalf("event %d = %q, want %q", i, line, want)
				}
				rd.ReadString('\n') // the blank line ending the event
				next <- struct{}{}  // only now may the backend write the next one
			}
			rest, _ := io.ReadAll(rd)
			if string(rest) != "data: [DONE]\n\n" {
				t.Errorf("stream tail = %q, want the [DONE] event", rest)
			}
			f.waitHandler(t, 1)
			f.checkLedgerZero(t)
		})
	}
}

// TestClientGoneCancelsBackend: a client that leaves before the first byte
// or in the middle of a stream ends the backend's request context at once,
// and the ledger returns to zero.
func TestClientGoneCancelsBackend(t *testing.T) {
	for _, tc := range []struct {
		name        string
		writeFirst  bool
		readAtFirst bool
	}{
		{name: "before first byte"},
		{name: "mid-stream", writeFirst: true, readAtFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan struct{})
			backendDone := make(chan struct{})
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(backendDone)
				// Read the body as an engine does: net/http notices a
				// closed connection only once the body is consumed.
				io.Copy(io.Discard, r.Body)
				if tc.writeFirst {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: {\"i\":0}\n\n")
					w.(http.Flusher).Flush()
				}
				close(got)
				<-r.Context().Done() // blocks until the proxy drops the request
			}))
			defer backend.Close()
			f := newFront(t, DefaultConfig(), backend.URL)

			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(body("chat", `,"stream":true`)))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					if tc.readAtFirst {
						line, _ := bufio.NewReader(resp.Body).ReadString('\n')
						if !strings.HasPrefix(line, "data:") {
							err = fmt.Errorf("first line %q", line)
						}
					}
					cancel()
					resp.Body.Close()
				}
				errc <- err
			}()
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("backend never got the request")
			}
			if !tc.readAtFirst {
				cancel()
			}
			select {
			case <-backendDone:
			case <-time.After(5 * time.Second):
				t.Fatal("backend request context still alive 5s after the client left")
			}
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("client: %v", err)
			}
			f.waitHandler(t, 1)
			f.checkLedgerZero(t)
		})
	}
}

func TestRetryServesFromAnotherBackendWhenOneRefuses(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	good := okBackend(t, &hits)
	dead := deadURL(t)
	f := newFront(t, DefaultConfig(), dead, good.URL)
	// The first requests reach the dead backend first at least once: with
	// equal loads the picker alternates by requests served.
	for i := range 4 {
		resp := post(context.Background(), t, f.URL+"/v1/completions", body("completions", ""))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d, body %s", i, resp.StatusCode, b)
		}
		if got, want := resp.Header.Get(HeaderBackend), f.name(t, good.URL); got != want {
			t.Errorf("request %d served by %q, want %q", i, got, want)
		}
	}
	f.waitHandler(t, 4)
	var deadFailures int64
	for _, be := range f.bal.Snapshot().Backends {
		if be.ID == dead {
			deadFailures = be.Ledger.Failures()
		}
	}
	if deadFailures == 0 {
		t.Error("the dead backend was never tried; the test did not exercise a retry")
	}
	if hits.Load() != 4 {
		t.Errorf("good backend hits = %d, want 4", hits.Load())
	}
	f.checkLedgerZero(t)
}

func TestRetryStatusGoesToNextBackend(t *testing.T) {
	t.Parallel()
	var bad503 atomic.Int64
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad503.Add(1)
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	good := okBackend(t, nil)
	f := newFront(t, DefaultConfig(), busy.URL, good.URL)
	for range 3 {
		resp := post(context.Background(), t, f.URL+"/v1/completions", body("completions", ""))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200 from the second backend", resp.StatusCode)
		}
	}
	f.waitHandler(t, 3)
	if bad503.Load() == 0 {
		t.Error("the busy backend was never tried")
	}
	f.checkLedgerZero(t)
}

// TestAllBackendsDown: every backend refusing gives 502; none ready gives
// 503 with Retry-After, as it does when the backends are gone altogether;
// all as OpenAI JSON.
func TestAllBackendsDown(t *testing.T) {
	t.Parallel()
	f := newFront(t, DefaultConfig(), deadURL(t), deadURL(t))
	resp := post(context.Background(), t, f.URL+"/v1/completions", body("completions", ""))
	checkOpenAIError(t, resp, http.StatusBadGateway)
	f.waitHandler(t, 1)
	f.checkLedgerZero(t)

	var specs []balancer.Spec
	for _, be := range f.bal.Snapshot().Backends {
		specs = append(specs, balancer.Spec{ID: be.ID, URL: be.URL, Models: be.Models, State: balancer.StateDown})
	}
	f.bal.Update(specs...)
	resp = post(context.Background(), t, f.URL+"/v1/completions", body("completions", ""))
	checkOpenAIError(t, resp, http.StatusServiceUnavailable)
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Error("all down: no Retry-After on the 503")
	}

	// Gone from the set (a DNS answer without them), the model was still
	// offered once: 503, not 404.
	for _, s := range specs {
		f.bal.Remove(s.ID)
	}
	resp = post(context.Background(), t, f.URL+"/v1/completions", body("completions", ""))
	checkOpenAIError(t, resp, http.StatusServiceUnavailable)
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Error("all gone: no Retry-After on the 503")
	}
}

func checkOpenAIError(t *testing.T, resp *http.Response, wantStatus int) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Errorf("status = %d, want %d (body %s)", resp.StatusCode, wantStatus, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var e struct {
		Error *struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Param   json.RawMessage `json:"param"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error == nil {
		t.Fatalf("body %s is not an OpenAI error: %v", b, err)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Param == nil || e.Error.Code == nil {
		t.Errorf("error %s lacks message, type, param or code", b)
	}
}

func TestBackendDyingMidStreamEndsClientStream(t *testing.T) {
	t.Parallel()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops, as when a model server dies
	}))
	defer backend.Close()
	f := newFront(t, DefaultConfig(), backend.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := post(ctx, t, f.URL+"/v1/completions", body("completions", `,"stream":true`))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 (the stream had begun)", resp.StatusCode)
	}
	got, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Errorf("stream ended cleanly with %q; want a cut stream error", got)
	}
	if ctx.Err() != nil {
		t.Fatal("client hung until the deadline instead of seeing the stream end")
	}
	if !strings.HasPrefix(string(got), "data: {\"i\":0}") {
		t.Errorf("client got %q, want the first event before the cut", got)
	}
	f.waitHandler(t, 1)
	f.checkLedgerZero(t)
}

func TestBadInputIsRefusedBeforeAnyBackend(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	backend := okBackend(t, &hits)
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	f := newFront(t, cfg, backend.URL)
	big := `{"model":"` + testModel + `","prompt":"` + strings.Repeat("a", 5000) + `"}`
	for _, tc := range []struct {
		name        string
		method      string
		path        string
		contentType string
		body        string
		wantStatus  int
		wantParam   string
	}{
		{name: "not JSON", body: "hello", wantStatus: 400},
		{name: "truncated JSON", body: `{"model":"` + testModel + `","prompt":"hi`, wantStatus: 400},
		{name: "JSON array", body: `[{"model":"x"}]`, wantStatus: 400},
		{name: "JSON string", body: `"hello"`, wantStatus: 400},
		{name: "empty body", body: "", wantStatus: 400},
		{name: "missing model", body: `{"prompt":"hi"}`, wantStatus: 400, wantParam: "model"},
		{name: "null model", body: `{"model":null,"prompt":"hi"}`, wantStatus: 400, wantParam: "model"},
		{name: "model not a string", body: `{"model":42,"prompt":"hi"}`, wantStatus: 400, wantParam: "model"},
		{name: "empty model", body: `{"model":"","prompt":"hi"}`, wantStatus: 400, wantParam: "model"},
		{name: "empty prompt", body: `{"model":"` + testModel + `","prompt":""}`, wantStatus: 400, wantParam: "prompt"},
		{name: "missing prompt", body: `{"model":"` + testModel + `"}`, wantStatus: 400, wantParam: "prompt"},
		{name: "empty prompt list", body: `{"model":"` + testModel + `","prompt":[]}`, wantStatus: 400, wantParam: "prompt"},
		{name: "prompt an object", body: `{"model":"` + testModel + `","prompt":{"a":1}}`, wantStatus: 400, wantParam: "prompt"},
		{name: "empty messages", path: "/v1/chat/completions", body: `{"model":"` + testModel + `","messages":[]}`, wantStatus: 400, wantParam: "messages"},
		{name: "messages not a list", path: "/v1/chat/completions", body: `{"model":"` + testModel + `","messages":"hi"}`, wantStatus: 400, wantParam: "messages"},
		{name: "message without role", path: "/v1/chat/completions", body: `{"model":"` + testModel + `","messages":[{"content":"hi"}]}`, wantStatus: 400, wantParam: "messages"},
		{name: "stream not a bool", body: `{"model":"` + testModel + `","prompt":"hi","stream":"yes"}`, wantStatus: 400, wantParam: "stream"},
		{name: "wrong content type", contentType: "text/plain", body: body("completions", ""), wantStatus: 415},
		{name: "body over the limit", body: big, wantStatus: 413},
		{name: "invalid UTF-8", body: "{\"model\":\"" + testModel + "\",\"prompt\":\"\xff\xfe\"}", wantStatus: 400},
		{name: "unknown model", body: `{"model":"no-such-model","prompt":"hi"}`, wantStatus: 404, wantParam: "model"},
		{name: "GET on a POST route", method: http.MethodGet, body: "", wantStatus: 405},
		{name: "unknown route", path: "/v2/completions", body: body("completions", ""), wantStatus: 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, p, ct := tc.method, tc.path, tc.contentType
			if method == "" {
				method = http.MethodPost
			}
			if p == "" {
				p = "/v1/completions"
			}
			if ct == "" {
				ct = "application/json"
			}
			req, _ := http.NewRequest(method, f.URL+p, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", ct)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(b))
			checkOpenAIError(t, resp, tc.wantStatus)
			if tc.wantParam != "" {
				var e struct {
					Error struct {
						Param string `json:"param"`
					} `json:"error"`
				}
				_ = json.Unmarshal(b, &e)
				if e.Error.Param != tc.wantParam {
					t.Errorf("param = %q, want %q (body %s)", e.Error.Param, tc.wantParam, b)
				}
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("backend got %d requests, want 0", n)
	}
	f.checkLedgerZero(t)
}

// TestLedgerReturnsToZeroOnEveryPath runs each way a request can end and
// checks every backend's in-flight count afterwards.
func TestLedgerReturnsToZeroOnEveryPath(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	hung := make(chan struct{}, 16) // a "hang" request reached the backend
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
			Stream bool   `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		switch req.Prompt {
		case "error":
			http.Error(w, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`, http.StatusBadRequest)
		case "hang":
			hung <- struct{}{}
			<-r.Context().Done()
		case "unavailable":
			http.Error(w, "loading", http.StatusServiceUnavailable)
		case "die":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case "hang-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			if req.Stream {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
				return
			}
			io.WriteString(w, `{"choices":[]}`)
		}
	}))
	defer backend.Close()
	cfg := DefaultConfig()
	cfg.RequestTimeout = 300 * time.Millisecond
	f := newFront(t, cfg, deadURL(t), backend.URL)

	prompt := func(p string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":%t}`, testModel, p, stream)
	}
	for _, tc := range []struct {
		name        string
		body        string
		cancelEarly bool
		wantStatus  int // 0: do not check (client cancelled or stream cut)
	}{
		// The other candidate refuses connections: whichever is tried
		// first, the request is retried once and ends 502 or 503.
		{name: "retry", body: prompt("unavailable", false)},
		// ReverseProxy panics with http.ErrAbortHandler to cut the client.
		{name: "backend dies mid-stream", body: prompt("die", true)},
		{name: "success", body: prompt("ok", false), wantStatus: 200},
		{name: "streaming", body: prompt("ok", true), wantStatus: 200},
		{name: "backend error", body: prompt("error", false), wantStatus: 400},
		{name: "timeout before first byte", body: prompt("hang", false), wantStatus: 504},
		{name: "timeout mid-stream", body: prompt("hang-stream", true)},
		{name: "client cancel", body: prompt("hang", false), cancelEarly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for len(hung) > 0 {
				<-hung
			}
			if tc.cancelEarly {
				// Cancel once the request is at the backend: a fixed delay
				// could cancel before the proxy's handler ever ran (seen
				// in CI under load), and then no handler would return.
				go func() { <-hung; cancel() }()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/completions", strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if tc.wantStatus != 0 && resp.StatusCode != tc.wantStatus {
					t.Errorf("status = %d, want %d", resp.StatusCode, tc.wantStatus)
				}
				if tc.name == "retry" && (resp.StatusCode != 502 && resp.StatusCode != 503 || resp.Header.Get("X-Llmlb-Reason") == "") {
					t.Errorf("retry: status %d reason %q", resp.StatusCode, resp.Header.Get("X-Llmlb-Reason"))
				}
			} else if !tc.cancelEarly {
				t.Fatal(err)
			}
			f.waitHandler(t, 1)
			f.checkLedgerZero(t)
		})
	}
	close(release)
}

func TestMiBPromptIsForwardedByteForByte(t *testing.T) {
	t.Parallel()
	got := make(chan []byte, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		io.WriteString(w, `{}`)
	}))
	defer backend.Close()
	f := newFront(t, DefaultConfig(), backend.URL)
	var prompt strings.Builder
	for i := 0; prompt.Len() < 1<<20; i++ {
		fmt.Fprintf(&prompt, "line %d: \u00e9t\u00e9 \\\"quoted\\\" \\u00e9 text; ", i)
	}
	// Unusual spacing and key order: the proxy must not re-encode.
	sent := `{ "prompt" : "` + prompt.String() + `",  "model":"` + testModel + `" , "max_tokens": 1 }`
	resp := post(context.Background(), t, f.URL+"/v1/completions", sent)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	b := <-got
	if len(sent) < 1<<20 || !bytes.Equal(b, []byte(sent)) {
		t.Errorf("backend got %d bytes, sent %d; equal = %t", len(b), len(sent), bytes.Equal(b, []byte(sent)))
	}
}

func TestBackendErrorBodyPassesThroughUnchanged(t *testing.T) {
	t.Parallel()
	const errBody = `{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"BadRequestError","param":null,"code":400}}`
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, errBody)
	}))
	defer backend.Close()
	f := newFront(t, DefaultConfig(), backend.URL)
	resp := post(context.Background(), t, f.URL+"/v1/completions", body("completions", ""))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || string(b) != errBody {
		t.Errorf("got %d %s, want 400 %s", resp.StatusCode, b, errBody)
	}
	if got, want := resp.Header.Get(HeaderBackend), f.name(t, backend.URL); got != want {
		t.Errorf("%s = %q, want %q", HeaderBackend, got, want)
	}
}

func TestOtherV1RoutesAreBalancedByModel(t *testing.T) {
	t.Parallel()
	gotPath := make(chan string, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath <- r.URL.Path
		io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	defer backend.Close()
	f := newFront(t, DefaultConfig(), backend.URL)
	resp := post(context.Background(), t, f.URL+"/v1/embeddings", `{"model":"`+testModel+`","input":"hi"}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if p := <-gotPath; p != "/v1/embeddings" {
		t.Errorf("backend path = %q, want /v1/embeddings", p)
	}
}

func TestModelsAreMergedAcrossReadyBackends(t *testing.T) {
	t.Parallel()
	bal := newBal(t, "least-request")
	u := func(s string) *url.URL { pu, _ := url.Parse(s); return pu }
	bal.Update(
		balancer.Spec{ID: "a", URL: u("http://a"), Models: []string{"m1", "m2"}, Adapters: []balancer.Adapter{{Name: "sql", Parent: "m1"}}, State: balancer.StateReady},
		balancer.Spec{ID: "b", URL: u("http://b"), Models: []string{"m2"}, State: balancer.StateReady},
		balancer.Spec{ID: "c", URL: u("http://c"), Models: []string{"hidden"}, State: balancer.StateDown},
	)
	srv := httptest.NewServer(newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry()}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string  `json:"id"`
			Object string  `json:"object"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Data {
		p := ""
		if d.Parent != nil {
			p = "<" + *d.Parent
		}
		ids = append(ids, d.ID+p)
	}
	if got, want := strings.Join(ids, ","), "m1,m2,sql<m1"; list.Object != "list" || got != want {
		t.Errorf("models = %q (object %q), want %q", got, list.Object, want)
	}
}

func TestReadyNeedsAReadyBackend(t *testing.T) {
	t.Parallel()
	bal := newBal(t, "least-request")
	srv := httptest.NewServer(newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry()}).Handler())
	defer srv.Close()
	check := func(want int) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("/ready = %d, want %d", resp.StatusCode, want)
		}
	}
	check(http.StatusServiceUnavailable)
	pu, _ := url.Parse("http://a")
	bal.Update(balancer.Spec{ID: "a", URL: pu, Models: []string{"m"}, State: balancer.StateReady})
	check(http.StatusOK)
}

// TestConnectionBrokenBeforeHeadersIsRetried: a backend that dies after
// reading the request, before any response header, costs the client
// nothing: the next backend answers (and the attempt counts as a failure
// for passive health). With retry_broken_connections off the client gets
// 502.
func TestConnectionBrokenBeforeHeadersIsRetried(t *testing.T) {
	crash := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer crash.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer good.Close()
	for _, retry := range []bool{true, false} {
		cfg := DefaultConfig()
		cfg.RetryBrokenConnections = retry
		f := newFront(t, cfg, crash.URL, good.URL)
		var crashed *balancer.Backend
		for _, be := range f.bal.Snapshot().Backends {
			if be.ID == crash.URL {
				crashed = be
			}
		}
		// Make the crashing backend the least loaded, so it is tried first.
		for _, be := range f.bal.Snapshot().Backends {
			if be.ID == good.URL {
				g := balancer.NewGuard()
				g.Attach(be, balancer.Work{}, time.Now())
				defer g.Release()
			}
		}
		resp, err := http.Post(f.URL+"/v1/completions", "application/json", strings.NewReader(body("completion", "")))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusOK
		if !retry {
			want = http.StatusBadGateway
		}
		if resp.StatusCode != want {
			t.Errorf("retry_broken_connections=%v: status %d, want %d", retry, resp.StatusCode, want)
		}
		if crashed.Ledger.FailureStreak() != 1 {
			t.Errorf("retry_broken_connections=%v: crashed backend's failure streak %d, want 1", retry, crashed.Ledger.FailureStreak())
		}
	}
}

// newBal returns a balancer running policy over a real prefix index, with
// routes for models.
func newBal(tb testing.TB, policy string, models ...balancer.ModelRoute) *balancer.Balancer {
	tb.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Policy = policy
	bal, err := balancer.New(cfg, balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig()), Tree: prefix.NewTree(1 << 20)}, models, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return bal
}

// TestSaturationAnswers429And503: with the only backend saturated, one
// request waits in the admission queue (size 1) and gets 503 when its
// deadline passes; the next finds the queue full and gets 429 with
// Retry-After; a sheddable one gets 429 at once. Nothing reaches the
// backend. In a synctest bubble: the deadline is the fake clock's.
func TestSaturationAnswers429And503(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var hits atomic.Int64
		cfg := balancer.DefaultConfig()
		cfg.Admission.MaxQueue = 1
		cfg.Admission.Timeout = 300 * time.Millisecond
		bal, err := balancer.New(cfg, balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig())}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		f := newBubbleFrontBal(t, DefaultConfig(), bal, map[string]http.Handler{
			"busy": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }),
		}, "busy")
		defer f.close()
		be := bal.Snapshot().Backends[0]
		bal.Update(balancer.Spec{ID: be.ID, URL: be.URL, Engine: be.Engine, Models: be.Models, State: balancer.StateReady,
			Metrics: balancer.Metrics{Queued: balancer.Known(40), At: time.Now()}})

		post := func(hdr map[string]string) *http.Response {
			req, _ := http.NewRequest("POST", "http://llmlb:80/v1/completions", strings.NewReader(body("completion", "")))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := f.client.Do(req)
			if err != nil {
				t.Error(err)
				return &http.Response{}
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp
		}
		start := time.Now()
		first := make(chan *http.Response, 1)
		go func() { first <- post(nil) }()
		synctest.Wait()
		if n := bal.QueueLen(); n != 1 {
			t.Fatalf("queue length %d with the first request waiting, want 1", n)
		}
		if resp := post(nil); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("queue full: status %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if resp := post(map[string]string{"X-Llmlb-Priority": "-1"}); resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("sheddable: status %d, want 429", resp.StatusCode)
		}
		if resp := post(map[string]string{"X-Llmlb-Priority": "high"}); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("bad priority header: status %d, want 400", resp.StatusCode)
		}
		if resp := <-first; resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("deadline: status %d, want 503", resp.StatusCode)
		}
		if d := time.Since(start); d != cfg.Admission.Timeout {
			t.Errorf("the waiting request was answered after %s, want the admission timeout (%s)", d, cfg.Admission.Timeout)
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the saturated backend got %d requests", n)
		}
	})
}

// TestStreamKeepsDoneWhenUsageShareAnEvent: through the proxy, a client
// that did not ask for usage gets the backend's stream without the usage
// chunk llmlb asked for, and still ends with data: [DONE], when the backend
// sends the usage chunk and [DONE] in one event (issue 18, 9).
func TestStreamKeepsDoneWhenUsageShareAnEvent(t *testing.T) {
	t.Parallel()
	var asked atomic.Bool
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		asked.Store(bytes.Contains(b, []byte(`"include_usage":true`)))
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":null}`+"\n\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, `data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`+"\ndata: [DONE]\n\n")
	}))
	t.Cleanup(backend.Close)
	f := newFront(t, DefaultConfig(), backend.URL)
	resp := post(context.Background(), t, f.URL+"/v1/completions", body("completions", `,"stream":true`))
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !asked.Load() {
		t.Fatal("llmlb did not ask the backend for usage; the test needs proxy.request_usage on")
	}
	if strings.Contains(string(got), `"usage":{`) || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Errorf("client got %q, want the token chunk, no usage chunk, then data: [DONE]", got)
	}
}

// TestExpectContinueNotForwarded: llmlb has read the body (and answered the
// client's Expect: 100-continue itself) before it forwards, so the backend
// is not asked for a 100 Continue of its own, which would reach the client
// as a second one.
func TestExpectContinueNotForwarded(t *testing.T) {
	var got atomic.Value
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Expect"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	defer backend.Close()
	f := newFront(t, DefaultConfig(), backend.URL)
	req, _ := http.NewRequest(http.MethodPost, f.URL+"/v1/completions", strings.NewReader(`{"model":"`+testModel+`","prompt":"hi"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	f.waitHandler(t, 1)
	if resp.StatusCode != http.StatusOK || got.Load() != "" {
		t.Errorf("status %d, the backend saw Expect %q; want 200 and none", resp.StatusCode, got.Load())
	}
}
