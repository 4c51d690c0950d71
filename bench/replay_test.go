package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// TestReplayAgainstEmulatedServer replays a small workload over real HTTP
// against an emulated vLLM server running the engine model: every request
// is answered, usage and cached tokens come from the server's final usage
// chunk, and the model is found from /v1/models.
func TestReplayAgainstEmulatedServer(t *testing.T) {
	cfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.NewServer(sim.ServerConfig{Model: "m", Adapters: []string{"lora-00"}}, sim.NewLive(cfg, 50))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	w, err := Build("shared-prefix", Params{Scale: 0.01, Rate: 20, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&HTTPReplay{URL: srv.URL}).Replay(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Policy != "target" || res.Failed != 0 || res.Refused != 0 || len(res.TTFT) != len(w.Requests) || len(res.E2E) != len(w.Requests) {
		t.Fatalf("%d requests: %+v", len(w.Requests), res)
	}
	var prompt int64
	for i := range w.Requests {
		prompt += int64(w.Requests[i].Tokens())
	}
	if res.PromptTokens < prompt/2 || res.OutputTokens != int64(len(w.Requests)*200) {
		t.Errorf("usage: prompt %d (sent ~%d), output %d (asked %d)", res.PromptTokens, prompt, res.OutputTokens, len(w.Requests)*200)
	}
	if res.CachedTokens <= 0 || res.CachedTokens >= res.PromptTokens {
		t.Errorf("cached %d of %d prompt tokens: the shared system prompts should hit", res.CachedTokens, res.PromptTokens)
	}
	for i := range res.TTFT {
		if res.TTFT[i] <= 0 || res.E2E[i] < res.TTFT[i] {
			t.Fatalf("request %d: ttft %v e2e %v", i, res.TTFT[i], res.E2E[i])
		}
	}
	if len(res.PerBackend) != 0 {
		t.Errorf("no %s header, yet per-backend counts %v", proxy.HeaderBackend, res.PerBackend)
	}
}

// TestReplayCountsRefusalsAndFailures: 429s and 503s are refusals; an
// error status, a stream cut before [DONE] and an error event are failures;
// the backend header is counted per backend.
func TestReplayCountsRefusalsAndFailures(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"lora","parent":"base"},{"id":"base","parent":null}]}`)
			return
		}
		i := n.Add(1)
		w.Header().Set(proxy.HeaderBackend, fmt.Sprintf("b%d", i%2))
		ok := `data: {"choices":[{"text":"hi"}]}` + "\n\n" + `data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}` + "\n\ndata: [DONE]\n\n"
		switch i % 6 {
		case 0:
			w.WriteHeader(http.StatusTooManyRequests)
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			http.Error(w, `{"error":{"message":"boom"}}`, http.StatusBadGateway)
		case 3:
			fmt.Fprint(w, `data: {"choices":[{"text":"hi"}]}`+"\n\n") // cut: no [DONE]
		case 4:
			fmt.Fprint(w, `data: {"error":{"message":"engine died"}}`+"\n\n")
		default:
			fmt.Fprint(w, ok)
		}
	}))
	defer srv.Close()
	w := &Workload{Name: "x"}
	for range 12 {
		w.Requests = append(w.Requests, Request{Parts: []Part{{ID: 1, Tokens: 10}}, MaxTokens: 1})
	}
	res, err := (&HTTPReplay{URL: srv.URL + "/", Label: "haproxy"}).Replay(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Policy != "haproxy" || res.Refused != 4 || res.Failed != 6 || len(res.TTFT) != 2 || res.OutputTokens != 2 || res.PromptTokens != 20 {
		t.Fatalf("%+v", res)
	}
	if len(res.PerBackend) != 1 || res.PerBackend[0] != 2 { // i%6==5: odd i, backend b1
		t.Errorf("per backend %v", res.PerBackend)
	}
	all := &Workload{Name: "y", Requests: w.Requests[:1]}
	n.Store(1) // the next is i%6==2: a 502
	if _, err := (&HTTPReplay{URL: srv.URL}).Replay(context.Background(), all); err == nil {
		t.Error("a run in which every request failed returned no error")
	}
}
