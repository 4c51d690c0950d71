package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// Issue 53: an answer reaches the client whole or visibly failed, however
// a server ends it early. One of two servers behind llmlb (round-robin)
// ends every answer after 3 tokens, in each of die-mid-stream's framings:
// a chunked body cut without its last chunk, one ended cleanly with it,
// and a body delimited by the connection, closed. The test judges only
// what the client receives, and llmlb's metrics page after.

// truncTokens is the answer length the clients ask for; the truncating
// server ends answers after truncEvents.
const (
	truncTokens = 16
	truncEvents = 3
)

// truncAPI is one API as the test asks and judges it.
type truncAPI struct {
	name, path string
	// body is a request of truncTokens tokens, streamed or not.
	body func(stream bool) string
	// whole says what is wrong with a stream that ended with last, its
	// terminator, or "": deltas is its content events.
	whole func(last sseEvent, deltas int, events []sseEvent) string
	// terminal reports whether ev is the API's terminator; errorEvent
	// whether it is an error event in the API's shape. A stream must end
	// with one or the other.
	terminal, errorEvent func(ev sseEvent) bool
	// delta reports whether ev carries content.
	delta func(ev sseEvent) bool
	// mustBeWhole: the stream must end whole, not with an error event
	// (completions and chat, which llmlb continues on another server).
	mustBeWhole bool
	// wholeJSON says what is wrong with a non-streamed answer's JSON, or "".
	wholeJSON func(v map[string]any) string
}

// sseEvent is one server-sent event: its name ("" when unnamed) and its
// data lines joined.
type sseEvent struct{ name, data string }

// readSSE reads the events of a stream up to its end; an event not ended
// by a blank line when the body ends is left out.
func readSSE(r io.Reader) ([]sseEvent, error) {
	var evs []sseEvent
	var ev sseEvent
	open := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if open {
				evs = append(evs, ev)
			}
			ev, open = sseEvent{}, false
		case strings.HasPrefix(line, "event:"):
			ev.name, open = strings.TrimSpace(strings.TrimPrefix(line, "event:")), true
		case strings.HasPrefix(line, "data:"):
			d := strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
			if ev.data != "" {
				d = ev.data + "\n" + d
			}
			ev.data, open = d, true
		}
	}
	return evs, sc.Err()
}

// field returns the JSON value at path in data, or nil.
func field(data string, path ...any) any {
	var v any
	if json.Unmarshal([]byte(data), &v) != nil {
		return nil
	}
	return dig(v, path...)
}

// openAIError reports whether ev is an OpenAI error event:
// data: {"error": {...}}.
func openAIError(ev sseEvent) bool {
	_, ok := field(ev.data, "error").(map[string]any)
	return ok
}

// openAIWhole judges a completions or chat stream that ended with
// [DONE]: truncTokens pieces and a finish_reason.
func openAIWhole(_ sseEvent, deltas int, evs []sseEvent) string {
	finish := ""
	for _, ev := range evs {
		if f, ok := field(ev.data, "choices", 0, "finish_reason").(string); ok {
			finish = f
		}
	}
	if deltas != truncTokens || finish == "" {
		return fmt.Sprintf("ended with [DONE] after %d of %d pieces, finish_reason %q", deltas, truncTokens, finish)
	}
	return ""
}

