package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/internal/testcert"
)

// holdBackend answers at once, except requests whose body says "hold":
// those it answers when release closes, after telling held it has them.
func holdBackend(hits *atomic.Int64, held chan<- struct{}, release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hits.Add(1)
		if strings.Contains(string(b), "hold") {
			held <- struct{}{}
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	})
}

// rawRequest is the request line and headers of a completion whose body is
// b, without the body.
func rawRequest(b string, extra ...string) string {
	return "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nContent-Type: application/json\r\nContent-Length: " +
		fmt.Sprint(len(b)) + "\r\n" + strings.Join(extra, "") + "\r\n"
}

// readStatus reads one response from br and returns its status, having
// read its body. An informational response (1xx) is returned as any
// other.
func readStatus(br *bufio.Reader) (int, error) {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// readFinal reads responses from br up to the final one (past 1xx: the
// proxy forwards the backend's 100 Continue too) and returns its status.
func readFinal(br *bufio.Reader) (int, error) {
	for {
		status, err := readStatus(br)
		if err != nil || status >= 200 {
			return status, err
		}
	}
}

// closedByServer reports whether the server has closed c: a read ends at
// once, not at the deadline.
func closedByServer(c net.Conn, br *bufio.Reader) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := br.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestShedderClosesSlowestReadersFirst: with proxy.max_reading_connections
// at 8, twelve connections over real TCP that send a request's headers
// and hold its body cost the four that went silent first their
// connection, one by one as the others come; a real request then gets
// through, at the cost of the fifth. Two requests in flight meanwhile are
// untouched, and the seven readers left finish their requests.
func TestShedderClosesSlowestReadersFirst(t *testing.T) {
	var hits atomic.Int64
	held, release := make(chan struct{}, 2), make(chan struct{})
	backend := httptest.NewServer(holdBackend(&hits, held, release))
	t.Cleanup(backend.Close)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	cfg := DefaultConfig()
	cfg.MaxReadingConnections = 8
	reg := prometheus.NewRegistry()
	px := newServer(t, Options{Config: cfg, Balancer: newTestBalancer(t, backend.URL), Registerer: reg})
	sh := NewShedder(cfg, reg, nil)
	front := httptest.NewUnstartedServer(nil)
	front.Listener = sh.Listener(front.Listener)
	front.Config = px.HTTPServer(log.New(io.Discard, "", 0))
	front.Start()
	t.Cleanup(front.Close)
	addr := front.Listener.Addr().String()

	// Two requests in flight, each on a connection closed after it.
	type result struct {
		status int
		body   string
		err    error
	}
	inFlight := make(chan result, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/completions", strings.NewReader(body("completion", `,"user":"hold"`)))
			req.Header.Set("Content-Type", "application/json")
			req.Close = true
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				inFlight <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			inFlight <- result{resp.StatusCode, string(b), err}
		}()
	}
	for range 2 {
		<-held
	}

	// Twelve readers, one after the other: each sends its headers and
	// waits for 100 Continue, which says the proxy has read them and
	// waits for the body, before the next connects. The order they went
	// silent in is the order they connected in.
	type reader struct {
		conn net.Conn
		br   *bufio.Reader
		body string
	}
	var readers []reader
	for i := range 12 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b := body("completion", fmt.Sprintf(`,"user":"reader-%02d"`, i))
		if _, err := io.WriteString(c, rawRequest(b, "Expect: 100-continue\r\n")); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if status, err := readStatus(br); status != http.StatusContinue {
			t.Fatalf("reader %d: %d, %v; want 100 Continue", i, status, err)
		}
		readers = append(readers, reader{c, br, b})
	}

	// A real request gets through.
	resp := post(t.Context(), t, front.URL+"/v1/completions", body("completion", ""))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("real request: status %d, want 200", resp.StatusCode)
	}

	// The five silent longest were closed; the other seven finish.
	for i, r := range readers {
		if i < 5 {
			if !closedByServer(r.conn, r.br) {
				t.Errorf("reader %d (among the 5 silent longest) is still open", i)
			}
			continue
		}
		if _, err := io.WriteString(r.conn, r.body); err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		if status, err := readFinal(r.br); status != http.StatusOK {
			t.Errorf("reader %d: %d, %v; want its request answered 200", i, status, err)
		}
	}
	close(release)
	for range 2 {
		if r := <-inFlight; r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, `"ok"`) {
			t.Errorf("request in flight: %d %q, %v; want 200 and its whole answer", r.status, r.body, r.err)
		}
	}
	if n := hits.Load(); n != 2+1+7 {
		t.Errorf("backend saw %d requests, want 10: 2 in flight, the real one, 7 readers", n)
	}
	if got := testutil.ToFloat64(sh.shed[shedCap][stateReading]); got != 5 {
		t.Errorf("shed{cap,reading} = %v, want 5", got)
	}
	if got := testutil.ToFloat64(sh.shed[shedCap][stateIdle]) + testutil.ToFloat64(sh.shed[shedDescriptors][stateReading]) + testutil.ToFloat64(sh.shed[shedDescriptors][stateIdle]); got != 0 {
		t.Errorf("%v other connections shed, want none", got)
	}
}

