package e2e

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/testcert"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// TestServeHTTPSInFrontOfHTTPSBackend: with tls: and
// proxy.backend_ca_file, llmlb serves HTTPS and reaches an HTTPS backend
// whose certificate a private CA signed, for health checks and metrics
// (the backend becomes ready) and for requests, over HTTP/1.1 even to a
// client that offers HTTP/2; a plain HTTP request to the HTTPS listener is
// refused.
func TestServeHTTPSInFrontOfHTTPSBackend(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	engine, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewUnstartedServer(engine.Handler())
	backend.TLS = ca.ServerTLS(t, 2, "127.0.0.1")
	backend.StartTLS()
	defer backend.Close()

	fc, fk := ca.Issue(t, 3, "127.0.0.1")
	cfg := testConfig([]string{backend.URL})
	cfg.TLS = proxy.TLSConfig{CertFile: testcert.Write(t, dir, "front.pem", fc), KeyFile: testcert.Write(t, dir, "front-key.pem", fk)}
	cfg.Proxy.BackendCAFile = testcert.Write(t, dir, "ca.pem", ca.PEM)
	inst := startTest(t, cfg, 1)
	if inst.Scheme != "https" {
		t.Errorf("scheme %q, want https", inst.Scheme)
	}

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, ForceAttemptHTTP2: true} // offers h2; gets HTTP/1.1
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	resp, err := client.Post("https://"+inst.Addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.Proto != "HTTP/1.1" {
		t.Fatalf("HTTPS request: status %d, TLS %v, %s; want 200 over TLS, HTTP/1.1; %s", resp.StatusCode, resp.TLS != nil, resp.Proto, b)
	}
	plain, err := http.Get("http://" + inst.Addr + "/health")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Error("plain HTTP to the HTTPS listener was served")
		}
	}
}
