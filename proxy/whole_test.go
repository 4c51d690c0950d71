package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/tracing"
)

// A Responses stream as vLLM sends it (vllm/entrypoints/openai/responses):
// typed events, usage in response.completed.
const responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":1,"delta":"Hel"}

event: response.completed
data: {"type":"response.completed","sequence_number":2,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":30,"output_tokens":1}}}

`

// A Messages stream in Anthropic's shape.
const messagesStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","usage":{"input_tokens":5,"output_tokens":0}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":1}}

event: message_stop
data: {"type":"message_stop"}

`

// TestStreamEndedEarlyIsContinued: a server that ends its stream before
// [DONE], however the body ends to HTTP (cleanly on a chunked body, by
// shutting a connection-delimited one, or cut), broke it: the client's
// stream is continued on the other server and ends whole.
func TestStreamEndedEarlyIsContinued(t *testing.T) {
	for _, end := range []string{"clean", "close", ""} {
		for _, chat := range []bool{false, true} {
			a, b := &cutEngine{name: "a", cutAfter: 3, end: end}, &cutEngine{name: "bb", cutAfter: 3, end: end}
			sa, sb := httptest.NewServer(a), httptest.NewServer(b)
			defer sa.Close()
			defer sb.Close()
			f := newFront(t, DefaultConfig(), sa.URL, sb.URL)
			path, body := "/v1/completions", `{"model":"`+testModel+`","prompt":"Once upon a time","max_tokens":16,"stream":true}`
			if chat {
				path, body = "/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"Tell me"}],"max_tokens":16,"stream":true}`
			}
			resp, err := http.Post(f.URL+path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			events, clean := readStream(t, resp)
			f.waitHandler(t, 1)
			var text strings.Builder
			for _, ev := range events {
				for _, c := range ev["choices"].([]any) {
					c := c.(map[string]any)
					if d, ok := c["delta"].(map[string]any); ok {
						text.WriteString(fmt.Sprint(d["content"]))
					} else {
						text.WriteString(c["text"].(string))
					}
				}
			}
			if words := strings.Fields(text.String()); !clean || len(words) != 16 {
				t.Errorf("end %q, chat %v: clean %v, %d words %q; want the whole answer, continued", end, chat, clean, len(words), text.String())
			}
			reason := "truncated"
			if end == "" {
				reason = "cut"
			}
			if got := testutil.ToFloat64(f.metric(t).continuations.WithLabelValues(reason, "continued")); got != 1 {
				t.Errorf("end %q, chat %v: continuations{reason=%s,result=continued} = %v, want 1", end, chat, reason, got)
			}
			f.checkLedgerZero(t)
		}
	}
}

// cannedStream serves body, a stream of an API, cut before its last k
// events, the body ending cleanly to HTTP.
func cannedStream(body string, k int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		evs := strings.SplitAfter(body, "\n\n")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, strings.Join(evs[:len(evs)-1-k], ""))
	}
}

// TestTruncatedStreamFailsInItsAPIsShape: a Messages or Responses stream
// that ends before its terminator cannot be continued (no engine
// continues either), so the client gets an error event in the API's own
// shape; the stream is not passed off as whole, and the server is counted
// as failed.
func TestTruncatedStreamFailsInItsAPIsShape(t *testing.T) {
	tests := []struct {
		name, path, body, stream, want string
		cut                            int // events cut from the end
	}{
		{"messages", "/v1/messages", `{"model":"` + testModel + `","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`,
			messagesStream, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":", 2},
		{"responses", "/v1/responses", `{"model":"` + testModel + `","input":"Hi","stream":true}`,
			responsesStream, "event: error\ndata: {\"type\":\"error\",\"code\":\"stream_broken\",\"message\":", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(cannedStream(tc.stream, tc.cut))
			defer srv.Close()
			f := newFront(t, DefaultConfig(), srv.URL)
			resp, err := http.Post(f.URL+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			f.waitHandler(t, 1)
			if !strings.Contains(string(got), tc.want) {
				t.Errorf("the client got\n%s\nwant an error event starting\n%s", got, tc.want)
			}
			if n := testutil.ToFloat64(f.metric(t).continuations.WithLabelValues("truncated", "not_continued")); n != 1 {
				t.Errorf("continuations{truncated,not_continued} = %v, want 1", n)
			}
			if n := testutil.ToFloat64(f.metric(t).requests.WithLabelValues(testModel, testModel, srv.URL, "502")); n != 1 {
				t.Errorf("requests with status 502 = %v, want 1: a truncated answer is not a success", n)
			}
			f.checkLedgerZero(t)
		})
	}
}

