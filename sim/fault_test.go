package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb/internal/pipenet"
)

func TestParseFaults(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string // String of the result
		wantErr bool
	}{
		{name: "empty", in: "", want: ""},
		{name: "one", in: "hang", want: "hang"},
		{name: "several", in: "5xx,429, metrics-garbage", want: "5xx:status=500,429,metrics-garbage"},
		{name: "schedule", in: "die-mid-stream:after=5s,for=10s,events=3,drip:gap=2s", want: "die-mid-stream:after=5s,for=10s,events=3,drip:gap=2s"},
		{name: "status", in: "5xx:status=503", want: "5xx:status=503"},
		{name: "huge", in: "metrics-huge:bytes=1000", want: "metrics-huge:bytes=1000"},
		{name: "framing and share", in: "die-mid-stream:events=3,framing=clean,share=0.2", want: "die-mid-stream:events=3,framing=clean,share=0.2"},
		{name: "close framing", in: "die-mid-stream:framing=close", want: "die-mid-stream:events=2,framing=close"},
		{name: "defaults left out", in: "die-mid-stream:framing=cut,share=1", want: "die-mid-stream:events=2"},
		{name: "unknown framing", in: "die-mid-stream:framing=chunked", wantErr: true},
		{name: "zero share", in: "die-mid-stream:share=0", wantErr: true},
		{name: "share above 1", in: "die-mid-stream:share=1.5", wantErr: true},
		{name: "share NaN", in: "die-mid-stream:share=NaN", wantErr: true},
		{name: "framing of another kind", in: "stall:framing=clean", wantErr: true},
		{name: "share of another kind", in: "5xx:share=0.5", wantErr: true},
		{name: "unknown kind", in: "explode", wantErr: true},
		{name: "param first", in: "for=1s", wantErr: true},
		{name: "param of another kind", in: "hang:events=3", wantErr: true},
		{name: "bad duration", in: "stall:after=soon", wantErr: true},
		{name: "negative duration", in: "stall:for=-1s", wantErr: true},
		{name: "status not 5xx", in: "5xx:status=404", wantErr: true},
		{name: "zero gap", in: "drip:gap=0s", wantErr: true},
		{name: "not name=value", in: "stall:events", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, err := ParseFaults(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseFaults(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err == nil && fs.String() != tt.want {
				t.Errorf("ParseFaults(%q) = %q, want %q", tt.in, fs.String(), tt.want)
			}
		})
	}
}

