package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// evictStream is a sheddable stream of one API through llmlb.
type evictStream struct {
	api  string // chat, messages or responses
	resp *http.Response
	br   *bufio.Reader
}

// startEvictStream opens a sheddable stream of api with a prompt of some
// 1,000 tokens and reads its first event, so that the server is
// generating it.
func startEvictStream(t *testing.T, addr, api, word string) *evictStream {
	t.Helper()
	prompt := strings.Repeat(word+" ", 4000/(len(word)+1))
	var path, body string
	switch api {
	case "chat":
		path, body = "/v1/chat/completions", `{"model":"`+testModel+`","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"`+prompt+`"}]}`
	case "messages":
		path, body = "/v1/messages", `{"model":"`+testModel+`","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"`+prompt+`"}]}`
	case "responses":
		path, body = "/v1/responses", `{"model":"`+testModel+`","stream":true,"max_output_tokens":100,"input":"`+prompt+`"}`
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Llmlb-Priority", "-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s stream: %d %s", api, resp.StatusCode, b)
	}
	s := &evictStream{api: api, resp: resp, br: bufio.NewReader(resp.Body)}
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			t.Fatalf("%s stream ended before its first event: %v", api, err)
		}
		if line == "\n" {
			return s
		}
	}
}

// rest reads the stream to its end and returns its events.
func (s *evictStream) rest() []sseEvent {
	evs, _ := readSSE(s.br) // an evicted stream ends aborted, after its error event
	return evs
}

// evictedEvent reports whether ev is the error event of an evicted
// stream in api's shape.
func evictedEvent(api string, ev sseEvent) bool {
	switch api {
	case "messages":
		return ev.name == "error" && field(ev.data, "type") == "error" && field(ev.data, "error", "type") == "rate_limit_error"
	case "responses":
		return ev.name == "error" && field(ev.data, "type") == "error" && field(ev.data, "code") == "evicted"
	}
	return openAIError(ev) && field(ev.data, "error", "code") == "evicted"
}

// whole reports whether evs end with api's terminator.
func whole(api string, evs []sseEvent) bool {
	if len(evs) == 0 {
		return false
	}
	last := evs[len(evs)-1]
	switch api {
	case "messages":
		return last.name == "message_stop"
	case "responses":
		return last.name == "response.completed"
	}
	return last.data == "[DONE]"
}

// TestEvictionEndsNewestSheddableStream: with eviction on, two sheddable
// streams fill one server's KV cache past the saturation threshold; an
// urgent request waits, and after evict_after the newer stream ends with
// an error event in its API's shape, its place goes to the urgent
// request, which is served, and the older stream runs to its end. The
// eviction is counted and logged, and every ledger returns to 0. Run with
// the newest stream in each API, the older one in another.
func TestEvictionEndsNewestSheddableStream(t *testing.T) {
	for _, tc := range []struct{ older, newer string }{
		{"messages", "chat"},
		{"chat", "messages"},
		{"chat", "responses"},
	} {
		t.Run(tc.newer, func(t *testing.T) {
			t.Parallel()
			// 2,560 tokens of KV cache: one stream of ~1,100 tokens
			// leaves it under the 0.5 threshold, two fill it past. At 20
			// tokens a second each stream runs 5 s, long enough for a
			// loaded machine to see both running before either ends.
			urls := simBackends(t, 1, sim.SteadyConfig{DecodeTokensPerSecond: 20, BlockSize: 16, NumBlocks: 160})
			cfg := testConfig(urls)
			cfg.Balancer.Saturation.Queue, cfg.Balancer.Saturation.KV = 0, 0.5
			cfg.Balancer.Admission.EvictAfter = 100 * time.Millisecond
			cfg.Log.Level, cfg.Log.Format = "info", "json"
			inst, logs := startLogged(t, cfg, 1)

			older := startEvictStream(t, inst.Addr, tc.older, "alpha")
			newer := startEvictStream(t, inst.Addr, tc.newer, "bravo")
			// A reading taken as the newer stream started may not count
			// it, and llmlb's ledger counts it only from after that
			// reading's arrival: wait for one that shows both running,
			// which every later one does.
			if !waitFor(10*time.Second, func() bool {
				bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
				return err == nil && len(bs) == 1 && !bs[0].Stale && bs[0].Metrics != nil &&
					bs[0].Metrics.Running.V == 2 && bs[0].Metrics.KVUsage.V >= cfg.Balancer.Saturation.KV
			}) {
				t.Fatal("the server never reported both streams running and its KV cache past the threshold")
			}
			status, _, _, body := deadlinePost(t, inst.Addr, "/v1/completions", nil) // priority 0; waits, then is served
			if status != http.StatusOK {
				t.Errorf("urgent request: %d %s, want 200", status, body)
			}
			if evs := newer.rest(); len(evs) == 0 || !evictedEvent(tc.newer, evs[len(evs)-1]) {
				t.Errorf("newer %s stream ended with %s, want an evicted error event in its shape", tc.newer, lastEvent(evs))
			}
			if evs := older.rest(); !whole(tc.older, evs) {
				t.Errorf("older %s stream ended with %s, want it whole", tc.older, lastEvent(evs))
			}

			ss := scrapeAdmin(t, inst.AdminAddr)
			if n, _ := sum(ss, "llmlb_evictions_total", `model="`+testModel+`"`); n != 1 {
				t.Errorf("llmlb_evictions_total = %v, want 1", n)
			}
			if w, _ := sum(ss, "llmlb_admission_wait_seconds_count"); w != 1 {
				t.Errorf("requests that waited: %v, want the urgent one", w)
			}
			// The ledger is released, then the access line written, as
			// each request's handler returns.
			var inFlight int64
			evicted := 0
			if !waitFor(10*time.Second, func() bool {
				bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
				if err != nil || len(bs) != 1 {
					return false
				}
				inFlight, evicted = bs[0].InFlight, evictedLines(t, logs.String())
				return inFlight == 0 && evicted == 1
			}) {
				t.Errorf("in flight %d and %d access lines that say evicted after every request ended, want 0 and 1", inFlight, evicted)
			}
		})
	}
}

// evictedLines counts the access lines in logs (JSON) that say evicted,
// checking that each has status 429.
func evictedLines(t *testing.T, logs string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) != nil || l["msg"] != "request" || l["evicted"] != true {
			continue
		}
		n++
		if l["status"] != float64(http.StatusTooManyRequests) {
			t.Errorf("the evicted request's access line has status %v, want 429", l["status"])
		}
	}
	return n
}

// lastEvent is the last of evs, shortened, for a message.
func lastEvent(evs []sseEvent) string {
	if len(evs) == 0 {
		return "no event"
	}
	ev := evs[len(evs)-1]
	return ev.name + " " + ev.data[:min(len(ev.data), 200)]
}