// TestCutJSONAnswerGoesToTheNextServer: a non-streamed answer whose JSON
// ended short (the body clean to HTTP) never reaches the client: it is
// asked of the next server, and with none left the client gets a 502.
func TestCutJSONAnswerGoesToTheNextServer(t *testing.T) {
	whole := `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	short := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, whole[:40])
	})
	good := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, whole)
	})
	body := `{"model":"` + testModel + `","prompt":"Hi","max_tokens":1}`
	sShort, sGood := httptest.NewServer(short), httptest.NewServer(good)
	defer sShort.Close()
	defer sGood.Close()
	f := newFront(t, DefaultConfig(), sShort.URL, sGood.URL)
	for i := range 4 {
		resp, err := http.Post(f.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
		if resp.StatusCode != http.StatusOK || string(got) != whole {
			t.Errorf("request %d: %d %s; want the whole answer", i, resp.StatusCode, got)
		}
	}
	alone := newFront(t, DefaultConfig(), sShort.URL)
	resp, err := http.Post(alone.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	alone.waitHandler(t, 1)
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(string(got), `"cmpl-1"`) {
		t.Errorf("alone: %d %s; want 502 and none of the cut answer", resp.StatusCode, got)
	}
}

// TestConnectFailureIsPickedAgain: a request whose only candidate refuses
// the connection is picked again, away from it, and answered, not failed
// with 502 (issue 53: under load the saturation filter can leave one
// candidate).
func TestConnectFailureIsPickedAgain(t *testing.T) {
	live := httptest.NewServer(&cutEngine{name: "live", cutAfter: 99})
	defer live.Close()
	dead := deadURL(t)
	bal := newTestBalancerCandidates(t, 1, dead, live.URL)
	f := newFrontOn(t, DefaultConfig(), bal)
	wantAnswered(t, f, 4)
}

// TestTruncatedStreamSpansAreErrors: a stream that ended before its
// terminator is an error in its trace: the request span's status (502)
// and the attempt's.
func TestTruncatedStreamSpansAreErrors(t *testing.T) {
	backend := httptest.NewServer(cannedStream(messagesStream, 2))
	defer backend.Close()
	rcv := &otlpReceiver{}
	collector := httptest.NewServer(rcv)
	defer collector.Close()
	tp, shutdown, err := tracing.Start(tracing.Config{Endpoint: collector.URL, SampleRatio: 1, Propagate: true})
	if err != nil {
		t.Fatal(err)
	}
	bal := newTestBalancer(t, backend.URL)
	px := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry(), Tracer: tp})
	f := newFrontOf(t, px, bal)
	resp, err := http.Post(f.URL+"/v1/messages", "application/json", strings.NewReader(
		`{"model":"`+testModel+`","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.waitHandler(t, 1)
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*tracepb.Span{}
	for _, sp := range rcv.spans {
		byName[sp.Name] = sp
	}
	for _, name := range []string{"llmlb.request", "llmlb.attempt"} {
		sp := byName[name]
		if sp == nil || sp.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("span %s: %v; want status error", name, sp)
		}
	}
	if g := attr(byName["llmlb.request"], "http.response.status_code"); g != "502" {
		t.Errorf("request span status code %q, want 502", g)
	}
}

// TestBrokenConnectionIsPickedAgain: a request whose only candidate
// closes the connection before answering (a server killed with the
// request in its hands) is picked again, away from it, and answered.
func TestBrokenConnectionIsPickedAgain(t *testing.T) {
	live := httptest.NewServer(&cutEngine{name: "live", cutAfter: 99})
	defer live.Close()
	dying := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer dying.Close()
	bal := newTestBalancerCandidates(t, 1, dying.URL, live.URL)
	f := newFrontOn(t, DefaultConfig(), bal)
	wantAnswered(t, f, 4)
}

// TestSaturatedPrefillIs503: a P/D request whose decode server must split
// (SGLang) while every prefill server is saturated is told so, 503 with
// Retry-After, not 502 "could not be reached".
func TestSaturatedPrefillIs503(t *testing.T) {
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: newTestBalancer(t), Registerer: prometheus.NewRegistry()})
	he := s.errorFor(context.Background(), fmt.Errorf("prefill leg for decode server d: %w", balancer.ErrSaturated))
	if he.Status != http.StatusServiceUnavailable || he.Code != "prefill_saturated" || he.RetryAfter <= 0 {
		t.Errorf("errorFor(prefill saturated) = %d %s (retry after %v); want 503 prefill_saturated with Retry-After", he.Status, he.Code, he.RetryAfter)
	}
}

