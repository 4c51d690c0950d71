package proxy

import (
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// usageBackend answers every completion with the usage a vLLM server
// would report for it: 10 prompt and 50 completion tokens.
func usageBackend() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "999") // a backend's own: not the client's
		io.WriteString(w, `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`)
	})
}

// keyedPost sends a completion with key and returns the status, the
// headers and the body.
func (f *bubbleFront) keyedPost(t *testing.T, key string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://llmlb:80/v1/completions", strings.NewReader(completion(testModel)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestKeyRateLimitsAnswer429AndRecover: a key over its requests per
// minute, or over its tokens per minute as the backend's usage reports
// them, gets 429 in OpenAI's shape with Retry-After, retry-after-ms and
// the x-ratelimit-* headers OpenAI clients read; every answer carries the
// headers; once the time Retry-After named has passed the key is served
// again, and after a quiet minute its whole allowance is back. Another
// key is not affected. In a synctest bubble: the minute is the fake
// clock's.
func TestKeyRateLimitsAnswer429AndRecover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newBubbleFront(t, DefaultConfig(), "least-request", map[string]http.Handler{"b": usageBackend()}, "b")
		defer f.close()
		if err := f.px.SetAuth(AuthConfig{Keys: []KeyConfig{
			keyConfig("alpha", keyA, func(k *KeyConfig) { k.RequestsPerMinute = 3 }),
			keyConfig("bravo", keyB, func(k *KeyConfig) { k.TokensPerMinute = 100 }),
		}}); err != nil {
			t.Fatal(err)
		}

		// Requests: three a minute, one back every 20s.
		for i, wantRemaining := range []string{"2", "1", "0"} {
			code, h, b := f.keyedPost(t, keyA)
			if code != http.StatusOK {
				t.Fatalf("request %d: status %d, want 200; %s", i, code, b)
			}
			if got := h.Values("X-Ratelimit-Remaining-Requests"); len(got) != 1 || got[0] != wantRemaining {
				t.Errorf("request %d: x-ratelimit-remaining-requests %q, want [%s]", i, got, wantRemaining)
			}
			if got := h.Get("X-Ratelimit-Limit-Requests"); got != "3" {
				t.Errorf("request %d: x-ratelimit-limit-requests %q, want 3", i, got)
			}
			if h.Get("X-Ratelimit-Limit-Tokens") != "" {
				t.Errorf("request %d: a tokens limit header for a key without one", i)
			}
		}
		code, h, b := f.keyedPost(t, keyA)
		if code != http.StatusTooManyRequests {
			t.Fatalf("fourth request: status %d, want 429; %s", code, b)
		}
		eb := openAIError(t, []byte(b))
		if eb.Error.Type != "requests" || eb.Error.Code == nil || *eb.Error.Code != "rate_limit_exceeded" {
			t.Errorf("429 error %+v, want type requests, code rate_limit_exceeded", eb.Error)
		}
		for name, want := range map[string]string{"Retry-After": "20", "Retry-After-Ms": "20000",
			"X-Ratelimit-Limit-Requests": "3", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "1m0s"} {
			if got := h.Get(name); got != want {
				t.Errorf("429 %s = %q, want %q", name, got, want)
			}
		}
		if code, _, b := f.keyedPost(t, keyB); code != http.StatusOK {
			t.Errorf("another key: status %d; %s", code, b)
		}
		advance(20*time.Second - time.Millisecond)
		if code, _, _ := f.keyedPost(t, keyA); code != http.StatusTooManyRequests {
			t.Errorf("just before Retry-After: status %d, want 429", code)
		}
		advance(time.Millisecond)
		if code, h, b := f.keyedPost(t, keyA); code != http.StatusOK || h.Get("X-Ratelimit-Remaining-Requests") != "0" {
			t.Errorf("at Retry-After: status %d, remaining %q, want 200 and 0; %s", code, h.Get("X-Ratelimit-Remaining-Requests"), b)
		}
		advance(time.Minute)
		if code, h, _ := f.keyedPost(t, keyA); code != http.StatusOK || h.Get("X-Ratelimit-Remaining-Requests") != "2" {
			t.Errorf("after a quiet minute: status %d, remaining %q, want 200 and 2", code, h.Get("X-Ratelimit-Remaining-Requests"))
		}

		// Tokens: 100 a minute; each answer reports 60, of which the
		// prompt's estimate (4) was taken at admission. bravo sent one
		// request above: 40 left, so one more is admitted and leaves the
		// key 20 in debt; the next needs 4 more: 24/100 of a minute.
		advance(time.Minute)
		code, h, b = f.keyedPost(t, keyB)
		if code != http.StatusOK || h.Get("X-Ratelimit-Limit-Tokens") != "100" || h.Get("X-Ratelimit-Remaining-Tokens") != "96" {
			t.Fatalf("tokens: status %d, limit %q, remaining %q, want 200, 100, 96; %s", code, h.Get("X-Ratelimit-Limit-Tokens"), h.Get("X-Ratelimit-Remaining-Tokens"), b)
		}
		if code, h, _ := f.keyedPost(t, keyB); code != http.StatusOK || h.Get("X-Ratelimit-Remaining-Tokens") != "36" {
			t.Fatalf("second: status %d, remaining tokens %q, want 200 and 36", code, h.Get("X-Ratelimit-Remaining-Tokens"))
		}
		code, h, b = f.keyedPost(t, keyB)
		if code != http.StatusTooManyRequests {
			t.Fatalf("over the tokens limit: status %d, want 429; %s", code, b)
		}
		if eb := openAIError(t, []byte(b)); eb.Error.Type != "tokens" {
			t.Errorf("429 type %q, want tokens", eb.Error.Type)
		}
		if h.Get("Retry-After") != "15" || h.Get("Retry-After-Ms") != "14400" || h.Get("X-Ratelimit-Remaining-Tokens") != "0" {
			t.Errorf("429: Retry-After %q, retry-after-ms %q, remaining %q; want 15, 14400, 0", h.Get("Retry-After"), h.Get("Retry-After-Ms"), h.Get("X-Ratelimit-Remaining-Tokens"))
		}
		advance(14400 * time.Millisecond)
		if code, _, b := f.keyedPost(t, keyB); code != http.StatusOK {
			t.Errorf("after Retry-After: status %d; %s", code, b)
		}
		// A request refused before any backend had it gives its tokens
		// back, not its request.
		advance(time.Minute) // and every handler has finished and charged its key
		bravo := f.px.auth.ring.Load().tenants[1].limiter
		tokensLeft := func() int {
			bravo.mu.Lock()
			defer bravo.mu.Unlock()
			return bravo.tokens.remaining(time.Now())
		}
		before := tokensLeft()
		req, _ := http.NewRequest(http.MethodPost, "http://llmlb:80/v1/completions", strings.NewReader(completion("no-such-model")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+keyB)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Ratelimit-Remaining-Tokens") != strconv.Itoa(before-4) {
			t.Errorf("unknown model: status %d, remaining tokens %q; want 404 and %d while it ran", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining-Tokens"), before-4)
		}
		synctest.Wait()
		if after := tokensLeft(); after != before {
			t.Errorf("tokens left %d after a refused request, want %d (given back)", after, before)
		}
		if got := testutil.ToFloat64(f.px.authMetrics.tokens.WithLabelValues("bravo", "completion")); got != 200 {
			t.Errorf("bravo's completion tokens %g, want 200 (four answers of 50)", got)
		}
		if got := testutil.ToFloat64(f.px.authMetrics.requests.WithLabelValues("alpha", "429")); got != 2 {
			t.Errorf("alpha's 429s %g, want 2", got)
		}
		for _, be := range f.px.bal.Snapshot().Backends {
			if n := be.Ledger.InFlight(); n != 0 {
				t.Errorf("backend %s in flight = %d, want 0", be.ID, n)
			}
		}
	})
}