// faultServer is an emulated vLLM fast enough for whole streams in
// milliseconds, its listener wrapped for the refuse fault.
func faultServer(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	s, err := NewServer(ServerConfig{Model: "m", MaxModelLen: 4096}, NewSteady(SteadyConfig{Speed: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.Listener = s.Listener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	return s, srv
}

const streamBody = `{"model":"m","prompt":"hello there","max_tokens":5,"stream":true}`

// bubbleFaultServer serves an emulated vLLM like faultServer's at
// http://sim:8000 on an in-memory network, for a test inside a synctest
// bubble, and returns a client that reaches it; stop closes both, before
// the bubble ends. The refuse fault needs a real socket: faultServer.
func bubbleFaultServer(t *testing.T) (s *Server, c *http.Client, stop func()) {
	t.Helper()
	s, err := NewServer(ServerConfig{Model: "m", MaxModelLen: 4096}, NewSteady(SteadyConfig{Speed: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	var pn pipenet.Network
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(pn.Listen("sim:8000"))
	tr := &http.Transport{DialContext: pn.DialContext}
	return s, &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		hs.Close()
	}
}

// stream posts a streaming completion through c with a short deadline and
// returns the status, the events read and the read error.
func stream(t *testing.T, c *http.Client, url string, timeout time.Duration) (int, []string, error) {
	t.Helper()
	client := *c
	client.Timeout = timeout
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var evs []string
	for ev := range strings.SplitSeq(string(b), "\n\n") {
		if ev != "" {
			evs = append(evs, ev)
		}
	}
	return resp.StatusCode, evs, err
}

// TestFaultsShowAndClear: each fault shows as it should, a fault with a
// for= ends on time, and clearing the faults serves whole streams again.
// In a synctest bubble: the clients' deadlines and the faults' schedules
// are the fake clock's.
func TestFaultsShowAndClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, c, stop := bubbleFaultServer(t)
		defer stop()
		const url = "http://sim:8000"
		set := func(spec string) {
			t.Helper()
			fs, err := ParseFaults(spec)
			if err != nil {
				t.Fatal(err)
			}
			s.SetFaults(fs)
		}
		get := func(c *http.Client, path string) (int, []byte, error) {
			resp, err := c.Get(url + path)
			if err != nil {
				return 0, nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, b, err
		}
		healthy := func() {
			t.Helper()
			code, evs, err := stream(t, c, url, 5*time.Second)
			if err != nil || code != 200 || evs[len(evs)-1] != "data: [DONE]" {
				t.Fatalf("after clearing: status %d, %d events, err %v; want a whole stream", code, len(evs), err)
			}
		}
		healthy()

		set("5xx:status=503")
		if code, _, _ := stream(t, c, url, 5*time.Second); code != 503 {
			t.Errorf("5xx:status=503: status %d, want 503", code)
		}
		if code, _, err := get(c, "/health"); err != nil || code != 200 {
			t.Errorf("5xx: /health = %d %v, want 200 (a broken engine behind a live front)", code, err)
		}
		set("429")
		if code, _, _ := stream(t, c, url, 5*time.Second); code != 429 {
			t.Errorf("429: status %d, want 429", code)
		}
		set("die-mid-stream:events=2")
		code, evs, err := stream(t, c, url, 5*time.Second)
		if code != 200 || err == nil || len(evs) != 2 {
			t.Errorf("die-mid-stream: status %d, events %q, err %v; want 200, two events, then a broken body", code, evs, err)
		}
		set("stall:events=1")
		code, evs, err = stream(t, c, url, 300*time.Millisecond)
		if code != 200 || err == nil || len(evs) != 1 {
			t.Errorf("stall: status %d, events %q, err %v; want 200, one event, then silence until the client's timeout", code, evs, err)
		}
		set("hang")
		if _, _, err := stream(t, c, url, 300*time.Millisecond); err == nil {
			t.Errorf("hang: answered, want no headers before the client's timeout")
		}
		set("drip:gap=100ms")
		start := time.Now()
		code, evs, err = stream(t, c, url, 5*time.Second)
		if took := time.Since(start); code != 200 || err != nil || took < 500*time.Millisecond {
			t.Errorf("drip:gap=100ms: status %d, %d events, err %v in %s; want five tokens at least 500ms apart in all", code, len(evs), err, took)
		}
		set("close")
		if _, _, err := stream(t, c, url, 5*time.Second); err == nil {
			t.Errorf("close: answered, want the connection closed")
		}
		set("close:for=50ms")
		if _, _, err := stream(t, c, url, 5*time.Second); err == nil {
			t.Errorf("close:for=50ms: answered at once, want the connection closed")
		}
		advance(50 * time.Millisecond)
		healthy()

		set("metrics-garbage")
		_, page, err := get(c, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(page), "vllm:num_requests_running") {
			t.Errorf("metrics-garbage: the real page came back")
		}
		set("metrics-huge:bytes=100000")
		_, page, err = get(c, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if len(page) < 100000 || !strings.Contains(string(page), "vllm:num_requests_running") {
			t.Errorf("metrics-huge:bytes=100000: %d bytes, want the page and 100000 more", len(page))
		}
		set("metrics-hang")
		short := *c
		short.Timeout = 200 * time.Millisecond
		if _, _, err := get(&short, "/metrics"); err == nil {
			t.Errorf("metrics-hang: answered")
		}
		set("health-flap:gap=10s")
		if code, _, err := get(c, "/health"); err != nil || code != 503 {
			t.Errorf("health-flap: first half = %d %v, want 503", code, err)
		}
		s.SetFaults(nil)
		healthy()
	})
}

// TestRefuseClosesTheSocketAndReopens: refuse closes the listening socket
// and resets the connections open; cleared, the server listens again. Real
// sockets, so real time; it waits on the listener's own signals, never on
// a clock.
func TestRefuseClosesTheSocketAndReopens(t *testing.T) {
	s, srv := faultServer(t)
	fl := srv.Listener.(*faultListener)
	// A stream open when the fault begins is reset.
	s.SetFaults(Faults{{Kind: FaultStall, Events: 1}})
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	s.SetFaults(Faults{{Kind: FaultRefuse}})
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("a stream open when refuse began ended cleanly, want it reset")
	}
	// The listener closes its socket before it resets the connections, so
	// by now a dial is refused.
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err == nil {
		c.Close()
		t.Fatal("a connection was accepted under refuse")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Logf("dial: %v", err)
	}
	s.SetFaults(nil)
	// The listener closes wake each time it opens or closes its socket.
	for {
		fl.mu.Lock()
		ln, wake := fl.ln, fl.wake
		fl.mu.Unlock()
		if ln != nil {
			break
		}
		select {
		case <-wake:
		case <-time.After(5 * time.Second):
			t.Fatal("not listening again 5s after refuse cleared")
		}
	}
	if code, _, err := stream(t, http.DefaultClient, srv.URL, 5*time.Second); err != nil || code != 200 {
		t.Fatalf("not serving again after refuse cleared: %d %v", code, err)
	}
}

func TestFaultSwitchOverHTTP(t *testing.T) {
	_, srv := faultServer(t)
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/sim/faults", strings.NewReader("5xx:for=1h"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "5xx:for=1h0m0s,status=500" {
		t.Errorf("PUT /sim/faults = %d %q", resp.StatusCode, b)
	}
	if code, _, _ := stream(t, http.DefaultClient, srv.URL, 5*time.Second); code != 500 {
		t.Errorf("after PUT 5xx: status %d, want 500", code)
	}
	req, _ = http.NewRequest(http.MethodPut, srv.URL+"/sim/faults", strings.NewReader("nonsense"))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 400 {
		t.Errorf("PUT nonsense = %v %v, want 400", resp, err)
	}
	req, _ = http.NewRequest(http.MethodDelete, srv.URL+"/sim/faults", nil)
	if _, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := stream(t, http.DefaultClient, srv.URL, 5*time.Second); code != 200 {
		t.Errorf("after DELETE: status %d, want 200", code)
	}
}

// FuzzParseFaults: ParseFaults never panics, and what it accepts writes
// out as a list it reads back the same.
func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"", "hang", "die-mid-stream:after=5s,for=10s,events=3,drip:gap=2s", "5xx:status=503,429", "for=1s", "metrics-huge:bytes=9",
		"die-mid-stream:events=3,framing=clean,share=0.2", "die-mid-stream:framing=close,share=1e-3", "die-mid-stream:share=0x1p-2,framing=cut"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fs, err := ParseFaults(s)
		if err != nil {
			return
		}
		again, err := ParseFaults(fs.String())
		if err != nil {
			t.Fatalf("ParseFaults(%q) = %q, which does not parse: %v", s, fs.String(), err)
		}
		if again.String() != fs.String() {
			t.Fatalf("ParseFaults(%q).String() = %q, read back as %q", s, fs.String(), again.String())
		}
	})
}

