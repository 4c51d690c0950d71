package proxy

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// recordingBackend is an httptest vLLM stand-in that records every request
// that reaches it.
type recordingBackend struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	last *http.Request // guarded by mu
}

func newRecordingBackend(t *testing.T) *recordingBackend {
	t.Helper()
	rb := &recordingBackend{}
	rb.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rb.hits.Add(1)
		rb.mu.Lock()
		rb.last = r
		rb.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Llmlb-Backend", "spoofed-by-backend")
		io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(rb.Close)
	return rb
}

func (rb *recordingBackend) lastRequest() *http.Request {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.last
}

// newServedFront runs the proxy behind the http.Server serve uses
// (Server.HTTPServer, so its header limits apply) on a real TCP port.
func newServedFront(t *testing.T, cfg Config, backendURLs ...string) *httptest.Server {
	t.Helper()
	return serveFront(t, newServer(t, Options{Config: cfg, Balancer: newTestBalancer(t, backendURLs...), Registerer: prometheus.NewRegistry()}))
}

// serveFront serves px as newServedFront does.
func serveFront(t *testing.T, px *Server) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = px.HTTPServer(log.New(io.Discard, "", 0))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// rawExchange writes raw to a new connection to addr and reads the first
// response.
func rawExchange(t *testing.T, addr, raw string) (*http.Response, []byte, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// A request smuggled behind the first is answered on the same
	// connection (or the connection is closed); read on so that it has
	// been handled before the test counts what reached the backend.
	if resp2, err := http.ReadResponse(br, nil); err == nil {
		io.Copy(io.Discard, resp2.Body)
		resp2.Body.Close()
	}
	return resp, b, nil
}

// post builds a raw HTTP/1.1 POST with a correct Content-Length and
// Connection: close.
func rawPost(path, headers, body string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + headers +
		"Content-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
}

const jsonCT = "Content-Type: application/json\r\n"

