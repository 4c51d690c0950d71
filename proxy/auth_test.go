package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/sim"
)

// Keys the tests present; the config holds only their hashes.
const (
	keyA = "sk-llmlb-test-alpha-4f0c1d2e3b4a5968"
	keyB = "sk-llmlb-test-bravo-7a6b5c4d3e2f1a0b"
)

// syncBuffer is a log destination the handlers and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// keyedFront is a proxy with API keys in front of emulated vLLM servers,
// one per model named, logging everything at debug (prompts included)
// into logs.
type keyedFront struct {
	*httptest.Server
	px   *Server
	bal  *balancer.Balancer
	reg  *prometheus.Registry
	logs *syncBuffer
	hits map[string]*countingHandler // by model
}

// countingHandler counts the requests that reach a backend.
type countingHandler struct {
	h  http.Handler
	mu sync.Mutex
	n  map[string]int // by path
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	c.h.ServeHTTP(w, r)
}

func (c *countingHandler) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

func newKeyedFront(t *testing.T, cfg Config, ac AuthConfig, models ...string) *keyedFront {
	t.Helper()
	f := &keyedFront{bal: newBal(t, "least-request"), reg: prometheus.NewRegistry(), logs: &syncBuffer{}, hits: map[string]*countingHandler{}}
	var specs []balancer.Spec
	for _, m := range models {
		s, err := sim.NewServer(sim.ServerConfig{Model: m}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
		if err != nil {
			t.Fatal(err)
		}
		ch := &countingHandler{h: s.Handler(), n: map[string]int{}}
		f.hits[m] = ch
		srv := httptest.NewServer(ch)
		t.Cleanup(srv.Close)
		u, _ := url.Parse(srv.URL)
		specs = append(specs, balancer.Spec{ID: srv.URL, URL: u, Engine: "vllm", Models: []string{m}, State: balancer.StateReady})
	}
	f.bal.Update(specs...)
	logger := slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.px = newServer(t, Options{Config: cfg, Balancer: f.bal, Registerer: f.reg, Logger: logger, AccessLog: true, LogPrompts: true, Auth: ac})
	f.Server = httptest.NewServer(f.px.Handler())
	t.Cleanup(f.Close)
	return f
}

// do sends a request with the given Authorization header ("" for none)
// and returns the response with its body read.
func (f *keyedFront) do(t *testing.T, method, path, authz, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func completion(model string) string {
	return `{"model":"` + model + `","prompt":"tell me a story","max_tokens":4}`
}

// openAIError decodes b as OpenAI's error envelope, failing the test if
// it is not one.
func openAIError(t *testing.T, b []byte) errorBody {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Message == "" || eb.Error.Type == "" {
		t.Fatalf("body %q is not an OpenAI error (%v)", b, err)
	}
	return eb
}

func keyConfig(name, key string, mut ...func(*KeyConfig)) KeyConfig {
	k := KeyConfig{Name: name, Key: HashKey(key)}
	for _, m := range mut {
		m(&k)
	}
	return k
}

// TestKeysMissingWrongOrMalformedGet401: with keys configured, a request
// without a valid bearer key, on a model route or GET /v1/models, gets 401
// in OpenAI's shape (invalid_request_error, code invalid_api_key) with
// WWW-Authenticate, reaches no backend and holds nothing in the ledger;
// the right key in the form the OpenAI SDKs send it is served.
func TestKeysMissingWrongOrMalformedGet401(t *testing.T) {
	f := newKeyedFront(t, DefaultConfig(), AuthConfig{Keys: []KeyConfig{keyConfig("alpha", keyA)}}, testModel)
	tests := []struct {
		name, path, authz string
	}{
		{"no header", "/v1/completions", ""},
		{"wrong key", "/v1/completions", "Bearer " + keyB},
		{"key with one byte changed", "/v1/completions", "Bearer " + keyA[:len(keyA)-1] + "9"},
		{"key's hash as the key", "/v1/completions", "Bearer " + HashKey(keyA)},
		{"hex of the hash as the key", "/v1/completions", "Bearer " + strings.TrimPrefix(HashKey(keyA), "sha256:")},
		{"basic auth", "/v1/completions", "Basic " + keyA},
		{"no scheme", "/v1/completions", keyA},
		{"bearer without key", "/v1/completions", "Bearer"},
		{"bearer and spaces", "/v1/completions", "Bearer    "},
		{"key with a suffix", "/v1/completions", "Bearer " + keyA + " extra"},
		{"huge token", "/v1/completions", "Bearer " + strings.Repeat("k", 20<<10)},
		{"models without key", "/v1/models", ""},
		{"models with wrong key", "/v1/models", "Bearer " + keyB},
		{"chat without key", "/v1/chat/completions", ""},
		{"embeddings with wrong key", "/v1/embeddings", "Bearer nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodPost
			if tt.path == "/v1/models" {
				method = http.MethodGet
			}
			resp, b := f.do(t, method, tt.path, tt.authz, completion(testModel))
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401; body %s", resp.StatusCode, b)
			}
			eb := openAIError(t, b)
			if eb.Error.Type != "invalid_request_error" || eb.Error.Code == nil || *eb.Error.Code != "invalid_api_key" {
				t.Errorf("error %+v, want invalid_request_error / invalid_api_key", eb.Error)
			}
			if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate %q, want Bearer", resp.Header.Get("WWW-Authenticate"))
			}
		})
	}
	if n := f.hits[testModel].count("/v1/completions"); n != 0 {
		t.Fatalf("%d unauthenticated requests reached the backend", n)
	}
	for _, authz := range []string{"Bearer " + keyA, "bearer " + keyA, "BEARER  " + keyA} {
		if resp, b := f.do(t, http.MethodPost, "/v1/completions", authz, completion(testModel)); resp.StatusCode != http.StatusOK {
			t.Errorf("Authorization %q...: status %d, want 200; %s", authz[:8], resp.StatusCode, b)
		}
	}
	if n := f.hits[testModel].count("/v1/completions"); n != 3 {
		t.Errorf("backend saw %d requests with the right key, want 3", n)
	}
	for _, be := range f.bal.Snapshot().Backends {
		if n := be.Ledger.InFlight(); n != 0 {
			t.Errorf("backend %s in flight = %d, want 0", be.ID, n)
		}
	}
}

