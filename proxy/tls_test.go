package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/testcert"
	"github.com/llmlb/llmlb/sim"
)

// heldStream sends a stream's first event and holds the rest until
// release is closed.
func heldStream(release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"text":"a"}]}`+"\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, `data: {"choices":[{"text":"b"}]}`+"\n\ndata: [DONE]\n\n")
	})
}

// serial is the serial number of the certificate the server presented.
func serial(t *testing.T, resp *http.Response) int64 {
	t.Helper()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		t.Fatal("no TLS certificate on the response")
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
}

// TestCertificateRotatesWithoutDroppingConnections: the client listener
// serves the certificate in its files; new files are served to new
// connections within the check interval, while a stream that started on
// a connection made before the rotation ends whole and its connection
// stays usable; a pair that does not load (a certificate whose key is not
// written yet) leaves the one in force serving until a good pair comes.
// In a synctest bubble, so the interval passes on the fake clock.
func TestCertificateRotatesWithoutDroppingConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		ca := testcert.NewCA(t)
		c1, k1 := ca.Issue(t, 1, "llmlb")
		certFile, keyFile := testcert.Write(t, dir, "cert.pem", c1), testcert.Write(t, dir, "key.pem", k1)
		release := make(chan struct{})
		f := newBubbleFront(t, DefaultConfig(), "least-request", map[string]http.Handler{"b": heldStream(release)}, "b")
		defer f.close()
		cr, err := NewCertReloader(TLSConfig{CertFile: certFile, KeyFile: keyFile}, nil)
		if err != nil {
			t.Fatal(err)
		}
		hs := f.px.HTTPServer(nil)
		hs.TLSConfig = cr.TLSConfig()
		go hs.Serve(tls.NewListener(f.net.Listen("llmlb:443"), hs.TLSConfig))
		f.servers = append(f.servers, hs)
		newClient := func() *http.Client {
			tr := &http.Transport{DialContext: f.net.DialContext, TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "llmlb"}}
			t.Cleanup(tr.CloseIdleConnections)
			return &http.Client{Transport: tr}
		}
		health := func(c *http.Client) int64 {
			t.Helper()
			resp, err := c.Get("https://llmlb:443/health")
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return serial(t, resp)
		}

		old := newClient()
		resp, err := old.Post("https://llmlb:443/v1/completions", "application/json", strings.NewReader(body("completion", `,"stream":true`)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if got := serial(t, resp); got != 1 {
			t.Fatalf("first certificate: serial %d, want 1", got)
		}
		rd := bufio.NewReader(resp.Body)
		if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("stream start %q %v", line, err)
		}

		c2, k2 := ca.Issue(t, 2, "llmlb")
		testcert.Write(t, dir, "cert.pem", c2)
		testcert.Write(t, dir, "key.pem", k2)
		if got := health(newClient()); got != 1 {
			t.Errorf("within the check interval: serial %d, want 1", got)
		}
		advance(certCheckInterval)
		if got := health(newClient()); got != 2 {
			t.Errorf("after the rotation: new connection got serial %d, want 2", got)
		}

		close(release)
		rest, err := io.ReadAll(rd)
		if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("the stream that began before the rotation was cut: %v %q", err, rest)
		}
		resp.Body.Close()
		if got := health(old); got != 1 {
			t.Errorf("the connection made before the rotation: serial %d, want 1 (the same connection, kept)", got)
		}

		// Half a rotation: the new certificate without its key.
		c3, k3 := ca.Issue(t, 3, "llmlb")
		testcert.Write(t, dir, "cert.pem", c3)
		advance(certCheckInterval)
		if got := health(newClient()); got != 2 {
			t.Errorf("with a certificate and a key that do not match: serial %d, want 2 (the one in force)", got)
		}
		testcert.Write(t, dir, "key.pem", k3)
		advance(certCheckInterval)
		if got := health(newClient()); got != 3 {
			t.Errorf("once the key is written too: serial %d, want 3", got)
		}
	})
}

// TestHTTPSBackendWithCAAndClientCert: a backend that serves HTTPS with a
// certificate from a private CA and asks for a client certificate is
// reached with proxy.backend_ca_file and backend_cert_file/key_file; with
// no CA the proxy refuses its certificate, and with no client certificate
// the backend refuses the proxy: 502 either way.
func TestHTTPSBackendWithCAAndClientCert(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	cc, ck := ca.Issue(t, 11, "llmlb")
	engine, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewUnstartedServer(engine.Handler())
	backend.TLS = ca.ServerTLS(t, 10, "127.0.0.1")
	backend.TLS.ClientAuth, backend.TLS.ClientCAs = tls.RequireAndVerifyClientCert, ca.Pool()
	backend.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below
	backend.StartTLS()
	defer backend.Close()
	if !strings.HasPrefix(backend.URL, "https://") {
		t.Fatalf("backend URL %s", backend.URL)
	}

	full := DefaultConfig()
	full.BackendCAFile = testcert.Write(t, dir, "ca.pem", ca.PEM)
	full.BackendCertFile = testcert.Write(t, dir, "client.pem", cc)
	full.BackendKeyFile = testcert.Write(t, dir, "client-key.pem", ck)
	noClientCert := full
	noClientCert.BackendCertFile, noClientCert.BackendKeyFile = "", ""
	tests := []struct {
		name       string
		cfg        Config
		wantStatus int
	}{
		{"CA and client certificate", full, http.StatusOK},
		{"no client certificate", noClientCert, http.StatusBadGateway},
		{"system roots", DefaultConfig(), http.StatusBadGateway},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc, err := tt.cfg.BackendTLS()
			if err != nil {
				t.Fatal(err)
			}
			px := newServer(t, Options{Config: tt.cfg, Balancer: newTestBalancer(t, backend.URL), Registerer: prometheus.NewRegistry(), BackendTLS: tc})
			front := httptest.NewServer(px.Handler())
			defer front.Close()
			resp := post(t.Context(), t, front.URL+"/v1/completions", body("completion", `,"max_tokens":3`))
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d; %s", resp.StatusCode, tt.wantStatus, b)
			}
		})
	}
	bad := full
	bad.BackendCAFile = testcert.Write(t, dir, "empty.pem", []byte("not pem"))
	if _, err := bad.BackendTLS(); err == nil {
		t.Error("BackendTLS accepted a CA file with no certificate")
	}
}

// TestValidateTLSPairs: a certificate file goes with its key file, on the
// client listener and towards backends.
func TestValidateTLSPairs(t *testing.T) {
	if err := (TLSConfig{CertFile: "c.pem"}).Validate(); err == nil || !strings.Contains(err.Error(), "tls: cert_file and key_file") {
		t.Errorf("tls with a certificate and no key: %v", err)
	}
	if err := (TLSConfig{CertFile: "c.pem", KeyFile: "k.pem"}).Validate(); err != nil {
		t.Errorf("tls with both: %v", err)
	}
	c := DefaultConfig()
	c.BackendKeyFile = "k.pem"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "proxy.backend_cert_file") {
		t.Errorf("backend key without certificate: %v", err)
	}
	if _, err := NewCertReloader(TLSConfig{CertFile: t.TempDir() + "/none.pem", KeyFile: "k.pem"}, nil); err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Errorf("missing certificate file: %v", err)
	}
}