// TestHostileRequestsNeverReachBackend sends requests a hostile or broken
// client might send through a real llmlb in front of a backend that records
// what reaches it: none does, and each gets an OpenAI-shaped JSON error
// unless net/http refuses it before any handler runs (plain: true;
// docs/security.md says which).
func TestHostileRequestsNeverReachBackend(t *testing.T) {
	rb := newRecordingBackend(t)
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 64 << 10
	cfg.BodyReadTimeout = 300 * time.Millisecond
	front := newServedFront(t, cfg, rb.URL)
	addr := front.Listener.Addr().String()

	ok := body("completion", "")
	manyHeaders := strings.Repeat("X-A: b\r\n", 150)
	tests := []hostileRow{
		// bodies
		{"empty body", rawPost("/v1/completions", jsonCT, ""), 400, false},
		{"not json", rawPost("/v1/completions", jsonCT, "hello"), 400, false},
		{"json array", rawPost("/v1/completions", jsonCT, `[{"model":"`+testModel+`"}]`), 400, false},
		{"truncated json", rawPost("/v1/completions", jsonCT, `{"model":"`+testModel+`","prompt":"hi"`), 400, false},
		{"model a number", rawPost("/v1/completions", jsonCT, `{"model":7,"prompt":"hi"}`), 400, false},
		{"no model", rawPost("/v1/completions", jsonCT, `{"prompt":"hi"}`), 400, false},
		{"empty prompt", rawPost("/v1/completions", jsonCT, `{"model":"`+testModel+`","prompt":""}`), 400, false},
		{"stream not a bool", rawPost("/v1/completions", jsonCT, `{"model":"`+testModel+`","prompt":"hi","stream":"yes"}`), 400, false},
		{"invalid utf-8", rawPost("/v1/completions", jsonCT, "{\"model\":\""+testModel+"\",\"prompt\":\"\xff\xfe\"}"), 400, false},
		{"nul bytes as body", rawPost("/v1/completions", jsonCT, "\x00\x00\x00\x00"), 400, false},
		{"raw nul inside json", rawPost("/v1/completions", jsonCT, "{\"model\":\""+testModel+"\",\"prompt\":\"a\x00b\"}"), 400, false},
		{"escaped nul in model", rawPost("/v1/completions", jsonCT, `{"model":"`+testModel+`\u0000","prompt":"hi"}`), 404, false},
		{"unknown model", rawPost("/v1/completions", jsonCT, `{"model":"gpt-4","prompt":"hi"}`), 404, false},
		{"chat messages not a list", rawPost("/v1/chat/completions", jsonCT, `{"model":"`+testModel+`","messages":"hi"}`), 400, false},
		{"chat message without role", rawPost("/v1/chat/completions", jsonCT, `{"model":"`+testModel+`","messages":[{"content":"hi"}]}`), 400, false},
		{"body over max_body_bytes", rawPost("/v1/completions", jsonCT, `{"model":"`+testModel+`","prompt":"`+strings.Repeat("a", 70<<10)+`"}`), 413, false},
		{"content-length larger than body", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\n" + jsonCT + "Content-Length: 100\r\n\r\n" + ok, 408, false},
		{"bad chunk size", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + jsonCT + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + ok + "\r\n0\r\n\r\n", 400, false},
		// content types
		{"text/plain", rawPost("/v1/completions", "Content-Type: text/plain\r\n", ok), 415, false},
		{"form", rawPost("/v1/completions", "Content-Type: application/x-www-form-urlencoded\r\n", ok), 415, false},
		{"multipart", rawPost("/v1/completions", "Content-Type: multipart/form-data; boundary=x\r\n", ok), 415, false},
		{"garbage content type", rawPost("/v1/completions", "Content-Type: ;;;\r\n", ok), 415, false},
		// methods
		{"GET completions", "GET /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n\r\n", 405, false},
		{"PUT chat", "PUT" + rawPost("/v1/chat/completions", jsonCT, ok)[len("POST"):], 405, false},
		{"DELETE completions", "DELETE /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n\r\n", 405, false},
		{"lower-case post", "post" + rawPost("/v1/completions", jsonCT, ok)[len("POST"):], 405, false},
		{"TRACE", "TRACE /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n\r\n", 405, false},
		{"CONNECT", "CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\nConnection: close\r\n\r\n", 404, false},
		{"POST models", rawPost("/v1/models", jsonCT, ok), 405, false},
		// engine administration routes
		{"vllm load lora", rawPost("/v1/load_lora_adapter", jsonCT, `{"model":"`+testModel+`","lora_name":"x","lora_path":"/tmp/x"}`), 404, false},
		{"vllm unload lora", rawPost("/v1/unload_lora_adapter", jsonCT, `{"model":"`+testModel+`","lora_name":"x"}`), 404, false},
		{"vllm reset prefix cache", rawPost("/reset_prefix_cache", jsonCT, ok), 404, false},
		{"vllm sleep", rawPost("/sleep", jsonCT, ok), 404, false},
		{"vllm start profile", rawPost("/start_profile", jsonCT, ok), 404, false},
		{"sglang flush cache", rawPost("/flush_cache", jsonCT, ok), 404, false},
		{"sglang update weights", rawPost("/update_weights_from_disk", jsonCT, `{"model":"`+testModel+`","model_path":"/tmp"}`), 404, false},
		{"unknown v1 route", rawPost("/v1/anything", jsonCT, ok), 404, false},
		// paths
		{"dot segments", rawPost("/v1/../v1/load_lora_adapter", jsonCT, ok), 404, false},
		{"dot segments after a route", rawPost("/v1/completions/../load_lora_adapter", jsonCT, ok), 404, false},
		{"encoded dot segments", rawPost("/v1/%2e%2e/load_lora_adapter", jsonCT, ok), 404, false},
		{"encoded slash", rawPost("/v1/chat%2Fcompletions", jsonCT, ok), 404, false},
		{"double slash", rawPost("//v1/completions", jsonCT, ok), 404, false},
		{"trailing slash", rawPost("/v1/completions/", jsonCT, ok), 404, false},
		{"encoded nul in path", rawPost("/v1/completions%00", jsonCT, ok), 404, false},
		{"absolute-form admin route", "POST http://backend/v1/load_lora_adapter HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n" + jsonCT + "Content-Length: " + fmt.Sprint(len(ok)) + "\r\n\r\n" + ok, 404, false},
		{"raw nul in path", rawPost("/v1/compl\x00etions", jsonCT, ok), 400, true},
		// headers
		{"40 KiB header", rawPost("/v1/completions", jsonCT+"X-Big: "+strings.Repeat("a", 40<<10)+"\r\n", ok), 431, false},
		{"200 KiB header", rawPost("/v1/completions", jsonCT+"X-Big: "+strings.Repeat("a", 200<<10)+"\r\n", ok), 431, true},
		{"150 headers", rawPost("/v1/completions", jsonCT+manyHeaders, ok), 431, false},
		{"bad priority header", rawPost("/v1/completions", jsonCT+"X-Llmlb-Priority: high\r\n", ok), 400, false},
		{"nul in header value", rawPost("/v1/completions", jsonCT+"X-A: a\x00b\r\n", ok), 400, true},
		{"header without colon", rawPost("/v1/completions", jsonCT+"NoColonHere\r\n", ok), 400, true},
		{"space before colon", rawPost("/v1/completions", jsonCT+"X-A : b\r\n", ok), 400, true},
		{"no host", "POST /v1/completions HTTP/1.1\r\nConnection: close\r\n" + jsonCT + "Content-Length: " + fmt.Sprint(len(ok)) + "\r\n\r\n" + ok, 400, true},
		{"unknown http version", strings.Replace(rawPost("/v1/completions", jsonCT, ok), "HTTP/1.1", "HTTP/9.9", 1), 505, true},
		// smuggling
		{"content-length and chunked", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\n" + jsonCT + "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
			rawPost("/v1/load_lora_adapter", jsonCT, `{"model":"`+testModel+`","lora_name":"x"}`), 400, false},
		{"two content-lengths", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + jsonCT + "Content-Length: 5\r\nContent-Length: " + fmt.Sprint(len(ok)) + "\r\n\r\n" + ok, 400, true},
		{"transfer-encoding gzip", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + jsonCT + "Transfer-Encoding: gzip\r\n\r\n" + ok, 501, true},
		{"transfer-encoding chunked twice", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + jsonCT + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 501, true},
		{"obfuscated transfer-encoding", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + jsonCT + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 501, true},
		{"pipelined admin route", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\n" + jsonCT + "Content-Length: 0\r\n\r\n" +
			rawPost("/v1/load_lora_adapter", jsonCT, ok), 400, false},
		{"unknown expectation", rawPost("/v1/completions", jsonCT+"Expect: 200-ok\r\n", ok), 417, true},
	}
	if len(tests) < 40 {
		t.Fatalf("%d hostile requests, want at least 40", len(tests))
	}
	checkHostile(t, addr, rb, tests)

	// The same path, with a well-formed request, does reach it: the
	// harness can tell.
	resp, b, err := rawExchange(t, addr, rawPost("/v1/completions", jsonCT, ok))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("well-formed request: %v, %v %q", err, resp, b)
	}
	if n := rb.hits.Load(); n != 1 {
		t.Errorf("backend saw %d requests after a good one, want 1", n)
	}
}