// TestCompressedAnswersPassUnread: a server that compresses its answer
// for a client that asked for it (llmlb passes Accept-Encoding on) has it
// passed on byte for byte: neither the stream pipeline nor the JSON hold
// reads compressed bytes as events or JSON.
func TestCompressedAnswersPassUnread(t *testing.T) {
	var sse, js bytes.Buffer
	zw := gzip.NewWriter(&sse)
	evs := strings.SplitAfter(messagesStream, "\n\n")
	io.WriteString(zw, strings.Join(evs[:len(evs)-3], "")) // cut short, which llmlb cannot tell
	zw.Close()
	zw = gzip.NewWriter(&js)
	io.WriteString(zw, `{"id":"cmpl-1","choices":[{"text":"ok"}]}`)
	zw.Close()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Encoding", "gzip")
		if strings.HasSuffix(r.URL.Path, "/messages") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write(sse.Bytes())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(js.Bytes())
	}))
	defer backend.Close()
	f := newFront(t, DefaultConfig(), backend.URL)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	for _, c := range []struct {
		path, body string
		want       []byte
	}{
		{"/v1/messages", `{"model":"` + testModel + `","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`, sse.Bytes()},
		{"/v1/completions", `{"model":"` + testModel + `","prompt":"Hi","max_tokens":1}`, js.Bytes()},
	} {
		req, _ := http.NewRequest(http.MethodPost, f.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, c.want) {
			t.Errorf("%s: %d, %d bytes (%v); want 200 and the server's %d compressed bytes", c.path, resp.StatusCode, len(got), err, len(c.want))
		}
	}
}

// wantAnswered sends n streamed chats through f one after another and
// fails unless each is answered whole; then every ledger is back at 0.
func wantAnswered(t *testing.T, f *testFront, n int) {
	t.Helper()
	for i := range n {
		resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"`+testModel+`","messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		_, clean := readStream(t, resp)
		f.waitHandler(t, 1)
		if resp.StatusCode != http.StatusOK || !clean {
			t.Errorf("request %d: status %d, clean %v; want a whole answer from the live server", i, resp.StatusCode, clean)
		}
	}
	f.checkLedgerZero(t)
}

// TestClientLeavingAfterTerminatorIsAnswered: a client that stops reading
// at its stream's terminator and hangs up, before the server's body has
// ended, got a whole answer: it is counted 200, not 499; one that hangs up
// while the server holds back the terminator is counted 499. Every API's
// terminator.
func TestClientLeavingAfterTerminatorIsAnswered(t *testing.T) {
	completion := "data: {\"id\":\"c1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"Hi\"}]}\n\ndata: [DONE]\n\n"
	chat := "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
	tests := []struct{ name, path, body, stream, last string }{
		{"completions", "/v1/completions", `{"model":"` + testModel + `","prompt":"Hi","max_tokens":16,"stream":true}`, completion, "data: [DONE]"},
		{"chat", "/v1/chat/completions", `{"model":"` + testModel + `","messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"stream":true}`, chat, "data: [DONE]"},
		{"messages", "/v1/messages", `{"model":"` + testModel + `","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`, messagesStream, `data: {"type":"message_stop"}`},
		{"responses", "/v1/responses", `{"model":"` + testModel + `","input":"Hi","stream":true}`, responsesStream, `"type":"response.completed"`},
	}
	for _, tc := range tests {
		for _, early := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/early=%v", tc.name, early), func(t *testing.T) {
				// The server sends the whole stream (early: all but its
				// terminator) and then holds its body open until the
				// proxy hangs up.
				body := tc.stream
				if early {
					evs := strings.SplitAfter(body, "\n\n")
					body = strings.Join(evs[:len(evs)-2], "")
				}
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, body)
					w.(http.Flusher).Flush()
					<-r.Context().Done()
				}))
				defer srv.Close()
				f := newFront(t, DefaultConfig(), srv.URL)
				resp, err := http.Post(f.URL+tc.path, "application/json", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				sc := bufio.NewScanner(resp.Body)
				var lines []string
				for sc.Scan() {
					lines = append(lines, sc.Text())
					if early && strings.HasPrefix(sc.Text(), "data:") || !early && strings.Contains(sc.Text(), tc.last) {
						break
					}
				}
				resp.Body.Close() // leaves before the body ends: the connection closes
				f.waitHandler(t, 1)
				want, other := "200", "499"
				if early {
					want, other = other, want
				}
				if n := testutil.ToFloat64(f.metric(t).requests.WithLabelValues(testModel, testModel, srv.URL, want)); n != 1 {
					t.Errorf("requests with status %s = %v, want 1 (the client read %q)", want, n, lines)
				}
				if n := testutil.ToFloat64(f.metric(t).requests.WithLabelValues(testModel, testModel, srv.URL, other)); n != 0 {
					t.Errorf("requests with status %s = %v, want 0", other, n)
				}
				f.checkLedgerZero(t)
			})
		}
	}
}
