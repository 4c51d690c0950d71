package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// cutEngine is a server that streams one word an event and, asked for a
// whole answer, cuts the connection after cutAfter words (a server dying
// mid-stream); a continuation (a completion whose prompt ends with words
// it wrote, a chat with continue_final_message) it answers whole. It
// records the bodies it was sent.
type cutEngine struct {
	name     string
	cutAfter int
	errEvent bool // send an error event and end, instead of cutting
	cutAtEnd bool // cut after the last token, before usage and [DONE]
	// end is how the stream ends at cutAfter: "" cuts the connection
	// mid-body; "clean" ends the chunked body cleanly, without [DONE];
	// "close" ends a body delimited by the connection (no chunked
	// framing) by shutting it.
	end    string
	mu     sync.Mutex
	bodies []map[string]any
}

func (e *cutEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.mu.Unlock()
	chat := r.URL.Path == "/v1/chat/completions"
	max := int(body["max_tokens"].(float64))
	cont := body["continue_final_message"] == true || !chat && strings.HasSuffix(body["prompt"].(string), " ")
	w.Header().Set("Content-Type", "text/event-stream")
	var out io.Writer = w
	flush := w.(http.Flusher).Flush
	if e.end == "close" && !cont {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		fmt.Fprint(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		out, flush = buf, func() { buf.Flush() }
	}
	id, created := "cmpl-"+e.name, 1000+len(e.name)
	send := func(v map[string]any) {
		v["id"], v["created"], v["model"] = id, created, testModel
		b, _ := json.Marshal(v)
		fmt.Fprintf(out, "data: %s\n\n", b)
		flush()
	}
	piece := func(i int, finish any) map[string]any {
		word := fmt.Sprintf("w%d ", i)
		if chat {
			return map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": word}, "finish_reason": finish}}}
		}
		return map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": word, "finish_reason": finish}}}
	}
	if chat {
		send(map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}}})
	}
	for i := range max {
		if !cont && i == e.cutAfter {
			if e.errEvent {
				fmt.Fprint(w, `data: {"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}`+"\n\n")
				return
			}
			if e.end != "" {
				return // the body ends, cleanly to HTTP
			}
			panic(http.ErrAbortHandler) // the connection is cut
		}
		var finish any
		if i == max-1 {
			finish = "length"
		}
		send(piece(i, finish))
	}
	if e.cutAtEnd {
		panic(http.ErrAbortHandler)
	}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
		send(map[string]any{"object": "chunk", "choices": []any{}, "usage": map[string]any{"prompt_tokens": 20, "completion_tokens": max, "total_tokens": 20 + max}})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// readStream reads a client's SSE stream: the data payloads, and whether
// it ended cleanly.
func readStream(t *testing.T, resp *http.Response) (events []map[string]any, clean bool) {
	t.Helper()
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			clean = true
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(d), &v); err != nil {
			t.Fatalf("event %q: %v", d, err)
		}
		events = append(events, v)
	}
	return events, clean && sc.Err() == nil
}