// TestRevokedKeyGets401: a key taken out of the running config (SetAuth,
// as a reload calls it) is refused from the next request on, while the
// keys that stay keep working.
func TestRevokedKeyGets401(t *testing.T) {
	f := newKeyedFront(t, DefaultConfig(), AuthConfig{Keys: []KeyConfig{keyConfig("alpha", keyA), keyConfig("bravo", keyB)}}, testModel)
	if resp, b := f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyA, completion(testModel)); resp.StatusCode != http.StatusOK {
		t.Fatalf("before revocation: status %d; %s", resp.StatusCode, b)
	}
	if err := f.px.SetAuth(AuthConfig{Keys: []KeyConfig{keyConfig("bravo", keyB)}}); err != nil {
		t.Fatal(err)
	}
	resp, b := f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyA, completion(testModel))
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("revoked key: status %d, want 401; %s", resp.StatusCode, b)
	}
	if eb := openAIError(t, b); eb.Error.Code == nil || *eb.Error.Code != "invalid_api_key" {
		t.Errorf("revoked key: error %+v, want code invalid_api_key", eb.Error)
	}
	if resp, b := f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyB, completion(testModel)); resp.StatusCode != http.StatusOK {
		t.Errorf("remaining key: status %d; %s", resp.StatusCode, b)
	}
	// With every key removed, no key is asked for: as without auth.
	if err := f.px.SetAuth(AuthConfig{}); err != nil {
		t.Fatal(err)
	}
	if resp, b := f.do(t, http.MethodPost, "/v1/completions", "", completion(testModel)); resp.StatusCode != http.StatusOK {
		t.Errorf("no keys configured: status %d; %s", resp.StatusCode, b)
	}
}

