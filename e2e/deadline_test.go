package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// deadlinePost streams a small completion through addr with headers h and
// returns the status, x-llmlb-reason, Retry-After and the body.
func deadlinePost(t *testing.T, addr, path string, h map[string]string) (int, string, string, string) {
	t.Helper()
	body := `{"model":"` + testModel + `","prompt":"hello","max_tokens":3,"stream":true}`
	if strings.HasSuffix(path, "/messages") {
		body = `{"model":"` + testModel + `","max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Llmlb-Reason"), resp.Header.Get("Retry-After"), string(b)
}

// A deadline no backend's estimate can meet (1ms): a sheddable request is
// refused at once with 429 and Retry-After, one of priority 0 goes to the
// backend that misses by least and is counted as missed, a loose one as
// met; a deadline that is not a positive whole number of milliseconds is
// a 400 in the API's own shape.
func TestDeadlines(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000})
	inst := startTest(t, testConfig(urls), 2)

	status, _, retry, body := deadlinePost(t, inst.Addr, "/v1/completions", map[string]string{"X-Llmlb-Priority": "-1", "x-slo-ttft-ms": "1"})
	if status != http.StatusTooManyRequests || retry == "" || !strings.Contains(body, "deadline_unmeetable") {
		t.Errorf("sheddable, deadline none can meet: %d (Retry-After %q) %s", status, retry, body)
	}
	status, reason, _, _ := deadlinePost(t, inst.Addr, "/v1/completions", map[string]string{"x-slo-ttft-ms": "1"})
	if status != http.StatusOK || reason != "deadline" {
		t.Errorf("priority 0, deadline none can meet: %d, reason %q; want 200 from the backend that misses by least", status, reason)
	}
	if status, _, _, _ := deadlinePost(t, inst.Addr, "/v1/completions", map[string]string{"x-slo-ttft-ms": "60000", "x-slo-tpot-ms": "60000"}); status != http.StatusOK {
		t.Errorf("a loose deadline: %d", status)
	}
	ss := scrapeAdmin(t, inst.AdminAddr)
	if p, _ := sum(ss, "llmlb_ttft_predicted_seconds_total"); p <= 0 {
		t.Errorf("no predicted TTFT counted for the streams answered: %v", p)
	}
	if o, _ := sum(ss, "llmlb_ttft_observed_seconds_total"); o <= 0 {
		t.Errorf("no observed TTFT counted for the streams answered: %v", o)
	}
	if v, n := sum(ss, "llmlb_model_saturation", `model="`+testModel+`"`); n != 1 || v < 0 || v > 1 {
		t.Errorf("llmlb_model_saturation for %s: %d series, %v; want one, 0 to 1", testModel, n, v)
	}
	for _, w := range []struct {
		labels []string
		want   float64
	}{
		{[]string{`priority="negative"`, `slo="ttft"`, `result="refused"`}, 1},
		{[]string{`priority="zero"`, `slo="ttft"`, `result="missed"`}, 1},
		{[]string{`priority="zero"`, `slo="ttft"`, `result="met"`}, 1},
		{[]string{`priority="zero"`, `slo="tpot"`, `result="met"`}, 1},
	} {
		if got, _ := sum(ss, "llmlb_slo_requests_total", w.labels...); got != w.want {
			t.Errorf("llmlb_slo_requests_total%v = %v, want %v", w.labels, got, w.want)
		}
	}

	for _, h := range []map[string]string{
		{"x-slo-ttft-ms": "soon"}, {"x-slo-ttft-ms": "0"}, {"x-slo-ttft-ms": "-5"}, {"x-slo-ttft-ms": "1.5"},
		{"x-slo-ttft-ms": "86400001"}, {"x-slo-tpot-ms": "x"}, {"x-sgl-ttft-slo-ms": "0"}, {"x-sgl-tps-slo": "NaN"}, {"x-sgl-tps-slo": "0"},
	} {
		status, _, _, body := deadlinePost(t, inst.Addr, "/v1/completions", h)
		var e struct {
			Error struct{ Type, Message string }
		}
		if status != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || e.Error.Type != "invalid_request_error" {
			t.Errorf("%v: %d %s, want 400 in OpenAI's shape", h, status, body)
		}
	}
	status, _, _, body = deadlinePost(t, inst.Addr, "/v1/messages", map[string]string{"x-slo-ttft-ms": "soon"})
	if status != http.StatusBadRequest || !strings.Contains(body, `"type":"error"`) {
		t.Errorf("Messages, a bad deadline: %d %s, want 400 in Anthropic's shape", status, body)
	}
}

// With keys, the deadline headers of a key not allowed to set its
// priority are ignored, not refused, as the priority header is.
func TestDeadlineHeadersOfAKeyNotAllowed(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000})
	cfg := testConfig(urls)
	cfg.Auth = proxy.AuthConfig{Keys: []proxy.KeyConfig{{Name: "alpha", Key: proxy.HashKey(testKeyA)}}}
	inst := startTest(t, cfg, 1)
	status, _, _, body := deadlinePost(t, inst.Addr, "/v1/completions", map[string]string{"Authorization": "Bearer " + testKeyA, "x-slo-ttft-ms": "soon", "X-Llmlb-Priority": "-1"})
	if status != http.StatusOK {
		t.Errorf("an untrusted key's bad deadline: %d %s, want it ignored", status, body)
	}
	if got, _ := sum(scrapeAdmin(t, inst.AdminAddr), "llmlb_slo_requests_total"); got != 0 {
		t.Errorf("an untrusted key's deadline was counted: %v", got)
	}
}

// A stream whose server ends it early is continued on another server even
// when its TTFT deadline has passed by then: the first token came, and
// the continuation is not refused for it (it was, as a sheddable request
// whose deadline no estimate met).
func TestContinuationIsNotRefusedForItsDeadline(t *testing.T) {
	// The truncating server ends each answer after 20 of its tokens, a
	// second in at 20 tokens a second: past the 500ms deadline.
	bad, badURL := faultableSim(t, sim.SteadyConfig{DecodeTokensPerSecond: 20})
	_, goodURL := faultableSim(t, sim.SteadyConfig{DecodeTokensPerSecond: 2000})
	faults, err := sim.ParseFaults("die-mid-stream:events=20,framing=clean")
	if err != nil {
		t.Fatal(err)
	}
	bad.SetFaults(faults)
	inst := startTest(t, testConfig([]string{badURL, goodURL}), 2)
	names := backendNames(t, inst.AdminAddr)
	for i := range 20 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+inst.Addr+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"%s","prompt":"story number %d","max_tokens":40,"stream":true}`, testModel, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Llmlb-Priority", "-1")
		req.Header.Set("x-slo-ttft-ms", "500")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if names[resp.Header.Get("X-Llmlb-Backend")] != badURL {
			resp.Body.Close()
			continue // placed on the server that does not truncate: try another prompt
		}
		events, err := readSSE(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(events) == 0 || events[len(events)-1].data != "[DONE]" || strings.Contains(events[len(events)-1].data, "error") {
			t.Errorf("the stream the truncating server broke, past its deadline, ended with %+v; want it continued to [DONE]", events[len(events)-1:])
		}
		return
	}
	t.Fatal("no prompt of 20 was placed on the truncating server")
}

// A deadline from config: a model's applies to its requests that set
// none; a key's goes before it; the header goes before both.
func TestDeadlineDefaultsFromConfig(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000})
	cfg := testConfig(urls)
	cfg.Models = []balancer.ModelRoute{{Name: "tight", Targets: []balancer.ModelTarget{{Model: testModel}}, Priority: -1, SLOTTFT: time.Millisecond}}
	cfg.Auth = proxy.AuthConfig{Keys: []proxy.KeyConfig{
		{Name: "alpha", Key: proxy.HashKey(testKeyA), AllowPriorityHeader: true},
		{Name: "bravo", Key: proxy.HashKey(testKeyB), SLOTTFT: time.Hour},
	}}
	inst := startTest(t, cfg, 2)
	post := func(key string, h map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+inst.Addr+"/v1/completions",
			strings.NewReader(`{"model":"tight","prompt":"hello","max_tokens":3}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(testKeyA, nil); got != http.StatusTooManyRequests {
		t.Errorf("the model's 1ms deadline, sheddable: %d, want 429", got)
	}
	if got := post(testKeyB, nil); got != http.StatusOK {
		t.Errorf("the key's hour goes before the model's 1ms: %d, want 200", got)
	}
	if got := post(testKeyA, map[string]string{"x-slo-ttft-ms": "3600000"}); got != http.StatusOK {
		t.Errorf("the header's hour goes before the model's 1ms: %d, want 200", got)
	}
}

// TestFirstTokenModelShown: once a backend has answered a few requests,
// /debug/backends shows the first-token model learned from its answers,
// which deadlines are judged by; before, none.
func TestFirstTokenModelShown(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000})
	inst := startTest(t, testConfig(urls), 1)
	model := func() *balancer.FirstTokenModel {
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
		if err != nil || len(bs) != 1 {
			t.Fatalf("backends: %v %v", bs, err)
		}
		return bs[0].FirstToken
	}
	if m := model(); m != nil {
		t.Fatalf("a first-token model before any request: %+v", m)
	}
	for range 8 {
		if status, _, _, body := deadlinePost(t, inst.Addr, "/v1/completions", nil); status != http.StatusOK {
			t.Fatalf("request: %d %s", status, body)
		}
	}
	if m := model(); m == nil || m.Samples < 5 || m.Rate <= 0 || m.Base < 0 {
		t.Errorf("after 8 requests, first-token model %+v; want one learned from them", m)
	}
}
