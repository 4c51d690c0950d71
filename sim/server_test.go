package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fastServer is an emulated vLLM running a thousand times faster than real
// time, so a test sees whole streams in milliseconds.
func fastServer(t *testing.T, adapters ...string) *httptest.Server {
	t.Helper()
	s, err := NewServer(ServerConfig{Model: "m", Adapters: adapters, MaxModelLen: 4096}, NewSteady(SteadyConfig{Speed: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// events reads an SSE body into its data payloads.
func events(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			blank = true
			continue
		}
		if !blank {
			t.Fatalf("two lines in one event: %q", line)
		}
		blank = false
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line", line)
		}
		out = append(out, data)
	}
	return out
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func TestChatStreamWithUsage(t *testing.T) {
	srv := fastServer(t)
	resp := post(t, srv.URL+"/v1/chat/completions",
		`{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := events(t, resp.Body)
	// role chunk, 5 content chunks, usage chunk, [DONE]
	if len(evs) != 8 || evs[7] != "[DONE]" {
		t.Fatalf("events = %q", evs)
	}
	var id string
	for i, e := range evs[:7] {
		if !strings.Contains(e, `"usage":`) {
			t.Errorf("event %d has no usage key (include_usage sends null on every chunk): %s", i, e)
		}
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if c.Object != "chat.completion.chunk" || c.Model != "m" || !strings.HasPrefix(c.ID, "chatcmpl-") {
			t.Errorf("event %d: %s", i, e)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Errorf("id changes within a stream: %s then %s", id, c.ID)
		}
		switch {
		case i == 0:
			if len(c.Choices) != 1 || c.Choices[0].Delta == nil || c.Choices[0].Delta.Role == nil || *c.Choices[0].Delta.Role != "assistant" {
				t.Errorf("first chunk does not open with the role: %s", e)
			}
		case i < 6:
			ch := c.Choices[0]
			if ch.Delta == nil || ch.Delta.Content == nil || *ch.Delta.Content == "" || c.Usage != nil {
				t.Errorf("content chunk %d: %s", i, e)
			}
			if (i == 5) != (ch.FinishReason != nil && *ch.FinishReason == "length") {
				t.Errorf("chunk %d finish_reason: %s", i, e)
			}
		case i == 6:
			if len(c.Choices) != 0 || c.Usage == nil || c.Usage.CompletionTokens != 5 || c.Usage.PromptTokens < 1 ||
				c.Usage.TotalTokens != c.Usage.PromptTokens+5 {
				t.Errorf("usage chunk: %s", e)
			}
		}
	}
}

func TestCompletionStreamWithoutUsage(t *testing.T) {
	srv := fastServer(t)
	resp := post(t, srv.URL+"/v1/completions", `{"model":"m","prompt":"once upon a time","max_tokens":3,"stream":true}`)
	evs := events(t, resp.Body)
	if len(evs) != 4 || evs[3] != "[DONE]" {
		t.Fatalf("events = %q", evs)
	}
	for _, e := range evs[:3] {
		if strings.Contains(e, `"usage"`) {
			t.Errorf("usage sent without include_usage: %s", e)
		}
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil || c.Object != "text_completion" || c.Choices[0].Text == nil {
			t.Errorf("chunk %s: %v", e, err)
		}
	}
}

func TestNonStreaming(t *testing.T) {
	srv := fastServer(t, "sql-lora")
	for _, tc := range []struct{ path, body, object string }{
		{"/v1/completions", `{"model":"m","prompt":[1,2,3,4],"max_tokens":4}`, "text_completion"},
		{"/v1/chat/completions", `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4}`, "chat.completion"},
	} {
		resp := post(t, srv.URL+tc.path, tc.body)
		var out struct {
			Object  string `json:"object"`
			Choices []struct {
				Text    string `json:"text"`
				Message struct {
					Role, Content string
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		text := out.Choices[0].Text + out.Choices[0].Message.Content
		if out.Object != tc.object || len(strings.Fields(text)) != 4 || out.Choices[0].FinishReason != "length" {
			t.Errorf("%s: %+v", tc.path, out)
		}
		if tc.path == "/v1/completions" && out.Usage.PromptTokens != 4 {
			t.Errorf("token-id prompt: prompt_tokens = %d, want 4", out.Usage.PromptTokens)
		}
	}
}

func TestVLLMShapedErrors(t *testing.T) {
	srv := fastServer(t)
	for _, tc := range []struct {
		name, path, body string
		status           int
		typ              string
	}{
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"x"}`, 404, "NotFoundError"},
		{"bad json", "/v1/chat/completions", `{"model":`, 400, "BadRequestError"},
		{"no messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "BadRequestError"},
		{"max_tokens 0", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":0}`, 400, "BadRequestError"},
		{"too long", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":5000}`, 400, "BadRequestError"},
	} {
		resp := post(t, srv.URL+tc.path, tc.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.StatusCode != tc.status || e.Error.Type != tc.typ || e.Error.Code != tc.status || e.Error.Message == "" {
			t.Errorf("%s: status %d, error %+v", tc.name, resp.StatusCode, e.Error)
		}
	}
}

func TestModelsListAdaptersWithParent(t *testing.T) {
	srv := fastServer(t, "a1", "a2")
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ml struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string  `json:"id"`
			Parent      *string `json:"parent"`
			Root        string  `json:"root"`
			MaxModelLen *int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		t.Fatal(err)
	}
	if ml.Object != "list" || len(ml.Data) != 3 {
		t.Fatalf("%+v", ml)
	}
	if d := ml.Data[0]; d.ID != "m" || d.Parent != nil || d.MaxModelLen == nil || *d.MaxModelLen != 4096 {
		t.Errorf("base card %+v", d)
	}
	for _, d := range ml.Data[1:] {
		if d.Parent == nil || *d.Parent != "m" {
			t.Errorf("adapter %s has parent %v, want m", d.ID, d.Parent)
		}
	}
}

// TestMetricsPageHasVLLMNames parses /metrics with the Prometheus text parser
// while a request is running and checks vLLM's names and values.
func TestMetricsPageHasVLLMNames(t *testing.T) {
	m := NewSteady(SteadyConfig{Speed: 1, DecodeTokensPerSecond: 1000})
	s, err := NewServer(ServerConfig{Model: "m", Adapters: []string{"l"}}, m)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	// Hold one request running: the stream stays open until we read it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"`+strings.Repeat("word ", 400)+`","max_tokens":100000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	bufio.NewReader(resp.Body).ReadString('\n') // first token out: it is running

	mr, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(mr.Body)
	if err != nil {
		t.Fatalf("metrics page does not parse: %v", err)
	}
	value := func(name string) float64 {
		f, ok := fams[name]
		if !ok || len(f.Metric) == 0 {
			t.Fatalf("family %s missing", name)
		}
		return f.Metric[0].GetGauge().GetValue() + f.Metric[0].GetCounter().GetValue()
	}
	if v := value("vllm:num_requests_running"); v != 1 {
		t.Errorf("running = %v, want 1", v)
	}
	if v := value("vllm:num_requests_waiting"); v != 0 {
		t.Errorf("waiting = %v, want 0", v)
	}
	if v := value("vllm:kv_cache_usage_perc"); v <= 0 || v > 1 {
		t.Errorf("kv usage = %v, want a fraction above 0", v)
	}
	if v := value("vllm:prompt_tokens_total"); v != 500 {
		t.Errorf("prompt tokens = %v, want 500", v)
	}
	labels := map[string]string{}
	for _, l := range fams["vllm:cache_config_info"].Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["block_size"] != "16" || labels["num_gpu_blocks"] != "8192" {
		t.Errorf("cache_config_info labels %v", labels)
	}
	if _, ok := fams["vllm:lora_requests_info"]; !ok {
		t.Error("vllm:lora_requests_info missing on a server with adapters")
	}
}

// TestSteadyTiming checks the emulated delays in virtual time: the first
// token after the fixed latency plus prompt over the prefill rate, then one
// token per decode interval, all divided by Speed.
func TestSteadyTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewSteady(SteadyConfig{DecodeTokensPerSecond: 10, PrefillTokensPerSecond: 1000, FirstTokenLatency: 50 * time.Millisecond, Speed: 2})
		start := time.Now()
		var at []time.Duration
		_, err := m.Run(context.Background(), Job{PromptTokens: 2000, MaxTokens: 3}, func() error {
			at = append(at, time.Since(start))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{1025 * time.Millisecond, 1075 * time.Millisecond, 1125 * time.Millisecond}
		if len(at) != 3 || at[0] != want[0] || at[1] != want[1] || at[2] != want[2] {
			t.Errorf("token times %v, want %v", at, want)
		}
	})
}

// TestSteadyQueuesPastMaxRunning: with one slot, a second job waits, shows as
// waiting, and starts when the first ends; a waiting job whose context ends
// leaves the queue.
func TestSteadyQueuesPastMaxRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewSteady(SteadyConfig{MaxRunning: 1, DecodeTokensPerSecond: 1, FirstTokenLatency: time.Second, PrefillTokensPerSecond: 1})
		done := make(chan time.Duration, 3)
		start := time.Now()
		run := func(ctx context.Context) {
			m.Run(ctx, Job{PromptTokens: 1, MaxTokens: 2}, func() error { return nil })
			done <- time.Since(start)
		}
		go run(context.Background())
		synctest.Wait()
		go run(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		go run(ctx)
		synctest.Wait()
		if st := m.Stats(); st.Running != 1 || st.Waiting != 2 {
			t.Fatalf("running %d waiting %d, want 1 and 2", st.Running, st.Waiting)
		}
		cancel()
		if d := <-done; d != 0 {
			t.Errorf("cancelled waiter returned after %v, want at once", d)
		}
		// 1s latency + 1 prompt token at 1/s + one decode step of 1s
		if d := <-done; d != 3*time.Second {
			t.Errorf("first job took %v, want 3s", d)
		}
		if d := <-done; d != 6*time.Second {
			t.Errorf("queued job ended at %v, want 6s", d)
		}
		if st := m.Stats(); st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 || st.GenerationTokens != 4 {
			t.Errorf("after: %+v", st)
		}
	})
}

