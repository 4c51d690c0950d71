package proxy

import (
	"bufio"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/pipenet"
)

// bubbleFront is a proxy, its backends and a client on one in-memory
// network, so that all of them run inside one synctest bubble.
type bubbleFront struct {
	net     *pipenet.Network
	px      *Server
	reg     *prometheus.Registry
	client  *http.Client
	servers []*http.Server
	base    *http.Transport
}

// newBubbleFront serves each handler as backend http://<name>:80 and the
// proxy as http://llmlb:80, all on one pipenet.Network; call it inside a bubble and
// close the result before the bubble ends.
func newBubbleFront(t *testing.T, cfg Config, policy string, backends map[string]http.Handler, order ...string) *bubbleFront {
	t.Helper()
	return newBubbleFrontBal(t, cfg, newBal(t, policy), backends, order...)
}

// newBubbleFrontBal is newBubbleFront over a balancer of the caller's.
func newBubbleFrontBal(t *testing.T, cfg Config, bal *balancer.Balancer, backends map[string]http.Handler, order ...string) *bubbleFront {
	t.Helper()
	pn := &pipenet.Network{}
	var specs []balancer.Spec
	f := &bubbleFront{net: pn, reg: prometheus.NewRegistry()}
	for _, name := range order {
		hs := &http.Server{Handler: backends[name]}
		go hs.Serve(pn.Listen(name + ":80"))
		f.servers = append(f.servers, hs)
		u, _ := url.Parse("http://" + name + ":80")
		specs = append(specs, balancer.Spec{ID: name, URL: u, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady})
	}
	bal.Update(specs...)
	f.px = newServer(t, Options{Config: cfg, Balancer: bal, Registerer: f.reg})
	f.base = f.px.rp.Transport.(*retryTransport).base.(*http.Transport)
	f.base.DialContext = pn.DialContext
	front := f.px.HTTPServer(nil)
	go front.Serve(pn.Listen("llmlb:80"))
	f.servers = append(f.servers, front)
	f.client = &http.Client{Transport: &http.Transport{DialContext: pn.DialContext}}
	return f
}

func (f *bubbleFront) close() {
	f.client.CloseIdleConnections()
	f.base.CloseIdleConnections()
	for _, hs := range f.servers {
		hs.Close()
	}
}

// advance moves the bubble's fake clock on by d and returns once every
// goroutine in the bubble has done what that time let it do. Call it only
// from the bubble's root goroutine. It is the proxy tests' one time.Sleep:
// inside a synctest bubble, virtual time.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func (f *bubbleFront) post(t *testing.T, path, body string) (*http.Response, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://llmlb:80"+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return f.client.Do(req)
}

// sseBackend streams n chunks, one every 10ms of the fake clock, and
// [DONE]. The pace is needed: between chunks the bubble goes idle with
// the proxy waiting on the backend, so the reverse proxy's first delayed
// flush (httputil's maxLatencyWriter, which holds its mutex across the
// write to the client) never waits on a write blocked on a pipe the
// client is not reading; a mutex is not a durable block, and the bubble
// would hang.
func sseBackend(n int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for range n {
			io.WriteString(w, `data: {"choices":[{"text":"x"}]}`+"\n\n")
			w.(http.Flusher).Flush()
			<-tick.C
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
}

// hangBackend never answers: it holds the request until the proxy gives up.
func hangBackend() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that net/http watches for the proxy leaving
		<-r.Context().Done()
	})
}

// TestStreamFirstByteTimeoutMovesToNextBackend: a backend that takes a
// streaming request and sends no headers is abandoned after
// stream_first_byte_timeout, and the request is served by the next
// candidate; alone, it gets 504 in OpenAI's shape exactly then. The
// non-streaming limit (response_header_timeout) is unchanged.
func TestStreamFirstByteTimeoutMovesToNextBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.StreamFirstByteTimeout = 2 * time.Second
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"hang": hangBackend(), "good": sseBackend(3)}, "hang", "good")
		defer f.close()
		retried := 0
		for i := range 4 {
			start := time.Now()
			resp, err := f.post(t, "/v1/completions", body("completion", `,"stream":true`))
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("request %d: status %d, body %q; want 200 and a whole stream", i, resp.StatusCode, b)
			}
			if resp.Header.Get(HeaderReason) == "retry" {
				retried++
				if d := time.Since(start); d < cfg.StreamFirstByteTimeout || d > cfg.StreamFirstByteTimeout+time.Second {
					t.Errorf("retried request %d took %s, want the first-byte timeout (%s) and the stream", i, d, cfg.StreamFirstByteTimeout)
				}
			}
		}
		if retried == 0 {
			t.Error("no request was sent to the hung backend first; the test shows nothing")
		}
	})
}