// closedNow reports, in a synctest bubble, whether the server has closed
// the connection br reads: the read ends at this instant of the fake
// clock, not when a timeout of the server's closes it later.
func closedNow(br *bufio.Reader) bool {
	start := time.Now()
	_, err := br.ReadByte()
	return err != nil && time.Since(start) == 0
}

// TestShedderOrdersBySilence: in virtual time, with room for 3 waiting
// connections, an idle keep-alive connection and two readers, one of which
// sent a little more of its body later: the idle one, silent since its
// answer, is shed first; then the reader that sent nothing since; never
// the request in flight, nor a connection just opened.
func TestShedderOrdersBySilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits atomic.Int64
		held, release := make(chan struct{}, 1), make(chan struct{})
		cfg := DefaultConfig()
		cfg.MaxReadingConnections = 3
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"b": holdBackend(&hits, held, release)}, "b")
		defer f.close()
		sh := NewShedder(cfg, f.reg, nil)
		front := f.px.HTTPServer(log.New(io.Discard, "", 0))
		go front.Serve(sh.Listener(f.net.Listen("shed:80")))
		defer front.Close()
		dial := func() (net.Conn, *bufio.Reader) {
			c, err := f.net.DialContext(context.Background(), "tcp", "shed:80")
			if err != nil {
				t.Fatal(err)
			}
			return c, bufio.NewReader(c)
		}
		write := func(c net.Conn, s string) {
			if _, err := io.WriteString(c, s); err != nil {
				t.Fatal(err)
			}
		}

		// t=0: a request answered, then the connection idles.
		idle, idleBR := dial()
		defer idle.Close()
		write(idle, "GET /health HTTP/1.1\r\nHost: llmlb\r\n\r\n")
		if status, err := readStatus(idleBR); status != http.StatusOK {
			t.Fatalf("health: %d, %v", status, err)
		}
		advance(time.Second)
		// t=1s: a reader sends its headers and 10 bytes of its body.
		slow, slowBR := dial()
		defer slow.Close()
		slowBody := body("completion", `,"user":"slow"`)
		write(slow, rawRequest(slowBody)+slowBody[:10])
		advance(time.Second)
		// t=2s: a request in flight, its connection closed after it.
		flight, flightBR := dial()
		defer flight.Close()
		flightBody := body("completion", `,"user":"hold"`)
		write(flight, rawRequest(flightBody, "Connection: close\r\n")+flightBody)
		<-held
		flightStatus := make(chan int, 1)
		go func() { s, _ := readStatus(flightBR); flightStatus <- s }()
		advance(time.Second)
		// t=3s: another reader, silent from now on.
		stalled, stalledBR := dial()
		defer stalled.Close()
		stalledBody := body("completion", `,"user":"stalled"`)
		write(stalled, rawRequest(stalledBody)+stalledBody[:10])
		advance(time.Second)
		// t=4s: the first reader sends 10 bytes more.
		write(slow, slowBody[10:20])
		advance(time.Second)

		// t=5s: a fourth waiting connection; the idle one goes.
		n1, n1BR := dial()
		defer n1.Close()
		synctest.Wait()
		if !closedNow(idleBR) {
			t.Error("the idle connection, silent since t=0, is still open")
		}
		advance(time.Second)
		// t=6s: a fifth; the stalled reader goes, not the one that sent at t=4s.
		n2, _ := dial()
		defer n2.Close()
		synctest.Wait()
		if !closedNow(stalledBR) {
			t.Error("the reader silent since t=3s is still open")
		}

		write(slow, slowBody[20:])
		if status, err := readStatus(slowBR); status != http.StatusOK {
			t.Errorf("the reader that sent at t=4s: %d, %v; want its request answered", status, err)
		}
		write(n1, "GET /health HTTP/1.1\r\nHost: llmlb\r\n\r\n")
		if status, err := readStatus(n1BR); status != http.StatusOK {
			t.Errorf("the connection opened at t=5s: %d, %v; want its request answered", status, err)
		}
		close(release)
		if s := <-flightStatus; s != http.StatusOK {
			t.Errorf("request in flight: %d, want 200", s)
		}
		if got := testutil.ToFloat64(sh.shed[shedCap][stateIdle]); got != 1 {
			t.Errorf("shed{cap,idle} = %v, want 1", got)
		}
		if got := testutil.ToFloat64(sh.shed[shedCap][stateReading]); got != 1 {
			t.Errorf("shed{cap,reading} = %v, want 1", got)
		}
	})
}