// framingAPIs are the four APIs the emulated servers stream, each with a
// streamed request of 5 tokens (stream) and the same unstreamed (plain),
// the text that marks one of its content events (delta), its stream's
// terminator, and a sign of the stream's end that must not come before it
// (finish: a finish_reason, message_delta or output_text.done).
var framingAPIs = []struct {
	name, path, stream, plain, delta, terminator, finish string
}{
	{name: "completions", path: "/v1/completions",
		stream: `{"model":"m","prompt":"hello there","max_tokens":5,"stream":true}`,
		plain:  `{"model":"m","prompt":"hello there","max_tokens":5}`,
		delta:  `"text":" `, terminator: "data: [DONE]\n\n", finish: `"finish_reason":"`},
	{name: "chat", path: "/v1/chat/completions",
		stream: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`,
		plain:  `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		delta:  `"content":" `, terminator: "data: [DONE]\n\n", finish: `"finish_reason":"`},
	{name: "messages", path: "/v1/messages",
		stream: `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		plain:  `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		delta:  "event: content_block_delta\n", terminator: "event: message_stop\n", finish: "event: message_delta\n"},
	{name: "responses", path: "/v1/responses",
		stream: `{"model":"m","input":"hi","max_output_tokens":5,"stream":true}`,
		plain:  `{"model":"m","input":"hi","max_output_tokens":5}`,
		delta:  "event: response.output_text.delta\n", terminator: "event: response.completed\n", finish: "event: response.output_text.done\n"},
}