// TestLimiterKeepsUseAcrossReload: a reload that keeps a key (by name)
// keeps what it has used, and lowering its limit caps what is left.
func TestLimiterKeepsUseAcrossReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // one instant: time.Now stands still
		s := newServer(t, Options{Config: DefaultConfig(), Balancer: newTestBalancer(t), Registerer: prometheus.NewRegistry()})
		cfg := func(rpm int) AuthConfig {
			return AuthConfig{Keys: []KeyConfig{keyConfig("alpha", keyA, func(k *KeyConfig) { k.RequestsPerMinute = rpm })}}
		}
		if err := s.SetAuth(cfg(10)); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		l := s.auth.ring.Load().tenants[0].limiter
		for range 4 {
			if _, err := l.admit(now, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SetAuth(cfg(10)); err != nil {
			t.Fatal(err)
		}
		q, err := s.auth.ring.Load().tenants[0].limiter.admit(now, 1)
		if err != nil || q.requests.remaining != 5 {
			t.Fatalf("after a reload: remaining %d (%v), want 5", q.requests.remaining, err)
		}
		if err := s.SetAuth(cfg(3)); err != nil {
			t.Fatal(err)
		}
		q, err = s.auth.ring.Load().tenants[0].limiter.admit(now, 1)
		if err != nil || q.requests.remaining != 2 || q.requests.limit != 3 {
			t.Fatalf("after lowering the limit: %+v (%v), want limit 3, remaining 2", q.requests, err)
		}
	})
}

