package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/llmlb/llmlb/sim"
)

// recorder keeps the bodies of the requests that continue a stream.
type recorder struct {
	next   http.Handler
	mu     sync.Mutex
	bodies []map[string]any
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	var body map[string]any
	if json.Unmarshal(b, &body) == nil && (body["continue_final_message"] == true || strings.HasPrefix(fmt.Sprint(body["prompt"]), "Once upon a time ")) {
		rec.mu.Lock()
		rec.bodies = append(rec.bodies, body)
		rec.mu.Unlock()
	}
	rec.next.ServeHTTP(w, r)
}

// TestStreamsSurviveAServerThatCutsThem: one of two servers cuts every
// stream after its third chunk. Every client stream, 20 completions and
// 10 chats, ends whole, its 16 pieces of text and a finish_reason on the
// last, because llmlb asks the other server for the rest: max_tokens 13.
func TestStreamsSurviveAServerThatCutsThem(t *testing.T) {
	faults, err := sim.ParseFaults("die-mid-stream:events=3")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	var good *recorder
	for i := range 2 {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
		if err != nil {
			t.Fatal(err)
		}
		var h http.Handler = s.Handler()
		if i == 0 {
			s.SetFaults(faults)
		} else {
			good = &recorder{next: h}
			h = good
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	cfg := testConfig(urls)
	cfg.Balancer.Policy = "round-robin"
	cfg.Balancer.Passive.EjectAfter = 0 // the cutting server keeps its share
	inst := startTest(t, cfg, 2)

	var wg sync.WaitGroup
	errs := make(chan string, 30)
	for i := range 30 {
		chat := i >= 20
		wg.Go(func() {
			path, body := "/v1/completions", `{"model":"`+testModel+`","prompt":"Once upon a time","max_tokens":16,"stream":true}`
			if chat {
				path, body = "/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":16,"stream":true}`
			}
			resp, err := http.Post("http://"+inst.Addr+path, "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err.Error()
				return
			}
			defer resp.Body.Close()
			pieces, finish, done := 0, "", false
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				d, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				if d == "[DONE]" {
					done = true
					continue
				}
				var ch struct {
					Choices []struct {
						Text         string
						Delta        struct{ Content string }
						FinishReason *string `json:"finish_reason"`
					}
					Error any
				}
				if err := json.Unmarshal([]byte(d), &ch); err != nil || ch.Error != nil || len(ch.Choices) == 0 {
					errs <- fmt.Sprintf("stream %d: event %s", i, d)
					return
				}
				if c := ch.Choices[0]; c.Text != "" || c.Delta.Content != "" {
					pieces++
				}
				if f := ch.Choices[0].FinishReason; f != nil {
					finish = *f
				}
			}
			if pieces != 16 || finish == "" || !done {
				errs <- fmt.Sprintf("stream %d (chat %v): %d pieces, finish_reason %q, [DONE] %v", i, chat, pieces, finish, done)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	good.mu.Lock()
	defer good.mu.Unlock()
	if len(good.bodies) == 0 {
		t.Fatal("no stream was continued on the good server")
	}
	for _, b := range good.bodies {
		if b["max_tokens"] != 13.0 {
			t.Errorf("a continuation asked for max_tokens %v, want 13", b["max_tokens"])
		}
	}
	t.Logf("%d streams continued on the good server", len(good.bodies))
}
