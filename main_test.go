package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/proxy"
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

// runCmd runs the program with args and returns its output and error.
func runCmd(t *testing.T, env config.Environ, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, env, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestConfigFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if _, stderr, err := runCmd(t, noEnv, "validate", missing); err == nil || !strings.Contains(stderr, missing) {
		t.Errorf("missing file: err %v, stderr %q", err, stderr)
	}
	broken := writeConfig(t, "backends:\n  - url: [\n")
	if _, stderr, err := runCmd(t, noEnv, "validate", broken); err == nil || !strings.Contains(stderr, broken) {
		t.Errorf("YAML syntax error: err %v, stderr %q", err, stderr)
	}
	empty := writeConfig(t, "")
	if _, stderr, err := runCmd(t, noEnv, "validate", empty); err == nil || !strings.Contains(stderr, "backends: at least one backend") {
		t.Errorf("empty file: err %v, stderr %q", err, stderr)
	}
	if _, _, err := runCmd(t, noEnv, "serve", "--config", missing); err == nil {
		t.Error("serve started without its config file")
	}
}

// TestMissingConfigHintsAtFlag: a missing config file says how to name one.
func TestMissingConfigHintsAtFlag(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, args := range [][]string{{"serve"}, {"validate"}, {"--config", "nope.yaml"}} {
		_, stderr, err := runCmd(t, noEnv, args...)
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
		stdout, _, err := runCmd(t, noEnv, args...)
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
		stdout, _, err := runCmd(t, noEnv, args...)
		if err != nil || !strings.HasPrefix(firstLine(stdout), "llmlb ") || !strings.Contains(stdout, runtime.Version()) {
			t.Errorf("llmlb %v: err %v, output %q, want llmlb VERSION then the Go version", args, err, stdout)
		}
	}
	for _, c := range commands() {
		_, stderr, err := runCmd(t, noEnv, c.name, "--help")
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
		if _, stderr, err := runCmd(t, noEnv, append(words[1:], "--help")...); strings.Contains(stderr, "not defined") {
			t.Errorf("example %q: %v\n%s", c.example, err, stderr)
		}
	}
	stdout, _, err := runCmd(t, noEnv, "help", "probe")
	if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(stdout, "Probe reads") {
		t.Errorf("llmlb help probe: err %v, output %q, want probe's help", err, stdout)
	}
	if _, _, err := runCmd(t, noEnv, "frobnicate"); err == nil {
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
		if stdout, stderr, err := runCmd(t, noEnv, args...); err != nil || !strings.HasPrefix(stdout, "config.yaml: ok") {
			t.Errorf("llmlb %v: err %v, stdout %q, stderr %q", args, err, stdout, stderr)
		}
	}
	if _, _, err := runCmd(t, noEnv, "validate", "--config", "config.yaml", "other.yaml"); err == nil {
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

// TestMain lets a test run this test binary as llmlb itself
// (LLMLBTEST_RUN_MAIN=1), as `llmlb overhead` runs its own executable.
func TestMain(m *testing.M) {
	if os.Getenv("LLMLBTEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestHashKeyCommand: `llmlb hash-key` prints the hash the config file
// takes, of its argument or of the key on standard input without its line
// end, and refuses a key with spaces.
func TestHashKeyCommand(t *testing.T) {
	want := proxy.HashKey(testKey) + "\n"
	if out, _, err := runCmd(t, noEnv, "hash-key", testKey); err != nil || out != want {
		t.Errorf("hash-key KEY = %q, %v; want %q", out, err, want)
	}
	if _, _, err := runCmd(t, noEnv, "hash-key", "two words"); err == nil {
		t.Error("hash-key accepted a key with a space")
	}
	if _, stderr, err := runCmd(t, noEnv, "hash-key", "short"); err != nil || !strings.Contains(stderr, "warning") {
		t.Errorf("hash-key of a short key: %v, stderr %q; want a warning", err, stderr)
	}
	cmd := exec.Command(os.Args[0], "hash-key")
	cmd.Env = append(os.Environ(), "LLMLBTEST_RUN_MAIN=1")
	cmd.Stdin = strings.NewReader(testKey + "\n")
	out, err := cmd.Output()
	if err != nil || string(out) != want {
		t.Errorf("key on stdin: %q, %v; want %q", out, err, want)
	}
	// The hash it prints is what the config file takes.
	path := writeConfig(t, "backends:\n  - url: http://127.0.0.1:1\nauth:\n  keys:\n    - name: alpha\n      key: "+strings.TrimSpace(string(out))+"\n")
	if _, err := config.Load(path, noEnv); err != nil {
		t.Errorf("the printed hash does not load: %v", err)
	}
}

// TestSimFaultFlag starts `llmlb sim --count 2 --fault 429 --fault-on 1`:
// the second server answers 429, the first does not, and PUT /sim/faults
// clears the fault at runtime.
func TestSimFaultFlag(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{ch: make(chan string, 16)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"sim", "--listen", "127.0.0.1:0", "--count", "2", "--speed", "100", "--fault", "429", "--fault-on", "1"}, nil, out, out)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addrRE := regexp.MustCompile(`at (http://\S+)`)
	var urls []string
	deadline := time.After(10 * time.Second)
	for len(urls) < 2 {
		select {
		case line := <-out.ch:
			if m := addrRE.FindStringSubmatch(line); m != nil {
				urls = append(urls, m[1])
			}
		case <-deadline:
			t.Fatalf("sim printed %d addresses, want 2", len(urls))
		}
	}
	status := func(u string) int {
		t.Helper()
		resp, err := http.Post(u+"/v1/completions", "application/json", strings.NewReader(`{"model":"llama-3.1-8b","prompt":"hi","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(urls[0]); got != 200 {
		t.Errorf("server 0 answered %d, want 200 (--fault-on 1)", got)
	}
	if got := status(urls[1]); got != 429 {
		t.Errorf("server 1 answered %d, want 429", got)
	}
	req, _ := http.NewRequest(http.MethodDelete, urls[1]+"/sim/faults", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := status(urls[1]); got != 200 {
		t.Errorf("server 1 answered %d after DELETE /sim/faults, want 200", got)
	}
}

func TestSimFaultFlagRejectsUnknown(t *testing.T) {
	_, _, err := runCmd(t, nil, "sim", "--listen", "127.0.0.1:0", "--fault", "explode")
	if err == nil || !strings.Contains(err.Error(), `unknown fault "explode"`) {
		t.Errorf("sim --fault explode: %v, want an unknown fault error", err)
	}
}

// testKey is an API key long enough not to draw hash-key's warning.
const testKey = "sk-llmlb-main-alpha-8c7b6a5f4e3d2c1b"
