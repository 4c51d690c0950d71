package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// kvBackends starts n emulated vLLM servers that publish their KV-cache
// events over ZeroMQ, as vLLM does with --kv-events-config, and returns
// their backend entries.
func kvBackends(t *testing.T, n int) []scrape.BackendConfig {
	t.Helper()
	cfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	var out []scrape.BackendConfig
	for range n {
		live := sim.NewLive(cfg, 100)
		pub, err := sim.NewKVPublisher(t.Context(), "127.0.0.1:0", "127.0.0.1:0", cfg.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		live.PublishKV(pub)
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, live)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		out = append(out, scrape.BackendConfig{URL: srv.URL, KVEvents: pub.Endpoint(), KVEventsReplay: pub.ReplayEndpoint()})
	}
	return out
}

// waitSubscribed sends prompts straight to each backend until every
// llmlb instance at admins has taken a batch of KV events from every one.
// A subscriber misses what was published before it connected (ZeroMQ's
// PUB drops it) until a later batch makes it ask for the replay, so a test
// that publishes once must first know the subscriptions are up.
func waitSubscribed(t *testing.T, backends []scrape.BackendConfig, admins ...string) {
	t.Helper()
	n := 0
	if !waitFor(time.Minute, func() bool {
		up := true
		for _, bc := range backends {
			for _, admin := range admins {
				if got, _ := sum(scrapeAdmin(t, admin), "llmlb_kv_event_batches_total", bc.URL); got > 0 {
					continue
				}
				up = false
				n++
				body := fmt.Sprintf(`{"model":%q,"prompt":"warm-up %d: %s","max_tokens":1}`, testModel, n, strings.Repeat("w", 128))
				resp, err := http.Post(bc.URL+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		return up
	}) {
		t.Fatal("the KV-event subscriptions did not deliver a batch within a minute")
	}
}

// TestReplicasShareWhatTheServersHold: two llmlb instances that never talk
// front the same four servers, which publish their KV-cache events. A
// prompt sent through one is, once its server has cached it, matched by
// the other to that server, token for token as the server's /tokenize
// counts them, and a longer prompt that extends it goes there through the
// other; the other's own prompt-text index never saw it.
func TestReplicasShareWhatTheServersHold(t *testing.T) {
	backends := kvBackends(t, 4)
	cfg := testConfig(nil)
	cfg.Backends = backends
	a, b := startTest(t, cfg, 4), startTest(t, cfg, 4)
	waitSubscribed(t, backends, a.AdminAddr, b.AdminAddr)

	prompt := strings.Repeat("a long shared document that one replica placed; ", 200) // 2,450 tokens
	body := func(p string) string {
		q, _ := json.Marshal(p)
		return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2}`, testModel, q)
	}
	resp, err := http.Post("http://"+a.Addr+"/v1/completions", "application/json", strings.NewReader(body(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	holder := resp.Header.Get("x-llmlb-backend")
	if resp.StatusCode != http.StatusOK || holder == "" {
		t.Fatalf("through a: status %d, backend %q", resp.StatusCode, holder)
	}
	holderURL := backendURL(backends, holder)

	longer := prompt + "and the question that follows it"
	// The server caches whole blocks of 16 tokens, all but the prompt's
	// last token.
	matched := waitMatched(t, b.AdminAddr, body(longer), holderURL, len(prompt)/sim.BytesPerToken-16, "the prompt")
	for id, m := range matched {
		if id != holderURL && m > 0 {
			t.Errorf("b matches %d tokens on %s, which never saw the prompt", m, id)
		}
	}
	resp, err = http.Post("http://"+b.Addr+"/v1/completions", "application/json", strings.NewReader(body(longer)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Get("x-llmlb-backend"); got != holder {
		t.Errorf("through b the longer prompt went to %s, not to %s, which holds its start", got, holder)
	}

	// A chat: its messages go to /tokenize whole and are rendered by the
	// server's own template, and its next turn is matched through b.
	doc := strings.Repeat("a contract clause that the whole conversation is about; ", 120)
	turn1 := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]}`, testModel, doc)
	resp, err = http.Post("http://"+a.Addr+"/v1/chat/completions", "application/json", strings.NewReader(turn1))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	chatHolder := backendURL(backends, resp.Header.Get("x-llmlb-backend"))
	turn2 := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q},{"role":"assistant","content":"noted"},{"role":"user","content":"and clause two?"}]}`, testModel, doc)
	waitMatched(t, b.AdminAddr, turn2, chatHolder, len(doc)/sim.BytesPerToken-16, "the chat's first turn")
	ss := scrapeAdmin(t, b.AdminAddr)
	if ok, _ := sum(ss, "llmlb_tokenize_requests_total", `result="ok"`); ok < 2 {
		t.Errorf("b counted %v /tokenize requests answered, want 2 or more", ok)
	}
	if n, _ := sum(ss, "llmlb_kv_event_batches_total", holderURL); n < 1 {
		t.Errorf("b counted %v event batches from %s", n, holderURL)
	}
	if n, _ := sum(ss, "llmlb_kv_event_blocks", holderURL); n < float64(len(prompt)/sim.BytesPerToken/16) {
		t.Errorf("b's gauge says %s holds %v blocks, fewer than the prompt's", holderURL, n)
	}
}

// backendURL is the URL of the backend llmlb names name (b1, b2, ... in
// config order).
func backendURL(backends []scrape.BackendConfig, name string) string {
	for i, bc := range backends {
		if name == fmt.Sprintf("b%d", i+1) {
			return bc.URL
		}
	}
	return ""
}

// waitMatched asks adminAddr's /debug/route for body until the backend at
// url is matched at least want tokens, and returns every backend's match
// then; what is for the failure message.
func waitMatched(t *testing.T, adminAddr, body, url string, want int, what string) map[string]int {
	t.Helper()
	var matched map[string]int
	if !waitFor(time.Minute, func() bool {
		matched = routeMatches(t, adminAddr, body)
		return matched[url] >= want
	}) {
		t.Fatalf("never learned that %s holds %s: matched %v", url, what, matched)
	}
	return matched
}

// routeMatches asks adminAddr's /debug/route for body and returns how many
// of its prompt tokens the balancer matches on each candidate backend.
func routeMatches(t *testing.T, adminAddr, body string) map[string]int {
	t.Helper()
	resp, err := http.Post("http://"+adminAddr+"/debug/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var route struct {
		Explanation balancer.Explanation `json:"explanation"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&route); err != nil {
		t.Fatal(err)
	}
	matched := map[string]int{}
	for _, be := range route.Explanation.Backends {
		if be.Candidate != nil {
			matched[be.ID] = be.Candidate.MatchedTokens
		}
	}
	return matched
}