// gate is a Model whose requests wait until the gate opens.
type gate struct {
	open chan struct{}
	Steady
}

func (g *gate) Run(ctx context.Context, j Job, emit func() error) (int, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return g.Steady.Run(ctx, j, emit)
}

// TestStreamHeadersBeforeFirstToken: a streaming answer's headers reach
// the client while the request still waits for its first token, as a
// real server's do.
func TestStreamHeadersBeforeFirstToken(t *testing.T) {
	g := &gate{open: make(chan struct{}), Steady: *NewSteady(SteadyConfig{Speed: 1000})}
	s, err := NewServer(ServerConfig{Model: "m"}, g)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	// Without the headers the client would wait for the gate forever; the
	// header timeout turns that hang into a failure.
	client := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 30 * time.Second}}
	resp, err := client.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("headers before the first token: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	close(g.open)
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(body), "data: [DONE]") {
		t.Fatalf("stream %q, %v", body, err)
	}
}

// TestBytesPerToken: a server whose tokenizer reads 7 bytes a token counts
// a text prompt at that rate, in usage and /tokenize alike, and a prompt of
// token ids one token an id.
func TestBytesPerToken(t *testing.T) {
	s, err := NewServer(ServerConfig{Model: "m", BytesPerToken: 7}, NewSteady(SteadyConfig{Speed: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	text := strings.Repeat("abcdefg", 100) + "xyz" // 703 bytes: 100 tokens
	for _, tc := range []struct {
		prompt string
		want   int
	}{{`"` + text + `"`, 100}, {`[1,2,3,4,5]`, 5}} {
		var out struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
			Count int `json:"count"`
		}
		if err := json.NewDecoder(post(t, srv.URL+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":`+tc.prompt+`}`).Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		if out.Usage.PromptTokens != tc.want {
			t.Errorf("prompt %.20s: prompt_tokens %d, want %d", tc.prompt, out.Usage.PromptTokens, tc.want)
		}
		if err := json.NewDecoder(post(t, srv.URL+"/tokenize", `{"model":"m","prompt":`+tc.prompt+`}`).Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		if out.Count != tc.want {
			t.Errorf("prompt %.20s: /tokenize count %d, want %d", tc.prompt, out.Count, tc.want)
		}
	}
}
