package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/tracing"
)

// pdLeg is one leg a P/D engine received.
type pdLeg struct {
	server    string // the engine's URL
	requestID string
	body      map[string]any
}

// pdEngines are emulated disaggregated engines of one protocol, recording
// every leg they receive. vLLM's prefill server answers a prefill leg
// with kv_transfer_params naming its blocks (do_remote_prefill for the
// decoder), as NixlConnector does; SGLang's decode server waits for the
// prefill server of its bootstrap room, and gives up when its request is
// aborted.
type pdEngines struct {
	mu    sync.Mutex
	legs  []pdLeg
	rooms map[float64]chan struct{} // SGLang: closed when the room's prefill is done
	// arrived is closed when the room's decode leg has arrived: an SGLang
	// prefill server waits for its decode peer's handshake.
	arrived map[float64]chan struct{}
	// failPrefill makes prefill servers answer 500, or refuseStatus
	// when it is set.
	failPrefill  bool
	refuseStatus int
	// prefillHeld, when set, receives each prefill leg's arrival, and
	// the leg then waits until its request is cancelled.
	prefillHeld chan struct{}
	// aborted receives an SGLang decode leg whose request was cancelled
	// while it waited for its prefill.
	aborted chan struct{}
}

func (e *pdEngines) room(r float64) chan struct{} { return e.channel(&e.rooms, r) }

func (e *pdEngines) decodeArrived(r float64) chan struct{} { return e.channel(&e.arrived, r) }

func (e *pdEngines) channel(m *map[float64]chan struct{}, r float64) chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if *m == nil {
		*m = map[float64]chan struct{}{}
	}
	c, ok := (*m)[r]
	if !ok {
		c = make(chan struct{})
		(*m)[r] = c
	}
	return c
}

