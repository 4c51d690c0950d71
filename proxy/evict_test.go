package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
)

// evictBalancer is newTestBalancer with eviction on.
func evictBalancer(t testing.TB, backendURLs ...string) *balancer.Balancer {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Policy = "least-request"
	cfg.Admission.EvictAfter = time.Second
	bal, err := balancer.New(cfg, balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig()), Tree: prefix.NewTree(1 << 20)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bal.Update(readySpecs(t, backendURLs...)...)
	return bal
}

// evictOne ends one sheddable request as an urgent request that waited
// evict_after would, and reports whether there was one: the queue's own
// [balancer.Ticket.Evict], called at once rather than on its timer.
func evictOne(t *testing.T, bal *balancer.Balancer) bool {
	t.Helper()
	tk, err := bal.Enqueue(&balancer.Request{Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Leave("cancelled")
	return tk.Evict()
}

// holdEngine answers the first events of a stream in its API's shape, or
// for a request marked "silent" nothing, then holds the request until it
// is cancelled. The first request of a "cut" engine ends its stream after
// those events instead, without the API's terminator. arrived receives
// each request once its answer (if any) is sent; cancelled, each request
// whose context ended.
type holdEngine struct {
	cut       bool
	n         atomic.Int64
	arrived   chan string
	cancelled chan string
}

func newHoldEngine() *holdEngine {
	return &holdEngine{arrived: make(chan string, 8), cancelled: make(chan string, 8)}
}

func (e *holdEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	first := e.n.Add(1) == 1
	if !strings.Contains(string(b), "silent") {
		w.Header().Set("Content-Type", "text/event-stream")
		switch r.URL.Path {
		case "/v1/messages":
			io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\""+testModel+"\"}}\n\n"+
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n")
		case "/v1/responses":
			io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\"}}\n\n"+
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"a\"}\n\n")
		default:
			io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"`+testModel+`","choices":[{"index":0,"delta":{"content":"a "},"finish_reason":null}]}`+"\n\n")
		}
		w.(http.Flusher).Flush()
		if e.cut && first {
			e.arrived <- r.URL.Path
			return // the stream ends without its terminator: continued elsewhere
		}
	}
	e.arrived <- r.URL.Path
	<-r.Context().Done()
	e.cancelled <- r.URL.Path
}

// TestEvictionEndsSheddableRequest: an evicted sheddable request's backend
// request is cancelled, its client gets an error in its API's shape (an
// error event once its stream began, else a 429 with Retry-After), it is
// counted, its backend's health is not blamed, and every ledger (in
// flight, pending, tokens) returns to zero: mid-stream in each API,
// before the first byte, and on the server that continued a broken
// stream.
func TestEvictionEndsSheddableRequest(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		continued        bool   // the stream breaks once and is continued first
		wantStatus       int    // what the client is answered
		want             string // in the client's body
	}{
		{"chat stream", "/v1/chat/completions", `{"model":"` + testModel + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			false, 200, `data: {"error":{"message":"This request's priority is sheddable and it was ended to make room for a request of higher priority; retry later.","type":"rate_limit_error","param":null,"code":"evicted"}}` + "\n\n"},
		{"messages stream", "/v1/messages", `{"model":"` + testModel + `","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			false, 200, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":"},
		{"responses stream", "/v1/responses", `{"model":"` + testModel + `","stream":true,"input":"hi"}`,
			false, 200, "event: error\ndata: {\"type\":\"error\",\"code\":\"evicted\",\"message\":"},
		{"completion stream before its first byte", "/v1/completions", `{"model":"` + testModel + `","stream":true,"prompt":"silent"}`,
			false, 429, `"code":"evicted"`},
		{"messages before its first byte", "/v1/messages", `{"model":"` + testModel + `","max_tokens":8,"messages":[{"role":"user","content":"silent"}]}`,
			false, 429, `{"type":"error","error":{"type":"rate_limit_error","message":`},
		{"continued stream", "/v1/chat/completions", `{"model":"` + testModel + `","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`,
			true, 200, `"code":"evicted"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newHoldEngine()
			e.cut = tc.continued
			a, b := httptest.NewServer(e), httptest.NewServer(e)
			t.Cleanup(a.Close)
			t.Cleanup(b.Close)
			bal := evictBalancer(t, a.URL, b.URL)
			f := newFrontOn(t, DefaultConfig(), bal)
			if evictOne(t, bal) {
				t.Fatal("evicted a request with none in flight")
			}
			req, _ := http.NewRequest(http.MethodPost, f.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Llmlb-Priority", "-1")
			type answer struct {
				resp *http.Response
				body string
			}
			got := make(chan answer, 1)
			begun := make(chan struct{}) // the client read its stream's first event
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					close(begun)
					got <- answer{}
					return
				}
				br := bufio.NewReader(resp.Body)
				var b []byte
				for resp.StatusCode == http.StatusOK && !bytes.HasSuffix(b, []byte("\n\n")) {
					line, err := br.ReadBytes('\n')
					b = append(b, line...)
					if err != nil {
						break
					}
				}
				close(begun)
				rest, _ := io.ReadAll(br) // an evicted stream ends aborted, after its error event
				resp.Body.Close()
				got <- answer{resp, string(append(b, rest...))}
			}()
			waits := 1
			if tc.continued {
				waits = 2
			}
			if tc.wantStatus == http.StatusOK {
				<-begun
			}
			for range waits {
				select {
				case <-e.arrived:
				case <-time.After(10 * time.Second):
					t.Fatal("the request did not reach a backend")
				}
			}
			if !evictOne(t, bal) {
				t.Fatal("nothing evicted with a sheddable request in flight")
			}
			select {
			case <-e.cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the evicted request's backend request was not cancelled")
			}
			ans := <-got
			if ans.resp == nil {
				return
			}
			if ans.resp.StatusCode != tc.wantStatus || !strings.Contains(ans.body, tc.want) {
				t.Errorf("client got %d %q, want %d with %q", ans.resp.StatusCode, ans.body, tc.wantStatus, tc.want)
			}
			if tc.wantStatus == http.StatusTooManyRequests && ans.resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			f.waitHandler(t, 1)
			var evictions float64
			for _, be := range bal.Snapshot().Backends {
				evictions += testutil.ToFloat64(f.px.metrics.evictions.WithLabelValues(testModel, be.ID))
				if n := be.Ledger.Failures(); n != 0 && !tc.continued {
					t.Errorf("%s: %d failures counted for an eviction", be.ID, n)
				}
			}
			if evictions != 1 {
				t.Errorf("llmlb_evictions_total = %v, want 1", evictions)
			}
			checkLedgersZero(t, bal)
			if evictOne(t, bal) {
				t.Error("evicted a request that had ended")
			}
		})
	}
}

// TestEvictionDuringPrefillLeg: a disaggregated sheddable request evicted
// while its prefill leg runs has that leg cancelled, sends no decode leg,
// answers 429, and leaves both legs' ledgers at zero.
func TestEvictionDuringPrefillLeg(t *testing.T) {
	e := &pdEngines{prefillHeld: make(chan struct{}, 2)}
	f, _, _ := pdFrontOn(t, e, false, evictBalancer)
	req, _ := http.NewRequest(http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(pdChatBody(100, true)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Llmlb-Priority", "-1")
	go func() {
		<-e.prefillHeld // the prefill leg arrived
		if !evictOne(t, f.bal) {
			t.Error("nothing evicted with a sheddable request in its prefill leg")
		}
	}()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), `"code":"evicted"`) {
		t.Errorf("evicted in its prefill leg: %d %s, want 429 evicted", resp.StatusCode, b)
	}
	e.prefillCancelledAlone(t, f)
	checkLedgersZero(t, f.bal)
}

// TestEvictionNeverEndsUrgentRequests: a request of priority 0 is never
// evicted, nor, with eviction off, a sheddable one.
func TestEvictionNeverEndsUrgentRequests(t *testing.T) {
	for _, tc := range []struct {
		name  string
		on    bool
		prio  string
		evict bool
	}{
		{"priority 0", true, "0", false},
		{"eviction off", false, "-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newHoldEngine()
			a := httptest.NewServer(e)
			t.Cleanup(a.Close)
			bal := newTestBalancer(t, a.URL)
			if tc.on {
				bal = evictBalancer(t, a.URL)
			}
			f := newFrontOn(t, DefaultConfig(), bal)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(body("chat", `,"stream":true`)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Llmlb-Priority", tc.prio)
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			<-e.arrived
			if tk, err := bal.Enqueue(&balancer.Request{Model: testModel}); err != nil {
				t.Fatal(err)
			} else if tk.Evict() {
				t.Errorf("evicted a request of priority %s (eviction on: %v)", tc.prio, tc.on)
			} else {
				tk.Leave("cancelled")
			}
			cancel()
			<-done
			f.waitHandler(t, 1)
			checkLedgersZero(t, bal)
		})
	}
}

// checkLedgersZero fails if any backend's ledger still counts a request:
// in flight, pending its first byte, or their tokens.
func checkLedgersZero(t *testing.T, bal *balancer.Balancer) {
	t.Helper()
	for _, be := range bal.Snapshot().Backends {
		l := be.Ledger
		pending, pendingTokens := l.Pending()
		if own := l.Own(); own.InFlight != 0 || own.OpenTokens != 0 || pending != 0 || pendingTokens != 0 || l.OpenPrompt() != 0 {
			t.Errorf("%s: in flight %d, open tokens %d, pending %d (%d tokens), open prompt %d; want all 0",
				be.ID, own.InFlight, own.OpenTokens, pending, pendingTokens, l.OpenPrompt())
		}
	}
}