// TestBucketSaturatesInsteadOfOverflowing: usage far beyond any limit (a
// backend may report anything) leaves the key in long debt, never with
// its allowance back through an overflow.
func TestBucketSaturatesInsteadOfOverflowing(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var l limiter
	l.setLimits(now, 0, 1)
	for _, n := range []int{math.MaxInt, math.MaxInt, 1 << 40} {
		l.charge(now, n)
		q, err := l.admit(now.Add(time.Hour), 1)
		if err == nil || q.tokens.remaining != 0 || q.tokens.reset < 100*365*24*time.Hour {
			t.Fatalf("after charging %d: %+v, %v; want refused, nothing left, a reset a century away", n, q.tokens, err)
		}
	}
	l.charge(now, math.MinInt) // a refund as large as can be: the debt is gone, to within a unit
	if q, err := l.admit(now.Add(time.Minute), 1); err != nil || q.tokens.limit != 1 {
		t.Errorf("a minute after the refund: %+v, %v; want admitted", q.tokens, err)
	}
}

// TestOtherRoutesCountTheirBodyAgainstTokens: on a route whose usage llmlb
// does not read (embeddings), a request takes its body's bytes/4 from the
// key's tokens, and that stands: the next one that does not fit gets 429.
func TestOtherRoutesCountTheirBodyAgainstTokens(t *testing.T) {
	f := newKeyedFront(t, DefaultConfig(), AuthConfig{Keys: []KeyConfig{
		keyConfig("alpha", keyA, func(k *KeyConfig) { k.TokensPerMinute = 100 }),
	}}, testModel)
	input := `{"model":"` + testModel + `","input":"` + strings.Repeat("word ", 50) + `"}` // ~290 bytes: ~72 tokens
	resp, b := f.do(t, http.MethodPost, "/v1/embeddings", "Bearer "+keyA, input)
	if resp.StatusCode == http.StatusTooManyRequests || resp.Header.Get("X-Ratelimit-Remaining-Tokens") != strconv.Itoa(100-(len(input)+3)/4) {
		t.Fatalf("first: status %d, remaining tokens %q, want %d; %s", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining-Tokens"), 100-(len(input)+3)/4, b)
	}
	if resp, b := f.do(t, http.MethodPost, "/v1/embeddings", "Bearer "+keyA, input); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("second: status %d, want 429; %s", resp.StatusCode, b)
	}
}