func TestBrokenStreamContinuesOnAnotherServer(t *testing.T) {
	for _, c := range []struct{ chat, errEvent bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		chat := c.chat
		a, b := &cutEngine{name: "a", cutAfter: 3, errEvent: c.errEvent}, &cutEngine{name: "bb", cutAfter: 3, errEvent: c.errEvent}
		sa, sb := httptest.NewServer(a), httptest.NewServer(b)
		defer sa.Close()
		defer sb.Close()
		f := newFront(t, DefaultConfig(), sa.URL, sb.URL)
		path, body := "/v1/completions", `{"model":"`+testModel+`","prompt":"Once upon a time","max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`
		if chat {
			path, body = "/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"Tell me"}],"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`
		}
		resp, err := http.Post(f.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		events, clean := readStream(t, resp)
		f.waitHandler(t, 1)
		var text strings.Builder
		var finish any
		var usage map[string]any
		ids := map[string]bool{}
		roles := 0
		for _, ev := range events {
			ids[fmt.Sprint(ev["id"], "/", ev["created"])] = true
			if u, ok := ev["usage"].(map[string]any); ok {
				usage = u
			}
			for _, c := range ev["choices"].([]any) {
				c := c.(map[string]any)
				if d, ok := c["delta"].(map[string]any); ok {
					if d["role"] != nil {
						roles++
					}
					text.WriteString(fmt.Sprint(d["content"]))
				} else {
					text.WriteString(c["text"].(string))
				}
				finish = c["finish_reason"]
			}
		}
		words := strings.Fields(text.String())
		if !clean || len(words) != 16 || finish != "length" || len(ids) != 1 || strings.Contains(text.String(), "error") {
			t.Errorf("chat %v: clean %v, %d words %q, last finish_reason %v, ids %v", chat, clean, len(words), text.String(), finish, ids)
		}
		if chat && roles != 1 {
			t.Errorf("chat: %d role chunks reached the client, want 1", roles)
		}
		if usage["prompt_tokens"] != 17.0 || usage["completion_tokens"] != 16.0 {
			t.Errorf("chat %v: usage %v; want the prompt once (20 less the 3 delivered) and 16 completion tokens", chat, usage)
		}
		// The server that did not break was asked for the rest.
		if len(a.bodies) != 1 || len(b.bodies) != 1 {
			t.Fatalf("chat %v: bodies a %d, b %d; want the request on one and its continuation on the other", chat, len(a.bodies), len(b.bodies))
		}
		cb := b.bodies[0]
		if cb["max_tokens"] == 16.0 {
			cb = a.bodies[0]
		}
		if cb["max_tokens"] != 13.0 {
			t.Errorf("chat %v: the continuation asked for max_tokens %v, want 13", chat, cb["max_tokens"])
		}
		if chat {
			msgs := cb["messages"].([]any)
			last := msgs[len(msgs)-1].(map[string]any)
			if len(msgs) != 2 || last["role"] != "assistant" || last["content"] != "w0 w1 w2 " || cb["continue_final_message"] != true || cb["add_generation_prompt"] != false {
				t.Errorf("continuation body %v", cb)
			}
		} else if cb["prompt"] != "Once upon a timew0 w1 w2 " {
			t.Errorf("continuation prompt %q", cb["prompt"])
		}
	}
}

// TestBrokenStreamNotContinued: with nowhere to continue, or a request
// that cannot be continued faithfully, the stream ends with an error
// event and is cut.
func TestBrokenStreamNotContinued(t *testing.T) {
	for _, c := range []struct {
		name     string
		backends int
		extra    string
	}{
		{"one server", 1, ""},
		{"n=2", 2, `,"n":2`},
		{"logprobs", 2, `,"logprobs":true`},
		{"response_format", 2, `,"response_format":{"type":"json_object"}`},
	} {
		var urls []string
		for range c.backends {
			s := httptest.NewServer(&cutEngine{name: "x", cutAfter: 3})
			defer s.Close()
			urls = append(urls, s.URL)
		}
		f := newFront(t, DefaultConfig(), urls...)
		resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"`+testModel+`","messages":[{"role":"user","content":"Tell me"}],"max_tokens":16,"stream":true`+c.extra+`}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
		if !strings.Contains(string(b), `"code":"stream_broken"`) || strings.Contains(string(b), "[DONE]") {
			t.Errorf("%s: the client got\n%s\nwant an error event and no [DONE]", c.name, b)
		}
	}
}

// TestStreamCutAfterItsLastToken: a server that dies after the
// finish_reason lost nothing: the client's stream ends whole, with its
// [DONE], and nothing is asked again.
func TestStreamCutAfterItsLastToken(t *testing.T) {
	a, b := &cutEngine{name: "a", cutAfter: 99, cutAtEnd: true}, &cutEngine{name: "b", cutAfter: 99, cutAtEnd: true}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	f := newFront(t, DefaultConfig(), sa.URL, sb.URL)
	resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"`+testModel+`","messages":[{"role":"user","content":"Tell me"}],"max_tokens":4,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	events, clean := readStream(t, resp)
	f.waitHandler(t, 1)
	if !clean || len(events) != 5 || len(a.bodies)+len(b.bodies) != 1 {
		t.Errorf("clean %v, %d events, %d requests to the servers; want a whole stream of 5 events and 1 request", clean, len(events), len(a.bodies)+len(b.bodies))
	}
}