var truncAPIs = []truncAPI{
	{
		name: "completions", path: "/v1/completions",
		body: func(stream bool) string {
			return fmt.Sprintf(`{"model":%q,"prompt":"Once upon a time","max_tokens":%d,"stream":%v}`, testModel, truncTokens, stream)
		},
		terminal:    func(ev sseEvent) bool { return ev.data == "[DONE]" },
		errorEvent:  openAIError,
		delta:       func(ev sseEvent) bool { t, _ := field(ev.data, "choices", 0, "text").(string); return t != "" },
		whole:       openAIWhole,
		mustBeWhole: true,
		wholeJSON: func(v map[string]any) string {
			if f, _ := dig(v, "choices", 0, "finish_reason").(string); f == "" {
				return "no finish_reason"
			}
			return ""
		},
	},
	{
		name: "chat", path: "/v1/chat/completions",
		body: func(stream bool) string {
			return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":%d,"stream":%v}`, testModel, truncTokens, stream)
		},
		terminal:   func(ev sseEvent) bool { return ev.data == "[DONE]" },
		errorEvent: openAIError,
		delta: func(ev sseEvent) bool {
			c, _ := field(ev.data, "choices", 0, "delta", "content").(string)
			return c != ""
		},
		whole:       openAIWhole,
		mustBeWhole: true,
		wholeJSON: func(v map[string]any) string {
			if f, _ := dig(v, "choices", 0, "finish_reason").(string); f == "" {
				return "no finish_reason"
			}
			return ""
		},
	},
	{
		name: "messages", path: "/v1/messages",
		body: func(stream bool) string {
			return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%v,"messages":[{"role":"user","content":"Tell me a story"}]}`, testModel, truncTokens, stream)
		},
		terminal: func(ev sseEvent) bool { return ev.name == "message_stop" },
		// Anthropic's: event: error, {"type":"error","error":{"type":"api_error",...}}.
		errorEvent: func(ev sseEvent) bool {
			return ev.name == "error" && field(ev.data, "type") == "error" && field(ev.data, "error", "type") == "api_error"
		},
		delta: func(ev sseEvent) bool { return ev.name == "content_block_delta" },
		whole: func(_ sseEvent, deltas int, evs []sseEvent) string {
			stop := ""
			for _, ev := range evs {
				if ev.name == "message_delta" {
					stop, _ = field(ev.data, "delta", "stop_reason").(string)
				}
			}
			if deltas != truncTokens || stop == "" {
				return fmt.Sprintf("ended with message_stop after %d of %d deltas, stop_reason %q", deltas, truncTokens, stop)
			}
			return ""
		},
		wholeJSON: func(v map[string]any) string {
			if s, _ := v["stop_reason"].(string); s == "" {
				return "no stop_reason"
			}
			return ""
		},
	},
	{
		name: "responses", path: "/v1/responses",
		body: func(stream bool) string {
			return fmt.Sprintf(`{"model":%q,"input":"Tell me a story","max_output_tokens":%d,"stream":%v}`, testModel, truncTokens, stream)
		},
		terminal: func(ev sseEvent) bool {
			return ev.name == "response.completed" || ev.name == "response.incomplete"
		},
		// A response.failed event ends a stream visibly failed, as an
		// error event does.
		errorEvent: func(ev sseEvent) bool {
			return (ev.name == "response.failed" || ev.name == "error") && json.Valid([]byte(ev.data))
		},
		delta: func(ev sseEvent) bool { return ev.name == "response.output_text.delta" },
		whole: func(last sseEvent, deltas int, _ []sseEvent) string {
			if deltas != truncTokens {
				return fmt.Sprintf("ended with %s after %d of %d deltas", last.name, deltas, truncTokens)
			}
			return ""
		},
		wholeJSON: func(v map[string]any) string {
			if s, _ := v["status"].(string); s != "completed" && s != "incomplete" {
				return fmt.Sprintf("status %q", s)
			}
			return ""
		},
	},
}

// TestTruncatedAnswersEndWholeOrVisiblyFailed: for each framing, API and
// streamed or not, llmlb (round-robin, eject_after 3) in front of a good
// server and one that ends every answer after 3 tokens. Every client
// stream ends with its API's terminator or an error event in its API's
// shape, and completions and chat streams end whole (16 pieces, a
// finish_reason, [DONE]) after continuation; every non-streamed answer is
// whole, parseable JSON or an error status. Afterwards llmlb's metrics
// page shows the truncating server ejected by passive health, and, for
// streams, the broken streams counted in llmlb_stream_continuations_total.
// Issue 53: before llmlb judged a stream whole by its API's terminator
// (proxy/stream), 18 of the 24 cases failed.
func TestTruncatedAnswersEndWholeOrVisiblyFailed(t *testing.T) {
	t.Parallel()
	for _, framing := range sim.Framings() {
		for _, api := range truncAPIs {
			for _, stream := range []bool{true, false} {
				mode := "streamed"
				if !stream {
					mode = "not-streamed"
				}
				t.Run(fmt.Sprintf("%s/%s/%s", framing, api.name, mode), func(t *testing.T) {
					runTruncate(t, framing, api, stream)
				})
			}
		}
	}
}

// truncRequests is how many requests each case sends, one after
// another: round-robin gives the truncating server about half, more than
// eject_after.
const truncRequests = 10

func runTruncate(t *testing.T, framing sim.Framing, api truncAPI, stream bool) {
	bad, badURL := faultableSim(t, sim.SteadyConfig{Speed: 100})
	_, goodURL := faultableSim(t, sim.SteadyConfig{Speed: 100})
	faults, err := sim.ParseFaults(fmt.Sprintf("die-mid-stream:events=%d,framing=%s", truncEvents, framing))
	if err != nil {
		t.Fatal(err)
	}
	bad.SetFaults(faults)
	cfg := testConfig([]string{badURL, goodURL})
	cfg.Balancer.Policy = "round-robin"
	cfg.Balancer.Passive.EjectAfter = 3
	inst := startTest(t, cfg, 2)

	client := &http.Client{Timeout: 30 * time.Second}
	for i := range truncRequests {
		resp, err := client.Post("http://"+inst.Addr+api.path, "application/json", strings.NewReader(api.body(stream)))
		if err != nil {
			t.Errorf("request %d: %v", i, err)
			continue
		}
		var what string
		if stream {
			what = judgeStream(api, resp)
		} else {
			what = judgeJSON(api, resp)
		}
		resp.Body.Close()
		if what != "" {
			t.Errorf("request %d (backend %q): %s", i, resp.Header.Get("X-Llmlb-Backend"), what)
		}
	}
	if p := simCounter(t, badURL, "vllm:prompt_tokens_total"); p <= 0 {
		t.Fatalf("the truncating server ran no request (prompt tokens %g): the case tested nothing", p)
	}

	// Passive health: the truncating server failed every request it took,
	// more than eject_after in a row, so it was ejected. Metrics are
	// counted as each request finishes, which may be just after the
	// client read its last byte: poll.
	ejections := fmt.Sprintf("llmlb_backend_ejections_total{backend=%q}", badURL)
	if !waitFor(5*time.Second, func() bool { return metricValue(t, inst.AdminAddr, ejections) >= 1 }) {
		ss := scrapeAdmin(t, inst.AdminAddr)
		t.Errorf("passive health: %s = %g, want at least 1; llmlb_ejections_total %v", ejections, metricValue(t, inst.AdminAddr, ejections), ss["llmlb_ejections_total"])
	}
	if stream {
		// Every stream the truncating server ended early broke, and is
		// counted whatever came of it.
		if !waitFor(5*time.Second, func() bool {
			n, _ := sum(scrapeAdmin(t, inst.AdminAddr), "llmlb_stream_continuations_total")
			return n >= 1
		}) {
			t.Errorf("llmlb_stream_continuations_total = %v, want at least one break counted", scrapeAdmin(t, inst.AdminAddr)["llmlb_stream_continuations_total"])
		}
		for _, s := range scrapeAdmin(t, inst.AdminAddr)["llmlb_stream_continuations_total"] {
			if s.value > 0 {
				t.Logf("llmlb_stream_continuations_total%s %g", s.labels, s.value)
			}
		}
	}
}

// judgeStream says what is wrong with a streamed answer as the client
// received it, or "".
func judgeStream(api truncAPI, resp *http.Response) string {
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		if api.mustBeWhole {
			return fmt.Sprintf("status %d: %s; want a whole stream", resp.StatusCode, b)
		}
		// Failed before the stream began: visibly, if in the API's error
		// shape.
		if _, ok := field(string(b), "error").(map[string]any); !ok {
			return fmt.Sprintf("status %d with a body not in the API's error shape: %s", resp.StatusCode, b)
		}
		return ""
	}
	evs, err := readSSE(resp.Body)
	deltas := 0
	for _, ev := range evs {
		if api.delta(ev) {
			deltas++
		}
	}
	// The stream is judged by its last whole event: after an error event
	// llmlb ends the connection as failed (docs/design/streams.md), so the
	// body may break there, and a client has read the event by then.
	body := "the body ended cleanly"
	if err != nil {
		body = fmt.Sprintf("the body broke (%v)", err)
	}
	if len(evs) == 0 {
		return "a stream of no events; " + body
	}
	last := evs[len(evs)-1]
	switch {
	case api.terminal(last):
		return api.whole(last, deltas, evs)
	case api.errorEvent(last):
		if api.mustBeWhole {
			return fmt.Sprintf("ended with an error event after %d deltas, want it whole: %s", deltas, last.data)
		}
		return ""
	}
	return fmt.Sprintf("%s after %d events, %d deltas, the last %q %.200s: neither terminator nor error event", body, len(evs), deltas, last.name, last.data)
}

// judgeJSON says what is wrong with a non-streamed answer as the client
// received it, or "": it must be whole JSON or an error status.
func judgeJSON(api truncAPI, resp *http.Response) string {
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("status %d, body broken after %d bytes: %v", resp.StatusCode, len(b), err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Sprintf("status %d with JSON cut short (%v): %.200s", resp.StatusCode, err, b)
	}
	if what := api.wholeJSON(v); what != "" {
		return fmt.Sprintf("status %d, JSON not whole: %s: %.200s", resp.StatusCode, what, b)
	}
	return ""
}

// simCounter reads a sample's value, summed over its labels, from an
// emulated server's metrics page.
func simCounter(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			total += v
		}
	}
	return total
}