// TestTokenizeFailuresDoNotFailRequests: servers that cannot tokenize (no
// /tokenize, as an older vLLM or another engine) behind llmlb reading
// their KV events: llmlb asks, every request is answered all the same,
// and every failed ask is counted. That after a failure llmlb stops
// asking for a while, and for how long, is proxy's
// TestTokenizeFailuresPause, in virtual time.
func TestTokenizeFailuresDoNotFailRequests(t *testing.T) {
	backends := kvBackends(t, 2)
	var calls atomic.Int64
	for i, bc := range backends {
		u, err := url.Parse(bc.URL)
		if err != nil {
			t.Fatal(err)
		}
		rp := httputil.NewSingleHostReverseProxy(u)
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/tokenize" {
				calls.Add(1)
				http.NotFound(w, r)
				return
			}
			rp.ServeHTTP(w, r)
		}))
		t.Cleanup(front.Close)
		backends[i].URL = front.URL
	}
	cfg := testConfig(nil)
	cfg.Backends = backends
	inst := startTest(t, cfg, 2)
	waitSubscribed(t, backends, inst.AdminAddr)
	send := func(p string) {
		t.Helper()
		resp, err := http.Post("http://"+inst.Addr+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, testModel, p)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	send(strings.Repeat("fill a cache block or two; ", 40))
	// Tokenizing starts once some backend has stored a block.
	if !waitFor(time.Minute, func() bool {
		n, _ := sum(scrapeAdmin(t, inst.AdminAddr), "llmlb_kv_event_blocks")
		return n > 0
	}) {
		t.Fatal("no backend's events stored a block within a minute")
	}
	for i := range 5 {
		send(fmt.Sprintf("prompt %d: %s", i, strings.Repeat("x", 200)))
	}
	if n := calls.Load(); n < 1 {
		t.Errorf("/tokenize asked %d times for 5 requests, want at least once", n)
	}
	if n, _ := sum(scrapeAdmin(t, inst.AdminAddr), "llmlb_tokenize_requests_total", `result="error"`); n != float64(calls.Load()) {
		t.Errorf("llmlb_tokenize_requests_total{result=error} = %v, want %d", n, calls.Load())
	}
}