// TestModelLimitedKeyCannotTellOtherModelsExist: a key limited to one
// model gets, for a model another backend serves, exactly the 404 it gets
// for a model nobody serves (status, body and headers but the name), and
// GET /v1/models lists only its model; a key for every model sees both.
func TestModelLimitedKeyCannotTellOtherModelsExist(t *testing.T) {
	const other = "qwen-2.5-7b"
	f := newKeyedFront(t, DefaultConfig(), AuthConfig{Keys: []KeyConfig{
		keyConfig("alpha", keyA, func(k *KeyConfig) { k.Models = []string{testModel}; k.RequestsPerMinute = 1000 }),
		keyConfig("bravo", keyB),
	}}, testModel, other)

	existing, eb := f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyA, completion(other))
	missing, mb := f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyA, completion("no-such-model"))
	if existing.StatusCode != http.StatusNotFound || missing.StatusCode != http.StatusNotFound {
		t.Fatalf("statuses %d (served elsewhere) and %d (served nowhere), want 404 and 404", existing.StatusCode, missing.StatusCode)
	}
	if got, want := string(eb), strings.ReplaceAll(string(mb), "no-such-model", other); got != want {
		t.Errorf("404 bodies differ:\nserved elsewhere: %s\nserved nowhere:   %s", eb, mb)
	}
	for _, h := range []http.Header{existing.Header, missing.Header} {
		h.Del("Date")
		h.Del("X-Request-Id")
		h.Del("Content-Length") // the names differ in length
	}
	if got, want := existing.Header, missing.Header; !equalHeaders(got, want) {
		t.Errorf("404 headers differ:\nserved elsewhere: %v\nserved nowhere:   %v", got, want)
	}
	if n := f.hits[other].count("/v1/completions"); n != 0 {
		t.Errorf("the other model's backend saw %d requests", n)
	}

	models := func(key string) []string {
		resp, b := f.do(t, http.MethodGet, "/v1/models", "Bearer "+key, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/models: status %d; %s", resp.StatusCode, b)
		}
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if got := models(keyA); len(got) != 1 || got[0] != testModel {
		t.Errorf("limited key lists %v, want [%s]", got, testModel)
	}
	if got := models(keyB); len(got) != 2 {
		t.Errorf("unlimited key lists %v, want both models", got)
	}
	if resp, b := f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyA, completion(testModel)); resp.StatusCode != http.StatusOK {
		t.Errorf("limited key on its model: status %d; %s", resp.StatusCode, b)
	}
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb := b[k]
		if strings.Join(va, "\x00") != strings.Join(vb, "\x00") {
			return false
		}
	}
	return true
}

// TestPriorityComesFromKey: with keys configured, a request's priority is
// its key's, and the priority header counts only for a key allowed to set
// it; without keys, the header counts as before.
func TestPriorityComesFromKey(t *testing.T) {
	five, minusOne := 5, -1
	bal := newBal(t, "least-request", balancer.ModelRoute{Name: "chat", Targets: []balancer.ModelTarget{{Model: testModel, Weight: 1}}, Priority: 2})
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry()})
	req := &Request{Kind: KindCompletion, Model: "chat", Canonical: prefix.Parts{Glue: []byte("hi")}}
	tests := []struct {
		name   string
		tenant *tenant
		header string
		want   int
	}{
		{"no keys, no header: the model's", nil, "", 2},
		{"no keys, header", nil, "7", 7},
		{"key with priority", &tenant{priority: &five}, "", 5},
		{"key with priority ignores header", &tenant{priority: &five}, "9", 5},
		{"key without priority: the model's", &tenant{}, "9", 2},
		{"key allowed the header", &tenant{priority: &minusOne, allowPriorityHeader: true}, "9", 9},
		{"key allowed the header, none sent", &tenant{priority: &minusOne, allowPriorityHeader: true}, "", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
			if tt.header != "" {
				r.Header.Set("X-Llmlb-Priority", tt.header)
			}
			breq, _, err := s.balancerRequest(r, req, tt.tenant)
			if err != nil {
				t.Fatal(err)
			}
			if breq.Priority != tt.want {
				t.Errorf("priority %d, want %d", breq.Priority, tt.want)
			}
		})
	}
	// A key that may not set it is not refused for a malformed one either:
	// the header is not read at all.
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Header.Set("X-Llmlb-Priority", "high")
	if _, _, err := s.balancerRequest(r, req, &tenant{}); err != nil {
		t.Errorf("ignored header refused: %v", err)
	}
}