// hostileRow is one hostile request and the answer it must get.
type hostileRow struct {
	name       string
	raw        string
	wantStatus int
	plain      bool // refused by net/http itself, before our handlers
}

// checkHostile sends each row to addr: each gets its status, in OpenAI's
// JSON shape unless plain, and none reaches rb.
func checkHostile(t *testing.T, addr string, rb *recordingBackend, tests []hostileRow) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b, err := rawExchange(t, addr, tt.raw)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d; body %q", resp.StatusCode, tt.wantStatus, b)
			}
			if tt.plain {
				return
			}
			var eb errorBody
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Message == "" || eb.Error.Type == "" {
				t.Errorf("body %q is not an OpenAI error (%v)", b, err)
			}
		})
	}
	if n := rb.hits.Load(); n != 0 {
		t.Errorf("%d hostile requests reached the backend, want 0; the last: %s %s", n, rb.lastRequest().Method, rb.lastRequest().URL)
	}
}

// TestHostileAuthRequestsNeverReachBackend: with API keys configured,
// requests that carry no valid key in the one place llmlb reads it (a
// single Authorization: Bearer header), or a valid key used where the key
// may not go, never reach a backend and get OpenAI-shaped errors; a
// well-formed keyed request does reach it, without its Authorization.
func TestHostileAuthRequestsNeverReachBackend(t *testing.T) {
	rb := newRecordingBackend(t)
	cfg := DefaultConfig()
	px := newServer(t, Options{Config: cfg, Balancer: newTestBalancer(t, rb.URL), Registerer: prometheus.NewRegistry()})
	if err := px.SetAuth(AuthConfig{Keys: []KeyConfig{
		keyConfig("alpha", keyA),
		keyConfig("limited", keyB, func(k *KeyConfig) { k.Models = []string{"another-model"} }),
	}}); err != nil {
		t.Fatal(err)
	}
	addr := serveFront(t, px).Listener.Addr().String()
	ok := body("completion", "")
	bearer := func(k string) string { return "Authorization: Bearer " + k + "\r\n" }
	tests := []hostileRow{
		{"no authorization", rawPost("/v1/completions", jsonCT, ok), 401, false},
		{"bearer without key", rawPost("/v1/completions", jsonCT+"Authorization: Bearer\r\n", ok), 401, false},
		{"empty authorization", rawPost("/v1/completions", jsonCT+"Authorization: \r\n", ok), 401, false},
		{"basic auth with the key", rawPost("/v1/completions", jsonCT+"Authorization: Basic "+base64.StdEncoding.EncodeToString([]byte("user:"+keyA))+"\r\n", ok), 401, false},
		{"the key without a scheme", rawPost("/v1/completions", jsonCT+"Authorization: "+keyA+"\r\n", ok), 401, false},
		{"two authorization headers", rawPost("/v1/completions", jsonCT+bearer(keyA)+bearer(keyA), ok), 401, false},
		{"two keys in one header", rawPost("/v1/completions", jsonCT+"Authorization: Bearer "+keyA+", Bearer "+keyA+"\r\n", ok), 401, false},
		{"key with a tab inside", rawPost("/v1/completions", jsonCT+bearer(keyA[:8]+"\t"+keyA[8:]), ok), 401, false},
		{"the key's hash", rawPost("/v1/completions", jsonCT+bearer(HashKey(keyA)), ok), 401, false},
		{"a prefix of the key", rawPost("/v1/completions", jsonCT+bearer(keyA[:len(keyA)-1]), ok), 401, false},
		{"the key and more", rawPost("/v1/completions", jsonCT+bearer(keyA+"x"), ok), 401, false},
		{"30 KiB bearer token", rawPost("/v1/completions", jsonCT+bearer(strings.Repeat("k", 30<<10)), ok), 401, false},
		{"40 KiB bearer token", rawPost("/v1/completions", jsonCT+bearer(strings.Repeat("k", 40<<10)), ok), 431, false},
		{"nul in the bearer token", rawPost("/v1/completions", jsonCT+bearer(keyA+"\x00"), ok), 400, true},
		{"key in the query string", rawPost("/v1/completions?api_key="+keyA, jsonCT, ok), 401, false},
		{"key in the query string as key", rawPost("/v1/completions?key="+keyA, jsonCT, ok), 401, false},
		{"key in api-key header", rawPost("/v1/completions", jsonCT+"api-key: "+keyA+"\r\n", ok), 401, false},
		{"a wrong key in x-api-key", rawPost("/v1/completions", jsonCT+"x-api-key: "+keyA+"x\r\n", ok), 401, false},
		{"x-api-key and Authorization disagree", rawPost("/v1/completions", jsonCT+"x-api-key: "+keyA+"\r\nAuthorization: Bearer "+keyA+"x\r\n", ok), 401, false},
		{"key in proxy-authorization", rawPost("/v1/completions", jsonCT+"Proxy-Authorization: Bearer "+keyA+"\r\n", ok), 401, false},
		{"key in a cookie", rawPost("/v1/completions", jsonCT+"Cookie: api_key="+keyA+"\r\n", ok), 401, false},
		{"key in the body", rawPost("/v1/completions", jsonCT, `{"model":"`+testModel+`","prompt":"hi","api_key":"`+keyA+`"}`), 401, false},
		{"models list without key", "GET /v1/models HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n\r\n", 401, false},
		{"chat without key", rawPost("/v1/chat/completions", jsonCT, body("chat", "")), 401, false},
		{"embeddings with a wrong key", rawPost("/v1/embeddings", jsonCT+bearer(keyB+"x"), ok), 401, false},
		{"key limited to another model", rawPost("/v1/completions", jsonCT+bearer(keyB), ok), 404, false},
		{"valid key on an admin route", rawPost("/v1/load_lora_adapter", jsonCT+bearer(keyA), `{"model":"`+testModel+`","lora_name":"x","lora_path":"/tmp/x"}`), 404, false},
		{"valid key, bad body", rawPost("/v1/completions", jsonCT+bearer(keyA), "{"), 400, false},
		{"valid key, GET completions", "GET /v1/completions HTTP/1.1\r\nHost: llmlb\r\nConnection: close\r\n" + bearer(keyA) + "\r\n", 405, false},
		{"valid key, smuggled admin route", "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\n" + jsonCT + bearer(keyA) + "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
			rawPost("/v1/load_lora_adapter", jsonCT+bearer(keyA), `{"model":"`+testModel+`","lora_name":"x"}`), 400, false},
	}
	checkHostile(t, addr, rb, tests)

	resp, b, err := rawExchange(t, addr, rawPost("/v1/completions", jsonCT+bearer(keyA), ok))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("well-formed keyed request: %v, %v %q", err, resp, b)
	}
	if n := rb.hits.Load(); n != 1 {
		t.Errorf("backend saw %d requests after a good one, want 1", n)
	}
	if got := rb.lastRequest().Header.Get("Authorization"); got != "" {
		t.Errorf("the client's key reached the backend: Authorization %q", got)
	}
}