// rawAnswer is an answer as a client reads it off the wire.
type rawAnswer struct {
	bytes   int    // received in all; 0 when no answer came
	status  string // the status line
	header  textproto.MIMEHeader
	body    []byte // the body, its chunks joined for a chunked one
	bodyErr error  // a chunked body's decoding error: nil when its last chunk came
}

func (a rawAnswer) chunked() bool { return a.header.Get("Transfer-Encoding") == "chunked" }

// rawPost sends body to path at addr, asking the server to close the
// connection after its answer, and reads everything until the connection
// closes: a client that sees the framing as sent.
func rawPost(t *testing.T, addr, path, body string) rawAnswer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", path, len(body), body)
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", path, err)
	}
	a := rawAnswer{bytes: len(b)}
	if len(b) == 0 {
		return a
	}
	head, rest, ok := bytes.Cut(b, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("POST %s: no end of headers in %q", path, b)
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(head, "\r\n\r\n"...))))
	if a.status, err = tp.ReadLine(); err != nil {
		t.Fatal(err)
	}
	if a.header, err = tp.ReadMIMEHeader(); err != nil {
		t.Fatalf("POST %s: headers %q: %v", path, head, err)
	}
	a.body = rest
	if a.chunked() {
		a.body, a.bodyErr = io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(rest)))
	}
	return a
}

// TestDieMidStreamFramings: under die-mid-stream:events=2, each framing
// ends each API's answer of 5 tokens as it says, as a raw client reads
// it. A stream has its two content events and no finish or terminator:
// cut sends a chunked body without its last chunk, clean one with it,
// close a body with neither chunking nor Content-Length, ended by the
// connection. A non-streamed answer: none under cut; under clean and
// close the first half of its JSON, with a Content-Length that matches it
// (clean) or delimited by the connection (close).
func TestDieMidStreamFramings(t *testing.T) {
	for _, framing := range Framings() {
		for _, api := range framingAPIs {
			t.Run(string(framing)+"/"+api.name, func(t *testing.T) {
				s, srv := faultServer(t)
				s.SetFaults(Faults{{Kind: FaultDieMidStream, Events: 2, Framing: framing}})
				addr := srv.Listener.Addr().String()

				a := rawPost(t, addr, api.path, api.stream)
				if a.status != "HTTP/1.1 200 OK" {
					t.Fatalf("stream: status %q, want 200", a.status)
				}
				body := string(a.body)
				if n := strings.Count(body, api.delta); n != 2 || strings.Contains(body, api.terminator) || strings.Contains(body, api.finish) {
					t.Errorf("stream: %d content events (want 2), terminator %v, finish %v (want neither): %s",
						n, strings.Contains(body, api.terminator), strings.Contains(body, api.finish), body)
				}
				switch framing {
				case FramingCut:
					if !a.chunked() || a.bodyErr == nil {
						t.Errorf("stream: chunked %v, decoding error %v; want a chunked body cut before its last chunk", a.chunked(), a.bodyErr)
					}
				case FramingClean:
					if !a.chunked() || a.bodyErr != nil {
						t.Errorf("stream: chunked %v, decoding error %v; want a chunked body ended by its last chunk", a.chunked(), a.bodyErr)
					}
				case FramingClose:
					if a.header.Get("Transfer-Encoding") != "" || a.header.Get("Content-Length") != "" || a.header.Get("Connection") != "close" {
						t.Errorf("stream: headers %v; want Connection: close and neither Transfer-Encoding nor Content-Length", a.header)
					}
					if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
						t.Errorf("stream: Content-Type %q, want text/event-stream", ct)
					}
				}

				a = rawPost(t, addr, api.path, api.plain)
				if framing == FramingCut {
					if a.bytes != 0 {
						t.Errorf("plain: %d bytes, %s %v; want the connection closed with no answer", a.bytes, a.status, a.header)
					}
					return
				}
				if a.status != "HTTP/1.1 200 OK" || len(a.body) == 0 || json.Valid(a.body) || a.chunked() {
					t.Fatalf("plain: %s %v %q; want 200 and a body of JSON cut short, not chunked", a.status, a.header, a.body)
				}
				if !strings.HasPrefix(string(a.body), "{") {
					t.Errorf("plain: body %q, want the start of a JSON object", a.body)
				}
				switch framing {
				case FramingClean:
					if cl := a.header.Get("Content-Length"); cl != strconv.Itoa(len(a.body)) {
						t.Errorf("plain: Content-Length %q, body of %d bytes; want them equal", cl, len(a.body))
					}
				case FramingClose:
					if a.header.Get("Content-Length") != "" || a.header.Get("Connection") != "close" {
						t.Errorf("plain: headers %v; want Connection: close and no Content-Length", a.header)
					}
				}
			})
		}
	}
}