// TestNoKeyOrHashInLogsMetricsOrStatus: requests with a good key, a wrong
// key, a key in the query string and an over-limit key leave their key's
// name in the access log and the per-key metrics, and no key nor any
// form of its hash anywhere: debug logs with prompts, /metrics, the status
// page, /debug/backends.
func TestNoKeyOrHashInLogsMetricsOrStatus(t *testing.T) {
	const queryKey = "sk-llmlb-test-query-0f1e2d3c4b5a6978"
	f := newKeyedFront(t, DefaultConfig(), AuthConfig{Keys: []KeyConfig{
		keyConfig("alpha", keyA, func(k *KeyConfig) { k.RequestsPerMinute = 2 }),
	}}, testModel)
	for range 3 { // the third is over the limit
		f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyA, completion(testModel))
	}
	f.do(t, http.MethodPost, "/v1/chat/completions", "Bearer "+keyA, `{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	f.do(t, http.MethodPost, "/v1/completions", "Bearer "+keyB, completion(testModel))
	f.do(t, http.MethodPost, "/v1/completions?api_key="+queryKey, "", completion(testModel))
	f.do(t, http.MethodGet, "/v1/models?key="+queryKey, "Bearer "+keyB, "")

	admin := httptest.NewServer(f.px.AdminHandler(f.reg))
	defer admin.Close()
	page := func(p string) string {
		resp, err := http.Get(admin.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	metrics, status, backends := page("/metrics"), page("/"), page("/debug/backends")
	logs := f.logs.String()

	for _, want := range []string{
		`llmlb_key_requests_total{key="alpha",status="200"} 2`,
		`llmlb_key_requests_total{key="alpha",status="429"} 2`,
		`llmlb_auth_refused_total{reason="invalid"} 2`,
		`llmlb_auth_refused_total{reason="missing"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(metrics, `llmlb_key_tokens_total{key="alpha",type="completion"}`) {
		t.Error("/metrics lacks the key's completion tokens")
	}
	if !strings.Contains(logs, `"key":"alpha"`) {
		t.Error("the access log does not name the key")
	}
	if !strings.Contains(logs, `"prompt":`) {
		t.Error("the access log has no prompt: this test must run with prompts logged, to catch a key logged with them")
	}
	for _, secret := range []string{keyA, keyB, queryKey} {
		h := HashKey(secret)
		for _, form := range []string{secret, h, strings.TrimPrefix(h, "sha256:"), secret[len(secret)-16:], strings.TrimPrefix(h, "sha256:")[:16]} {
			for where, text := range map[string]string{"logs": logs, "/metrics": metrics, "status page": status, "/debug/backends": backends} {
				if strings.Contains(text, form) {
					t.Errorf("%s contains %q (from a key or its hash)", where, form)
				}
			}
		}
	}
}

// TestAdminTokenGuardsEveryAdminRoute: with admin.token, each admin route
// answers 401 in OpenAI's shape without the token or with another, and
// its page with it.
func TestAdminTokenGuardsEveryAdminRoute(t *testing.T) {
	const token = "admin-token-5e4d3c2b1a09f8e7d6c5"
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: newTestBalancer(t), Registerer: prometheus.NewRegistry()})
	h, err := s.RequireToken(HashKey(token), s.AdminHandler(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	if _, err := s.RequireToken(token, s.AdminHandler(prometheus.NewRegistry())); err == nil || strings.Contains(err.Error(), token) {
		t.Errorf("a plain token as admin.token: err %v, want an error that does not repeat it", err)
	}
	get := func(p, authz string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+p, nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, p := range []string{"/", "/metrics", "/debug/backends", "/debug/pprof/", "/debug/pprof/cmdline"} {
		for _, authz := range []string{"", "Bearer wrong", "Bearer " + HashKey(token), "Basic " + token} {
			code, b := get(p, authz)
			if code != http.StatusUnauthorized {
				t.Errorf("GET %s with %q: status %d, want 401", p, authz, code)
				continue
			}
			openAIError(t, b)
		}
		if code, _ := get(p, "Bearer "+token); code != http.StatusOK {
			t.Errorf("GET %s with the token: status %d, want 200", p, code)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/debug/route", strings.NewReader(completion(testModel)))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /debug/route without the token: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestValidateAuthNeverRepeatsAKey: every problem in auth.keys is
// reported at once, and a value that is not a hash (perhaps a key pasted
// where its hash belongs) is never repeated in the message.
func TestValidateAuthNeverRepeatsAKey(t *testing.T) {
	c := AuthConfig{Keys: []KeyConfig{
		{Name: "alpha", Key: keyA},
		{Name: "alpha", Key: HashKey(keyB)},
		{Name: "has space", Key: HashKey(keyB)},
		{Name: "", Key: "sha256:" + strings.Repeat("z", 64), RequestsPerMinute: -1, TokensPerMinute: -2},
		{Name: "ok", Key: HashKey(keyA), Models: []string{""}},
		{Name: "huge", Key: HashKey("sk-huge-limits-0123456789"), RequestsPerMinute: 2_000_000_000},
	}}
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted bad keys")
	}
	msg := err.Error()
	for _, want := range []string{
		"auth.keys[0].key: must be sha256:",
		`auth.keys[1].name: "alpha" is used twice`,
		"auth.keys[2].key: the same key as an earlier entry",
		`auth.keys[2].name: must be`,
		"auth.keys[3].name: must be",
		"auth.keys[3].key: must be sha256:",
		"auth.keys[3].requests_per_minute: must be 0 (no limit) to 1000000000, got -1",
		"auth.keys[3].tokens_per_minute: must be 0 (no limit) to 1000000000, got -2",
		"auth.keys[5].requests_per_minute: must be 0 (no limit) to 1000000000, got 2000000000",
		"auth.keys[4].models: empty model name",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Validate() lacks %q; got:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, keyA) || strings.Contains(msg, strings.Repeat("z", 64)) {
		t.Errorf("Validate() repeats a key:\n%s", msg)
	}
	if err := (AuthConfig{Keys: []KeyConfig{keyConfig("alpha", keyA), keyConfig("bravo", keyB)}}).Validate(); err != nil {
		t.Errorf("good keys: %v", err)
	}
}

// FuzzBearer: any Authorization value either yields a key that is one
// word of at most 1 KiB after a Bearer scheme, as written, or is refused;
// never a panic.
func FuzzBearer(f *testing.F) {
	for _, s := range []string{"Bearer " + keyA, "bearer  k", "Bearer", "Bearer ", "Basic a", "", "Bearer a b", "Bearer\ta", " Bearer x ", "BEARER x\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{"Authorization": {v}}
		key, err := bearer(h)
		if err != nil {
			if key != "" || (!errors.Is(err, errKeyMissing) && !errors.Is(err, errKeyInvalid)) {
				t.Fatalf("bearer(%q) = %q, %v", v, key, err)
			}
			return
		}
		if key == "" || len(key) > maxKeyBytes || strings.ContainsAny(key, " \t") {
			t.Fatalf("bearer(%q) = %q: not one word of at most %d bytes", v, key, maxKeyBytes)
		}
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimLeft(rest, " ") != key {
			t.Fatalf("bearer(%q) = %q, not the word after the scheme", v, key)
		}
	})
}