func TestStreamFirstByteTimeoutAloneIs504(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.StreamFirstByteTimeout = 2 * time.Second
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"hang": hangBackend()}, "hang")
		defer f.close()
		start := time.Now()
		resp, err := f.post(t, "/v1/completions", body("completion", `,"stream":true`))
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != cfg.StreamFirstByteTimeout {
			t.Errorf("answered after %s, want %s", d, cfg.StreamFirstByteTimeout)
		}
		checkOpenAIError(t, resp, http.StatusGatewayTimeout)
	})
}

// TestNonStreamingRequestWaitsPastStreamFirstByteTimeout: a non-streaming
// answer's headers come after the whole generation, so only
// response_header_timeout bounds them.
func TestNonStreamingRequestWaitsPastStreamFirstByteTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.StreamFirstByteTimeout = 2 * time.Second
		generated := make(chan struct{})
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			select { // a long generation: the test says when it ends
			case <-generated:
			case <-r.Context().Done():
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"text":"done"}]}`)
		})
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"slow": slow}, "slow")
		defer f.close()
		type answer struct {
			resp *http.Response
			err  error
		}
		answered := make(chan answer, 1)
		go func() {
			resp, err := f.post(t, "/v1/completions", body("completion", ""))
			answered <- answer{resp, err}
		}()
		advance(3 * cfg.StreamFirstByteTimeout)
		select {
		case a := <-answered:
			if a.err == nil {
				a.resp.Body.Close()
				t.Fatalf("answered %d while the backend was still generating", a.resp.StatusCode)
			}
			t.Fatalf("failed (%v) while the backend was still generating", a.err)
		default:
		}
		close(generated)
		a := <-answered
		if a.err != nil {
			t.Fatal(a.err)
		}
		b, _ := io.ReadAll(a.resp.Body)
		a.resp.Body.Close()
		if a.resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "done") {
			t.Errorf("status %d, body %q; want 200 with the answer", a.resp.StatusCode, b)
		}
	})
}

// TestStreamStallCutsStream: a backend that sends its headers and one event,
// then nothing, has the client's stream cut stream_idle_timeout after that
// event; the request is counted with status 504 and the backend's ledger
// is back to zero.
func TestStreamStallCutsStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.StreamIdleTimeout = 5 * time.Second
		stall := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"choices":[{"text":"x"}]}`+"\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		})
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"stall": stall}, "stall")
		defer f.close()
		resp, err := f.post(t, "/v1/completions", body("completion", `,"stream":true`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line %q, %v; want the first event", line, err)
		}
		first := time.Now()
		rest, err := io.ReadAll(br)
		if err == nil {
			t.Fatalf("stream ended cleanly after %q; want it cut", rest)
		}
		if d := time.Since(first); d != cfg.StreamIdleTimeout {
			t.Errorf("stream cut %s after the first event, want %s", d, cfg.StreamIdleTimeout)
		}
		synctest.Wait()
		if got := testutil.ToFloat64(f.px.metrics.requests.WithLabelValues(testModel, testModel, "stall", "504")); got != 1 {
			t.Errorf("requests with status 504 = %v, want 1", got)
		}
		if n := f.px.bal.Snapshot().Backends[0].Ledger.InFlight(); n != 0 {
			t.Errorf("in flight = %d, want 0", n)
		}
	})
}

// TestSlowClientIsNotAStall: a client that stops reading for longer than
// stream_idle_timeout gets the whole stream: only time the proxy waits on
// the backend counts.
func TestSlowClientIsNotAStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.StreamIdleTimeout = time.Second
		f := newBubbleFront(t, cfg, "round-robin", map[string]http.Handler{"good": sseBackend(50)}, "good")
		defer f.close()
		resp, err := f.post(t, "/v1/completions", body("completion", `,"stream":true`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		advance(3 * cfg.StreamIdleTimeout) // the client is busy; the pipe has no buffer
		b, err := io.ReadAll(resp.Body)
		if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Errorf("stream ended with %v after %d bytes; want it whole", err, len(b))
		}
	})
}
