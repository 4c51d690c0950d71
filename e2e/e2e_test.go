package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const testModel = "llama-3.1-8b"

// noEnv is an environment without LLMLB_* variables.
var noEnv config.Environ

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// simBackends starts n emulated vLLM servers and returns their URLs.
func simBackends(t *testing.T, n int, sc sim.SteadyConfig, adapters ...string) []string {
	t.Helper()
	var urls []string
	for range n {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel, Adapters: adapters}, sim.NewSteady(sc))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls
}

func testConfig(urls []string) config.Config {
	cfg := config.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Log.Level = "warn"
	cfg.Scrape.HealthInterval = 100 * time.Millisecond
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, scrape.BackendConfig{URL: u})
	}
	return cfg
}

// startTest runs the balancer for cfg until the test ends, then checks it
// shut down cleanly; it returns once n backends are ready.
func startTest(t *testing.T, cfg config.Config, n int) *serve.Instance {
	t.Helper()
	return startSource(t, cfg, nil, n)
}

// startSource is startTest with a config source to reload from.
func startSource(t *testing.T, cfg config.Config, src *serve.Source, n int) *serve.Instance {
	t.Helper()
	inst, err := serve.Start(t.Context(), cfg, src, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := inst.Wait(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	e2etest.WaitBackends(t, inst.AdminAddr, n)
	return inst
}

// backendNames maps the names clients see in x-llmlb-backend to the
// backends' URLs, from /debug/backends.
func backendNames(t *testing.T, adminAddr string) map[string]string {
	t.Helper()
	return backendField(t, adminAddr, func(b proxy.BackendStatus) (string, string) { return b.Name, b.URL })
}

// backendField maps each backend of /debug/backends by kv's key to its
// value.
func backendField(t *testing.T, adminAddr string, kv func(proxy.BackendStatus) (string, string)) map[string]string {
	t.Helper()
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, b := range bs {
		k, v := kv(b)
		out[k] = v
	}
	return out
}

// waitFor looks at a live system every 20 ms until done reports true, and
// reports whether it did within d. It waits for an outcome and never
// measures one, so d is generous: a slow machine makes a test slower, not
// red.
func waitFor(d time.Duration, done func() bool) bool {
	deadline := time.After(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case <-deadline:
			return done()
		case <-tick.C:
		}
	}
	return true
}

// TestOpenAISDKEndToEnd drives the balancer in front of emulated vLLM
// servers with the official OpenAI Go SDK: completions and chat, streaming
// and not, content and usage, model listing and errors.
func TestOpenAISDKEndToEnd(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100}, "sql-lora")
	inst := startTest(t, testConfig(urls), 2)
	ctx := t.Context()

	client := openai.NewClient(option.WithBaseURL("http://"+inst.Addr+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	names := backendNames(t, inst.AdminAddr)
	checkBackend := func(what string, resp *http.Response) {
		t.Helper()
		if resp == nil || !slices.Contains(urls, names[resp.Header.Get("X-Llmlb-Backend")]) {
			t.Errorf("%s: x-llmlb-backend missing or not a backend's name", what)
		}
	}

	t.Run("completion", func(t *testing.T) {
		var raw *http.Response
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     testModel,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(6),
		}, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		checkBackend("completion", raw)
		if len(c.Choices) != 1 || len(strings.Fields(c.Choices[0].Text)) != 6 || c.Usage.CompletionTokens != 6 || c.Usage.PromptTokens == 0 {
			t.Errorf("completion %+v", c)
		}
	})

	t.Run("completion stream with usage", func(t *testing.T) {
		var raw *http.Response
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         testModel,
			Prompt:        openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3, 4, 5}},
			MaxTokens:     openai.Int(5),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}, option.WithResponseInto(&raw))
		var text strings.Builder
		var usage openai.CompletionUsage
		for stream.Next() {
			ch := stream.Current()
			for _, c := range ch.Choices {
				text.WriteString(c.Text)
			}
			if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		checkBackend("completion stream", raw)
		if len(strings.Fields(text.String())) != 5 || usage.PromptTokens != 5 || usage.CompletionTokens != 5 {
			t.Errorf("text %q usage %+v", text.String(), usage)
		}
	})

	chatParams := openai.ChatCompletionNewParams{
		Model:     testModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello!")},
		MaxTokens: openai.Int(7),
	}

	t.Run("chat", func(t *testing.T) {
		var raw *http.Response
		c, err := client.Chat.Completions.New(ctx, chatParams, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		checkBackend("chat", raw)
		if len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || len(strings.Fields(c.Choices[0].Message.Content)) != 7 ||
			c.Usage.CompletionTokens != 7 {
			t.Errorf("chat %+v", c)
		}
	})

	t.Run("chat stream with usage", func(t *testing.T) {
		p := chatParams
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		p.Model = "sql-lora" // an adapter, learned from /v1/models
		stream := client.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 8 { // role, 7 tokens, usage
			t.Errorf("only %d chunks", chunks)
		}
		if len(acc.Choices) != 1 || len(strings.Fields(acc.Choices[0].Message.Content)) != 7 || acc.Usage.CompletionTokens != 7 || acc.Usage.PromptTokens == 0 {
			t.Errorf("accumulated %+v", acc.ChatCompletion)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{testModel, "sql-lora"}) {
			t.Errorf("models = %v, want each model once", ids)
		}
	})

	t.Run("unknown model", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-9", Messages: chatParams.Messages})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Message == "" || apiErr.Type == "" {
			t.Errorf("err = %v, want a 404 OpenAI error", err)
		}
	})

	t.Run("metrics and debug", func(t *testing.T) {
		resp, err := http.Get("http://" + inst.AdminAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, name := range []string{"llmlb_requests_total", "llmlb_time_to_first_byte_seconds", "llmlb_request_duration_seconds", "llmlb_in_flight_requests"} {
			if !bytes.Contains(b, []byte(name)) {
				t.Errorf("/metrics lacks %s", name)
			}
		}
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, b := range bs {
			if b.InFlight != 0 {
				t.Errorf("%s: in flight %d after all requests ended", b.ID, b.InFlight)
			}
			total += b.Requests
		}
		if total < 4 {
			t.Errorf("backends served %d requests, want at least 4", total)
		}
	})
}