// TestShedderUnderTLS: counted beneath TLS, with room for one waiting
// connection, a connection that never starts its handshake is shed for an
// HTTPS request, whose keep-alive connection is shed in turn once idle,
// while a request in flight over HTTPS all along is not.
func TestShedderUnderTLS(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits atomic.Int64
		held, release := make(chan struct{}, 1), make(chan struct{})
		cfg := DefaultConfig()
		cfg.MaxReadingConnections = 1
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"b": holdBackend(&hits, held, release)}, "b")
		defer f.close()
		ca := testcert.NewCA(t)
		cert, key := ca.Issue(t, 1, "llmlb")
		dir := t.TempDir()
		cr, err := NewCertReloader(TLSConfig{CertFile: testcert.Write(t, dir, "cert.pem", cert), KeyFile: testcert.Write(t, dir, "key.pem", key)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sh := NewShedder(cfg, f.reg, nil)
		hs := f.px.HTTPServer(log.New(io.Discard, "", 0))
		hs.TLSConfig = cr.TLSConfig()
		go hs.Serve(tls.NewListener(sh.Listener(f.net.Listen("llmlb:443")), hs.TLSConfig))
		defer hs.Close()
		newClient := func() *http.Client {
			tr := &http.Transport{DialContext: f.net.DialContext, TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "llmlb"}}
			t.Cleanup(tr.CloseIdleConnections)
			return &http.Client{Transport: tr}
		}

		flight := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, "https://llmlb:443/v1/completions", strings.NewReader(body("completion", `,"user":"hold"`)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := newClient().Do(req)
			if err != nil {
				flight <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			flight <- resp.StatusCode
		}()
		<-held
		silent, err := f.net.DialContext(context.Background(), "tcp", "llmlb:443")
		if err != nil {
			t.Fatal(err)
		}
		defer silent.Close()
		advance(time.Second)

		resp, err := newClient().Get("https://llmlb:443/health")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !closedNow(bufio.NewReader(silent)) {
			t.Error("the connection without a handshake is still open")
		}
		advance(time.Second)
		late, err := f.net.DialContext(context.Background(), "tcp", "llmlb:443")
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		// Gone before the request in flight ends, so that its connection,
		// idle then, is the one waiting connection.
		late.Close()
		synctest.Wait()
		close(release)
		if s := <-flight; s != http.StatusOK {
			t.Errorf("request in flight: %d, want 200", s)
		}
		if got := testutil.ToFloat64(sh.shed[shedCap][stateReading]); got != 1 {
			t.Errorf("shed{cap,reading} = %v, want 1: the connection without a handshake", got)
		}
		if got := testutil.ToFloat64(sh.shed[shedCap][stateIdle]); got != 1 {
			t.Errorf("shed{cap,idle} = %v, want 1: the HTTPS keep-alive connection", got)
		}
	})
}

// TestShedderDerivesItsBound: 0 takes at most a quarter of the
// descriptor limit, and at most 16384; a configured bound is kept. (The
// bound at a limit of 256 is 64: serve's TestDescriptorPressure.)
func TestShedderDerivesItsBound(t *testing.T) {
	cfg := DefaultConfig()
	got := NewShedder(cfg, prometheus.NewRegistry(), nil).Max()
	if n, ok := descriptorLimit(); got < 1 || got > maxDerivedReading || ok && uint64(got) > max(n/4, 1) {
		t.Errorf("derived bound %d, descriptor limit %d", got, n)
	}
	cfg.MaxReadingConnections = 5
	if got := NewShedder(cfg, prometheus.NewRegistry(), nil).Max(); got != 5 {
		t.Errorf("configured bound %d, want 5", got)
	}
	cfg.MaxReadingConnections = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "proxy.max_reading_connections") {
		t.Errorf("-1 validated: %v", err)
	}
}