// server starts one engine of role role ("prefill" or "decode") speaking
// sglang's protocol or vLLM's.
func (e *pdEngines) server(t *testing.T, role string, sglang bool) *httptest.Server {
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.legs = append(e.legs, pdLeg{server: srv.URL, requestID: r.Header.Get("X-Request-Id"), body: body})
		fail := e.failPrefill
		e.mu.Unlock()
		if room, ok := body["bootstrap_room"].(float64); ok && sglang {
			if role == "decode" {
				close(e.decodeArrived(room))
			} else {
				select {
				case <-e.decodeArrived(room):
				case <-r.Context().Done():
					return
				}
			}
		}
		if role == "prefill" && e.prefillHeld != nil {
			e.prefillHeld <- struct{}{}
			<-r.Context().Done()
			e.prefillHeld <- struct{}{}
			return
		}
		switch {
		case role == "prefill" && fail && e.refuseStatus != 0:
			http.Error(w, `{"error":{"message":"This model's maximum context length is 8 tokens."}}`, e.refuseStatus)
		case role == "prefill" && fail:
			http.Error(w, `{"error":{"message":"prefill failed"}}`, http.StatusInternalServerError)
		case role == "prefill" && sglang:
			close(e.room(body["bootstrap_room"].(float64)))
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"index":0,"text":"x"}]}`)
		case role == "prefill":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[{"index":0,"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":%q,"remote_block_ids":[1,2,3],"remote_host":"127.0.0.1","remote_port":5600}}`, srv.URL)
		default:
			if sglang {
				select {
				case <-e.room(body["bootstrap_room"].(float64)):
				case <-r.Context().Done():
					e.aborted <- struct{}{}
					return
				}
			}
			if body["stream"] == true {
				w.Header().Set("Content-Type", "text/event-stream")
				for _, tok := range []string{"a", "b", "c"} {
					fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok)
					w.(http.Flusher).Flush()
				}
				io.WriteString(w, "data: [DONE]\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"abc"}}]}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// pdFront is a proxy in front of two prefill and two decode engines,
// declared by role.
func pdFront(t *testing.T, e *pdEngines, sglang bool) (f *testFront, prefill, decode []string) {
	t.Helper()
	return pdFrontOn(t, e, sglang, newTestBalancer)
}

// pdFrontOn is pdFront on a balancer newBal makes.
func pdFrontOn(t *testing.T, e *pdEngines, sglang bool, newBal func(testing.TB, ...string) *balancer.Balancer) (f *testFront, prefill, decode []string) {
	t.Helper()
	for range 2 {
		prefill = append(prefill, e.server(t, "prefill", sglang).URL)
		decode = append(decode, e.server(t, "decode", sglang).URL)
	}
	f = newFrontOn(t, DefaultConfig(), newBal(t, append(append([]string{}, prefill...), decode...)...))
	engine := "vllm"
	if sglang {
		engine = "sglang"
	}
	var specs []balancer.Spec
	for i, u := range append(append([]string{}, prefill...), decode...) {
		pu, _ := url.Parse(u)
		role, port := balancer.RoleDecode, 0
		if i < len(prefill) {
			role, port = balancer.RolePrefill, 8998
		}
		specs = append(specs, balancer.Spec{ID: u, URL: pu, Engine: engine, Models: []string{testModel}, State: balancer.StateReady, Role: role, BootstrapPort: port})
	}
	f.bal.Update(specs...)
	return f, prefill, decode
}

func pdChatBody(words int, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"stream_options":{"include_usage":true},"min_tokens":2,"max_tokens":16,"messages":[{"role":"user","content":%q}]}`,
		testModel, stream, strings.Repeat("Summarise the attached report, section by section. ", words))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestVLLMDisaggregatedLegs: on two prefill and two decode servers
// declared by role, a long chat takes vLLM's two legs: the prefill leg
// with do_remote_decode, stream false, max_tokens 1 and no stream_options
// or min_tokens; the decode leg with the kv_transfer_params the prefill
// leg returned and the same X-Request-Id; streams stream. The ledger
// returns to zero.
func TestVLLMDisaggregatedLegs(t *testing.T) {
	e := &pdEngines{}
	f, prefill, decode := pdFront(t, e, false)
	for i, stream := range []bool{true, false, true, false} {
		resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100, stream))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, b)
		}
		if stream != strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || stream && !strings.Contains(string(b), "data: [DONE]") {
			t.Errorf("request %d (stream %t): Content-Type %q, body %q", i, stream, resp.Header.Get("Content-Type"), b)
		}
		if resp.Header.Get(HeaderPrefillBackend) == "" || resp.Header.Get(HeaderBackend) == "" {
			t.Errorf("request %d: headers %v, want both picks named", i, resp.Header)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 8 {
		t.Fatalf("legs = %d, want 8 (a prefill and a decode leg for each of 4 requests)", len(e.legs))
	}
	kvOf := map[string]any{} // request id -> what its prefill leg returned
	for _, l := range e.legs {
		switch {
		case contains(prefill, l.server):
			kv, _ := l.body["kv_transfer_params"].(map[string]any)
			if kv["do_remote_decode"] != true || l.body["stream"] != false || l.body["max_tokens"] != float64(1) {
				t.Errorf("prefill leg %s: kv_transfer_params %v, stream %v, max_tokens %v", l.requestID, kv, l.body["stream"], l.body["max_tokens"])
			}
			if _, ok := l.body["stream_options"]; ok {
				t.Errorf("prefill leg %s carries stream_options", l.requestID)
			}
			if _, ok := l.body["min_tokens"]; ok {
				t.Errorf("prefill leg %s carries min_tokens", l.requestID)
			}
			kvOf[l.requestID] = l.server
		case contains(decode, l.server):
			eng, ok := kvOf[l.requestID]
			kv, _ := l.body["kv_transfer_params"].(map[string]any)
			if !ok || kv["do_remote_prefill"] != true || kv["remote_engine_id"] != eng || l.body["max_tokens"] != float64(16) {
				t.Errorf("decode leg %s: kv_transfer_params %v, want those of its prefill leg on %v", l.requestID, kv, eng)
			}
		default:
			t.Errorf("leg to unknown server %s", l.server)
		}
	}
	f.checkLedgerZero(t)
}

// TestShortPromptSkipsPrefillLeg: a prompt shorter than
// balancer.pd.min_uncached_tokens goes to a decode server alone.
func TestShortPromptSkipsPrefillLeg(t *testing.T) {
	e := &pdEngines{}
	f, _, decode := pdFront(t, e, false)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(2, false))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.waitHandler(t, 1)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPrefillBackend) != "" {
		t.Fatalf("status %d, prefill backend %q; want 200 and none", resp.StatusCode, resp.Header.Get(HeaderPrefillBackend))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 1 || !contains(decode, e.legs[0].server) || e.legs[0].body["kv_transfer_params"] != nil {
		t.Errorf("legs %v, want one to a decode server without kv_transfer_params", e.legs)
	}
	f.checkLedgerZero(t)
}

// TestPrefillOfAnotherEngineAnswersInOneLeg: a vLLM decode server has no
// prefill server to pair with when the prefill servers run SGLang (the
// KV transfer's protocol is the engine's), so a long chat is answered by
// the decode server alone. (The plan once named the prefill pick after
// dropping it, and panicked.)
func TestPrefillOfAnotherEngineAnswersInOneLeg(t *testing.T) {
	e := &pdEngines{}
	f, _, decode := pdFront(t, e, false)
	var specs []balancer.Spec
	for _, be := range f.bal.Snapshot().Backends {
		sp := balancer.Spec{ID: be.ID, URL: be.URL, Engine: be.Engine, Models: []string{testModel}, State: balancer.StateReady, Role: be.Role}
		if be.Role == balancer.RolePrefill {
			sp.Engine = "sglang"
		}
		specs = append(specs, sp)
	}
	f.bal.Update(specs...)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100, false))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	f.waitHandler(t, 1)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPrefillBackend) != "" {
		t.Fatalf("status %d, prefill backend %q: %s; want 200 and none", resp.StatusCode, resp.Header.Get(HeaderPrefillBackend), b)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 1 || !contains(decode, e.legs[0].server) {
		t.Errorf("legs %v, want one to a decode server", e.legs)
	}
	f.checkLedgerZero(t)
}

// TestVLLMPrefillFailureFailsCleanly: when every prefill server fails,
// the request is a 502 in OpenAI shape, no decode leg is sent, and the
// ledger returns to zero.
func TestVLLMPrefillFailureFailsCleanly(t *testing.T) {
	e := &pdEngines{failPrefill: true}
	f, prefill, _ := pdFront(t, e, false)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100, true))
	checkOpenAIError(t, resp, http.StatusBadGateway)
	f.waitHandler(t, 1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 2 {
		t.Errorf("legs = %d, want 2 (both prefill servers tried)", len(e.legs))
	}
	for _, l := range e.legs {
		if !contains(prefill, l.server) {
			t.Errorf("a leg went to %s, not a prefill server", l.server)
		}
	}
	f.checkLedgerZero(t)
}

// TestVLLMPrefillRefusalIsTheClients: a prefill server's 400 (the
// request's own fault) is answered as a 400 with its message, and not
// tried on the other prefill server.
func TestVLLMPrefillRefusalIsTheClients(t *testing.T) {
	e := &pdEngines{failPrefill: true, refuseStatus: http.StatusBadRequest}
	f, _, _ := pdFront(t, e, false)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100, false))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	f.waitHandler(t, 1)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "maximum context length") {
		t.Errorf("status %d, body %s; want 400 with the server's message", resp.StatusCode, b)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 1 {
		t.Errorf("legs = %d, want 1", len(e.legs))
	}
	f.checkLedgerZero(t)
}

// TestClientGoneDuringPrefillCancelsIt: a client that leaves while the
// prefill leg runs cancels it; no decode leg is sent, and the ledger
// returns to zero.
func TestClientGoneDuringPrefillCancelsIt(t *testing.T) {
	e := &pdEngines{prefillHeld: make(chan struct{}, 2)}
	f, _, _ := pdFront(t, e, false)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-e.prefillHeld // the prefill leg arrived
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(pdChatBody(100, true)))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the request answered %d after its client left", resp.StatusCode)
	}
	e.prefillCancelledAlone(t, f)
	f.checkLedgerZero(t)
}

// prefillCancelledAlone checks that a request held in its prefill leg
// (prefillHeld) had that leg cancelled, sent no decode leg, and that f's
// handler returned.
func (e *pdEngines) prefillCancelledAlone(t *testing.T, f *testFront) {
	t.Helper()
	select {
	case <-e.prefillHeld: // the prefill leg saw its cancellation
	case <-time.After(10 * time.Second):
		t.Fatal("the prefill leg was not cancelled")
	}
	f.waitHandler(t, 1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 1 {
		t.Errorf("legs = %d, want the prefill leg alone", len(e.legs))
	}
}

// TestSGLangBootstrap: with SGLang servers both legs carry the same
// bootstrap_host (the prefill server's), bootstrap_port and
// bootstrap_room, and the decode leg's stream reaches the client.
func TestSGLangBootstrap(t *testing.T) {
	e := &pdEngines{}
	f, prefill, decode := pdFront(t, e, true)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100, true))
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	resp.Body.Close()
	f.waitHandler(t, 1)
	if resp.StatusCode != http.StatusOK || events != 4 {
		t.Fatalf("status %d, %d events; want 200 and 4", resp.StatusCode, events)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.legs) != 2 {
		t.Fatalf("legs = %d, want 2", len(e.legs))
	}
	p, d := e.legs[0], e.legs[1]
	if contains(decode, p.server) {
		p, d = d, p
	}
	if !contains(prefill, p.server) || !contains(decode, d.server) {
		t.Fatalf("legs went to %s and %s", p.server, d.server)
	}
	for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"} {
		if p.body[k] == nil || p.body[k] != d.body[k] {
			t.Errorf("%s: prefill leg %v, decode leg %v; want the same", k, p.body[k], d.body[k])
		}
	}
	if p.body["bootstrap_host"] != "127.0.0.1" || p.body["bootstrap_port"] != float64(8998) || p.requestID != d.requestID {
		t.Errorf("prefill leg: host %v, port %v, request ids %q %q", p.body["bootstrap_host"], p.body["bootstrap_port"], p.requestID, d.requestID)
	}
	f.checkLedgerZero(t)
}

// TestSGLangShortPromptStillSplits: an SGLang decode server refuses a
// request without a bootstrap room, so even a short prompt takes a
// prefill leg there.
func TestSGLangShortPromptStillSplits(t *testing.T) {
	e := &pdEngines{}
	f, _, _ := pdFront(t, e, true)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(2, false))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.waitHandler(t, 1)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPrefillBackend) == "" {
		t.Errorf("status %d, prefill backend %q; want 200 with a prefill leg", resp.StatusCode, resp.Header.Get(HeaderPrefillBackend))
	}
	f.checkLedgerZero(t)
}

// TestSGLangFailedPrefillAbortsDecode: a prefill leg that fails fails the
// request (502) and aborts the decode leg waiting for its KV cache.
func TestSGLangFailedPrefillAbortsDecode(t *testing.T) {
	e := &pdEngines{failPrefill: true, aborted: make(chan struct{}, 4)}
	f, _, _ := pdFront(t, e, true)
	resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100, true))
	checkOpenAIError(t, resp, http.StatusBadGateway)
	f.waitHandler(t, 1)
	f.checkLedgerZero(t)
	// The decode server sees the abort when its connection closes, which
	// may be just after the proxy's handler returned.
	select {
	case <-e.aborted:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode leg was not aborted")
	}
}

// TestVLLMPrefillBody: the prefill leg's body is the client's with vLLM's
// prefill kv_transfer_params, stream false, max_tokens 1 and
// max_completion_tokens 1 only when present, without stream_options,
// min_tokens and min_completion_tokens; other fields are kept.
func TestVLLMPrefillBody(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]any
	}{
		{"chat", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"min_tokens":4,"messages":[]}`,
			map[string]any{"model": "m", "stream": false, "max_tokens": float64(1), "messages": []any{}}},
		{"max_completion_tokens", `{"model":"m","max_completion_tokens":64,"min_completion_tokens":2,"temperature":0.5}`,
			map[string]any{"model": "m", "stream": false, "max_tokens": float64(1), "max_completion_tokens": float64(1), "temperature": 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := vllmPrefillBody([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			kv, _ := got["kv_transfer_params"].(map[string]any)
			if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || len(kv) != 6 {
				t.Errorf("kv_transfer_params = %v", kv)
			}
			delete(got, "kv_transfer_params")
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("vllmPrefillBody(%s) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// TestRouteExplainsPD: /debug/route shows the P/D decision on a fleet
// with roles: pd with the prefill pick for a long prompt, local for a
// short one; the status page and /debug/backends show the roles.
func TestRouteExplainsPD(t *testing.T) {
	f, prefill, _ := pdFront(t, &pdEngines{}, false)
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: f.bal, Registerer: prometheus.NewRegistry()})
	for _, tc := range []struct {
		name, body, want string
	}{{"long", pdChatBody(100, false), pdSplit}, {"short", pdChatBody(2, false), pdLocal}} {
		rec := httptest.NewRecorder()
		s.AdminHandler(prometheus.NewRegistry()).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/route", strings.NewReader(tc.body)))
		var got struct {
			PD *struct {
				Decision string `json:"decision"`
				Prefill  *struct {
					Chosen []string `json:"chosen"`
				} `json:"prefill"`
			} `json:"pd"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.PD == nil {
			t.Fatalf("%s: /debug/route %d %s", tc.name, rec.Code, rec.Body)
		}
		if got.PD.Decision != tc.want || tc.want == pdSplit && (got.PD.Prefill == nil || !contains(prefill, got.PD.Prefill.Chosen[0])) {
			t.Errorf("%s: pd = %+v, want decision %s with a prefill server", tc.name, got.PD, tc.want)
		}
	}
	page := httptest.NewRecorder()
	s.AdminHandler(prometheus.NewRegistry()).ServeHTTP(page, httptest.NewRequest(http.MethodGet, "/", nil))
	if n := strings.Count(page.Body.String(), `<span class="sub">prefill</span>`); n != 2 {
		t.Errorf("the status page shows role prefill %d times, want 2", n)
	}
	var roles []string
	for _, b := range Statuses(f.bal.Snapshot()) {
		roles = append(roles, b.Role.String())
	}
	if j, _ := json.Marshal(Statuses(f.bal.Snapshot())); !strings.Contains(string(j), `"role":"decode"`) {
		t.Errorf("/debug/backends roles %v, JSON lacks role decode", roles)
	}
}

// TestPDLegsAreTraced: with a tracer, a disaggregated request's prefill
// leg has a span of its own beside the decode leg's attempt, both
// children of the request's span.
func TestPDLegsAreTraced(t *testing.T) {
	e := &pdEngines{}
	f, _, _ := pdFront(t, e, false)
	rcv := &otlpReceiver{}
	collector := httptest.NewServer(rcv)
	defer collector.Close()
	tp, shutdown, err := tracing.Start(tracing.Config{Endpoint: collector.URL, SampleRatio: 1, Propagate: true})
	if err != nil {
		t.Fatal(err)
	}
	h := newServer(t, Options{Config: DefaultConfig(), Balancer: f.bal, Registerer: prometheus.NewRegistry(), Tracer: tp}).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(pdChatBody(100, false))))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*tracepb.Span{}
	for _, sp := range rcv.spans {
		byName[sp.Name] = sp
	}
	req, leg, att := byName["llmlb.request"], byName["llmlb.prefill_leg"], byName["llmlb.attempt"]
	if req == nil || leg == nil || att == nil {
		t.Fatalf("spans %v; want llmlb.request, llmlb.prefill_leg and llmlb.attempt", byName)
	}
	for _, sp := range []*tracepb.Span{leg, att} {
		if string(sp.ParentSpanId) != string(req.SpanId) {
			t.Errorf("%s's parent is %x, want the request span %x", sp.Name, sp.ParentSpanId, req.SpanId)
		}
	}
}

// TestVLLMPrefillRetriesOnAnotherServer: a prefill server that refuses
// connections is passed over for the next prefill candidate before the
// decode leg starts; the answer names the prefill server that answered.
func TestVLLMPrefillRetriesOnAnotherServer(t *testing.T) {
	e := &pdEngines{}
	f, prefill, _ := pdFront(t, e, false)
	dead, _ := url.Parse(deadURL(t))
	f.bal.Update(balancer.Spec{ID: prefill[0], URL: dead, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady, Role: balancer.RolePrefill})
	live := f.name(t, prefill[1])
	for i := range 4 {
		resp := post(context.Background(), t, f.URL+"/v1/chat/completions", pdChatBody(100+i, false))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPrefillBackend) != live {
			t.Errorf("request %d: status %d, prefill backend %q; want 200 from %s", i, resp.StatusCode, resp.Header.Get(HeaderPrefillBackend), live)
		}
	}
	for _, be := range f.bal.Snapshot().Backends {
		if be.ID == prefill[0] && be.Ledger.Failures() == 0 {
			t.Error("the refusing prefill server was never tried")
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.legs {
		if kv, _ := l.body["kv_transfer_params"].(map[string]any); !contains(prefill, l.server) && kv["remote_engine_id"] != prefill[1] {
			t.Errorf("decode leg %s: kv_transfer_params %v, want those of %s", l.requestID, kv, prefill[1])
		}
	}
	f.checkLedgerZero(t)
}