// TestDieMidStreamCloseFramingOfAShortAnswer: an answer of no more tokens
// than events ends whole under close, delimited by the connection.
func TestDieMidStreamCloseFramingOfAShortAnswer(t *testing.T) {
	s, srv := faultServer(t)
	s.SetFaults(Faults{{Kind: FaultDieMidStream, Events: 5, Framing: FramingClose}})
	addr := srv.Listener.Addr().String()
	for _, api := range framingAPIs {
		a := rawPost(t, addr, api.path, api.stream)
		if body := string(a.body); a.chunked() || a.header.Get("Content-Length") != "" || strings.Count(body, api.delta) != 5 || !strings.Contains(body, api.terminator) {
			t.Errorf("%s: headers %v, body %s; want a whole stream of 5 delimited by the connection", api.name, a.header, body)
		}
		a = rawPost(t, addr, api.path, api.plain)
		if !json.Valid(a.body) || a.chunked() || a.header.Get("Content-Length") != "" {
			t.Errorf("%s, not streamed: headers %v, body %s; want whole JSON delimited by the connection", api.name, a.header, a.body)
		}
	}
}

// TestDieMidStreamShare: share=0.5 takes every other request, the first
// included, counted by the server's request number.
func TestDieMidStreamShare(t *testing.T) {
	s, srv := faultServer(t)
	fs, err := ParseFaults("die-mid-stream:events=1,framing=clean,share=0.5")
	if err != nil {
		t.Fatal(err)
	}
	s.SetFaults(fs)
	var got []bool
	for range 6 {
		code, evs, err := stream(t, http.DefaultClient, srv.URL, 5*time.Second)
		if code != 200 || err != nil {
			t.Fatalf("status %d, err %v", code, err)
		}
		got = append(got, evs[len(evs)-1] != "data: [DONE]")
	}
	if want := []bool{true, false, true, false, true, false}; !slices.Equal(got, want) {
		t.Errorf("streams taken = %v, want %v", got, want)
	}
}

func TestFaultTakes(t *testing.T) {
	tests := []struct {
		name  string
		share float64
		want  int // taken of the first 1000
		first []int64
	}{
		{name: "all", share: 1, want: 1000, first: []int64{1, 2, 3}},
		{name: "unset is all", share: 0, want: 1000, first: []int64{1, 2, 3}},
		{name: "a fifth", share: 0.2, want: 200, first: []int64{1, 6, 11}},
		{name: "a quarter", share: 0.25, want: 250, first: []int64{1, 5, 9}},
		{name: "a third", share: 1.0 / 3, want: 334, first: []int64{1, 4, 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Fault{Kind: FaultDieMidStream, Share: tt.share}
			var taken []int64
			for n := int64(1); n <= 1000; n++ {
				if f.takes(n) {
					taken = append(taken, n)
				}
			}
			if len(taken) != tt.want || !slices.Equal(taken[:3], tt.first) {
				t.Errorf("share %g takes %d of 1000, first %v; want %d, first %v", tt.share, len(taken), taken[:min(3, len(taken))], tt.want, tt.first)
			}
		})
	}
}
