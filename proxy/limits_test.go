package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBodySlowlorisDoesNotStopRealRequests: 300 connections that send a
// request's headers, announce a body and send nothing do not keep real
// requests from being served, and each is answered 408 and closed within
// proxy.body_read_timeout (plus scheduling slack on a loaded machine).
func TestBodySlowlorisDoesNotStopRealRequests(t *testing.T) {
	rb := newRecordingBackend(t)
	cfg := DefaultConfig()
	cfg.BodyReadTimeout = 2 * time.Second
	front := newServedFront(t, cfg, rb.URL)
	addr := front.Listener.Addr().String()
	const idle, slack = 300, 3 * time.Second

	type result struct {
		status int
		took   time.Duration
		err    error
	}
	results := make(chan result, idle)
	opened := make(chan struct{}, idle)
	var wg sync.WaitGroup
	for range idle {
		wg.Go(func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				opened <- struct{}{}
				results <- result{err: err}
				return
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(cfg.BodyReadTimeout + 20*time.Second))
			start := time.Now()
			_, err = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
			opened <- struct{}{}
			if err != nil {
				results <- result{err: err}
				return
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				results <- result{err: err, took: time.Since(start)}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			// Then the server closes the connection.
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				results <- result{err: errors.New("connection still open after the 408"), took: time.Since(start)}
				return
			}
			results <- result{status: resp.StatusCode, took: time.Since(start)}
		})
	}
	for range idle {
		<-opened
	}

	// Real requests, while every idle connection is open.
	for i := range 10 {
		resp := post(t.Context(), t, front.URL+"/v1/completions", body("completion", ""))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("real request %d: status %d, want 200", i, resp.StatusCode)
		}
	}
	if n := rb.hits.Load(); n != 10 {
		t.Errorf("backend saw %d requests, want the 10 real ones", n)
	}

	wg.Wait()
	close(results)
	var late, failed int
	for r := range results {
		switch {
		case r.err != nil || r.status != http.StatusRequestTimeout:
			failed++
			if failed <= 3 {
				t.Errorf("idle connection: status %d, %v after %s; want 408 and a close", r.status, r.err, r.took)
			}
		case r.took > cfg.BodyReadTimeout+slack:
			late++
			if late <= 3 {
				t.Errorf("idle connection closed after %s, want within %s (+%s slack)", r.took, cfg.BodyReadTimeout, slack)
			}
		}
	}
	if failed+late > 0 {
		t.Errorf("%d of %d idle connections not answered 408, %d closed late", failed, idle, late)
	}
}

// TestUnreadBodyOnUnknownRouteIsBounded: a client that announces a body to
// a route nobody serves, and never sends it, is still cut off within the
// body timeout (net/http reads the unread body after the handler).
func TestUnreadBodyOnUnknownRouteIsBounded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BodyReadTimeout = 500 * time.Millisecond
	front := newServedFront(t, cfg, newRecordingBackend(t).URL)
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	io.WriteString(conn, "POST /v1/load_lora_adapter HTTP/1.1\r\nHost: llmlb\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("connection not closed: %v", err)
	}
	if d := time.Since(start); d > cfg.BodyReadTimeout+3*time.Second {
		t.Errorf("connection closed after %s, want within %s", d, cfg.BodyReadTimeout)
	}
}