func TestDebugBackendsJSONShape(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100})
	inst := startTest(t, testConfig(urls), 1)
	resp, err := http.Get("http://" + inst.AdminAddr + "/debug/backends")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Backends []map[string]any `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Backends) != 1 {
		t.Fatalf("%d backends", len(doc.Backends))
	}
	for _, k := range []string{"url", "engine", "models", "state", "in_flight"} {
		if _, ok := doc.Backends[0][k]; !ok {
			t.Errorf("/debug/backends lacks %q: %v", k, doc.Backends[0])
		}
	}
}

// TestDiscoveryAndEnginesConfig: dns, srv, active_ports keyed by an address
// (dots and all) and an engines: section decode as written.
func TestDiscoveryAndEnginesConfig(t *testing.T) {
	path := writeConfig(t, `
listen: 127.0.0.1:8080
engines:
  my-engine:
    metrics_path: /stats
    queued: 'my_queue{pool="main"}'
    kv_usage: ""
backends:
  - dns: vllm.internal
    ports: [8000, 8001]
    active_ports:
      10.0.0.5: [8000]
    engine: my-engine
  - srv: _sglang._tcp.internal
    engine: sglang
    refresh_interval: 5s
`)
	cfg, err := config.Load(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Backends
	if got := b[0].ActivePorts["10.0.0.5"]; len(got) != 1 || got[0] != 8000 {
		t.Errorf("active_ports = %v", b[0].ActivePorts)
	}
	if b[1].SRV != "_sglang._tcp.internal" || b[1].RefreshInterval != 5*time.Second {
		t.Errorf("srv entry = %+v", b[1])
	}
	e := cfg.Engines["my-engine"]
	if e.MetricsPath == nil || *e.MetricsPath != "/stats" || e.KVUsage == nil || *e.KVUsage != "" || e.Running != nil {
		t.Errorf("engines.my-engine = %+v", e)
	}
	bad := writeConfig(t, "listen: 127.0.0.1:8080\nengines:\n  sglang:\n    queued: 'x{'\nbackends:\n  - url: http://a:1\n    engine: nope\n")
	_, err = config.Load(bad, noEnv)
	for _, want := range []string{"engines.sglang.queued", `backends[0].engine: unknown engine "nope"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to name %s", err, want)
		}
	}
}

// isLLMLBConfig tells llmlb configs from other YAML in examples/ (compose
// files, Kubernetes manifests): ours have a top-level backends key.
func isLLMLBConfig(t *testing.T, path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "backends:") {
			return true
		}
	}
	return false
}