// TestClientHeadersAreNotForwarded: x-llmlb-* and forwarding headers a
// client sends never reach the backend; X-Forwarded-For is the proxy's own,
// from the connection. A backend's x-llmlb-* headers do not reach the
// client.
func TestClientHeadersAreNotForwarded(t *testing.T) {
	rb := newRecordingBackend(t)
	front := newServedFront(t, DefaultConfig(), rb.URL)
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/completions", strings.NewReader(body("completion", "")))
	sent := map[string]string{
		"X-Llmlb-Priority":         "5",
		"X-Llmlb-Backend":          "http://elsewhere",
		"X-Llmlb-Anything":         "x",
		"X_Llmlb_Priority":         "9",
		"X-Real-Ip":                "6.6.6.6",
		"X-Forwarded-For":          "6.6.6.6",
		"X-Forwarded-Host":         "evil.example",
		"X-Forwarded-Proto":        "https",
		"X-Forwarded-Port":         "443",
		"X-Forwarded-Prefix":       "/admin",
		"Forwarded":                "for=6.6.6.6;proto=https",
		"True-Client-Ip":           "6.6.6.6",
		"X-Client-Ip":              "6.6.6.6",
		"X-Original-Forwarded-For": "6.6.6.6",
		"Cf-Connecting-Ip":         "6.6.6.6",
	}
	for k, v := range sent {
		req.Header[k] = []string{v}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Custom", "kept")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got := rb.lastRequest()
	if got == nil {
		t.Fatal("request did not reach the backend")
	}
	for k := range sent {
		if v, ok := got.Header[k]; ok && k != "X-Forwarded-For" && k != "X-Forwarded-Host" && k != "X-Forwarded-Proto" {
			t.Errorf("backend got %s: %q, want it removed", k, v)
		}
	}
	if xff := got.Header.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != "127.0.0.1" {
		t.Errorf("backend got X-Forwarded-For %q, want the connection's 127.0.0.1 alone", xff)
	}
	if h := got.Header.Get("X-Forwarded-Host"); h == "evil.example" {
		t.Errorf("backend got the client's X-Forwarded-Host %q", h)
	}
	if h := got.Header.Get("X-Forwarded-Proto"); h != "http" {
		t.Errorf("backend got X-Forwarded-Proto %q, want http", h)
	}
	if got.Header.Get("X-Custom") != "kept" {
		t.Error("an ordinary header was not forwarded")
	}
	if h := resp.Header.Get(HeaderBackend); h != "b1" { // the only backend's default name
		t.Errorf("client got %s %q, want the proxy's %q", HeaderBackend, h, "b1")
	}
}

// TestBackendHeadersCanBeTurnedOff: with proxy.backend_headers false no
// answer names a backend or a reason, not even one a backend sent itself.
func TestBackendHeadersCanBeTurnedOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BackendHeaders = false
	front := newServedFront(t, cfg, newRecordingBackend(t).URL, deadURL(t))
	for range 4 { // some attempts go through the dead backend first
		resp := post(t.Context(), t, front.URL+"/v1/completions", body("completion", ""))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200", resp.StatusCode)
		}
		for k := range resp.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-llmlb-") {
				t.Errorf("answer carries %s: %q, want no x-llmlb-* header", k, resp.Header.Get(k))
			}
		}
	}
}

// TestInferenceRoutesAreForwardedAndAdminRoutesOnlyWhenListed: every
// default inference route reaches the backend at its own path; an engine
// administration route is 404 until proxy.extra_routes lists it.
func TestInferenceRoutesAreForwardedAndAdminRoutesOnlyWhenListed(t *testing.T) {
	rb := newRecordingBackend(t)
	front := newServedFront(t, DefaultConfig(), rb.URL)
	for _, p := range InferenceRoutes() {
		resp := post(t.Context(), t, front.URL+p, body("completion", ""))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("POST %s: status %d, want 200", p, resp.StatusCode)
		} else if got := rb.lastRequest().URL.Path; got != p {
			t.Errorf("POST %s reached the backend as %s", p, got)
		}
	}
	lora := `{"model":"` + testModel + `","lora_name":"x","lora_path":"/tmp/x"}`
	before := rb.hits.Load()
	checkOpenAIError(t, post(t.Context(), t, front.URL+"/v1/load_lora_adapter", lora), http.StatusNotFound)
	if rb.hits.Load() != before {
		t.Error("/v1/load_lora_adapter reached the backend by default")
	}

	cfg := DefaultConfig()
	cfg.ExtraRoutes = []string{"/v1/load_lora_adapter"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	listed := newServedFront(t, cfg, rb.URL)
	resp := post(t.Context(), t, listed.URL+"/v1/load_lora_adapter", lora)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || rb.lastRequest().URL.Path != "/v1/load_lora_adapter" {
		t.Errorf("listed /v1/load_lora_adapter: status %d, backend path %s; want 200 at that path", resp.StatusCode, rb.lastRequest().URL.Path)
	}
	checkOpenAIError(t, post(t.Context(), t, listed.URL+"/v1/unload_lora_adapter", lora), http.StatusNotFound)
}

func TestValidateRejectsBadLimitsAndRoutes(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"relative route", func(c *Config) { c.ExtraRoutes = []string{"v1/x"} }, `"v1/x" must be an exact path`},
		{"wildcard route", func(c *Config) { c.ExtraRoutes = []string{"/v1/*"} }, `"/v1/*" must be an exact path`},
		{"dot segment", func(c *Config) { c.ExtraRoutes = []string{"/v1/../x"} }, `"/v1/../x" must be an exact path`},
		{"built-in route", func(c *Config) { c.ExtraRoutes = []string{"/v1/embeddings"} }, `"/v1/embeddings" is already served`},
		{"twice", func(c *Config) { c.ExtraRoutes = []string{"/sleep", "/sleep"} }, `"/sleep" is listed twice`},
		{"no body timeout", func(c *Config) { c.BodyReadTimeout = 0 }, "proxy.body_read_timeout: must be positive"},
		{"negative stall", func(c *Config) { c.StreamIdleTimeout = -time.Second }, "proxy.stream_idle_timeout: must not be negative"},
		{"tiny header limit", func(c *Config) { c.MaxHeaderBytes = 100 }, "proxy.max_header_bytes: must be 1024..1048576"},
		{"no headers", func(c *Config) { c.MaxHeaderCount = 0 }, "proxy.max_header_count: must be 8..10000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v, want nil", err)
	}
}
