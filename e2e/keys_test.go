package e2e

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// Keys the tests present; config files hold only their hashes.
const (
	testKeyA = "sk-llmlb-main-alpha-8c7b6a5f4e3d2c1b"
	testKeyB = "sk-llmlb-main-bravo-1b2c3d4e5f6a7b8c"
)

// keyedConfig is a config file for the backends at urls, logging at
// debug, with the keys given as name, key pairs, each limited to 100
// requests a minute.
func keyedConfig(urls []string, keys ...string) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nlog:\n  level: debug\nscrape:\n  health_interval: 100ms\n")
	b.WriteString("auth:\n  keys:\n")
	for i := 0; i+1 < len(keys); i += 2 {
		b.WriteString("    - name: " + keys[i] + "\n      key: " + proxy.HashKey(keys[i+1]) + "\n      requests_per_minute: 100\n")
	}
	b.WriteString("backends:\n")
	for _, u := range urls {
		b.WriteString("  - url: " + u + "\n")
	}
	return b.String()
}

func keyedPost(t *testing.T, addr, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestKeyReloadTakesEffectWithoutDroppingStreams: a config file that
// revokes a key, written while a stream made with that key runs, refuses
// the key from then on (401) and lets the stream end whole; the other key
// keeps working; a refused file with a key pasted where its hash belongs
// does not put the key in the log; the key's requests are counted by its
// name; no key or hash is in the log or the admin pages.
func TestKeyReloadTakesEffectWithoutDroppingStreams(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 1, DecodeTokensPerSecond: 50})
	path := writeConfig(t, keyedConfig(urls, "alpha", testKeyA, "bravo", testKeyB))
	cfg, err := config.Load(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	inst, err := serve.Start(t.Context(), cfg, &serve.Source{Path: path, Env: noEnv, Poll: 20 * time.Millisecond}, logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Wait() })
	e2etest.WaitBackends(t, inst.AdminAddr, 1)

	resp := keyedPost(t, inst.Addr, testKeyA, `{"model":"`+testModel+`","prompt":"hello","max_tokens":100,"stream":true}`) // 2s at 50 tokens/s
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream with alpha: status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("stream start %q %v", line, err)
	}

	// A key pasted in place of its hash: refused, and not logged.
	replaceFile(t, path, strings.Replace(keyedConfig(urls, "alpha", testKeyA, "bravo", testKeyB), proxy.HashKey(testKeyB), testKeyB, 1))
	waitMetric(t, inst.AdminAddr, `llmlb_config_reloads_total{result="error"}`, 1)

	// alpha revoked.
	replaceFile(t, path, keyedConfig(urls, "bravo", testKeyB))
	waitMetric(t, inst.AdminAddr, `llmlb_config_reloads_total{result="success"}`, 1)
	r2 := keyedPost(t, inst.Addr, testKeyA, `{"model":"`+testModel+`","prompt":"hi","max_tokens":2}`)
	io.Copy(io.Discard, r2.Body)
	r2.Body.Close()
	if r2.StatusCode != http.StatusUnauthorized {
		t.Errorf("revoked key after the reload: status %d, want 401", r2.StatusCode)
	}
	r3 := keyedPost(t, inst.Addr, testKeyB, `{"model":"`+testModel+`","prompt":"hi","max_tokens":2}`)
	io.Copy(io.Discard, r3.Body)
	r3.Body.Close()
	if r3.StatusCode != http.StatusOK {
		t.Errorf("remaining key after the reload: status %d, want 200", r3.StatusCode)
	}

	// The stream was still running when the revocation took effect.
	line, err := rd.ReadString('\n')
	for err == nil && line == "\n" {
		line, err = rd.ReadString('\n')
	}
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("the stream ended before the key was revoked (%q, %v): the test shows nothing", line, err)
	}
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream made with the revoked key was cut by the reload: %v\n%s", err, rest)
	}
	waitMetric(t, inst.AdminAddr, `llmlb_key_requests_total{key="alpha",status="200"}`, 1)
	waitMetric(t, inst.AdminAddr, `llmlb_key_requests_total{key="bravo",status="200"}`, 1)

	var pages strings.Builder
	for _, p := range []string{"/metrics", "/", "/debug/backends"} {
		r, err := http.Get("http://" + inst.AdminAddr + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(&pages, r.Body)
		r.Body.Close()
	}
	for _, key := range []string{testKeyA, testKeyB} {
		hex := strings.TrimPrefix(proxy.HashKey(key), "sha256:")
		for _, form := range []string{key, hex, key[len(key)-12:], hex[:12]} {
			if strings.Contains(logs.String(), form) {
				t.Errorf("the log contains %q, from a key or its hash", form)
			}
			if strings.Contains(pages.String(), form) {
				t.Errorf("the admin pages contain %q, from a key or its hash", form)
			}
		}
	}
	if !strings.Contains(logs.String(), `key=alpha`) {
		t.Error("the access log does not name the key alpha: the log checked above is not the access log")
	}
}

// TestOpenAISDKWithKeys: the official OpenAI Node SDK
// (testdata/node-sdk/keys.mjs), given an API key as its users give it, is
// served; given a wrong key it raises OpenAI's 401 (invalid_api_key); over
// the key's requests per minute it raises a 429 rate_limit_exceeded, with
// the headers it reads; the model list is the key's.
func TestOpenAISDKWithKeys(t *testing.T) {
	nodeSDK(t)
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100}, "sql-lora")
	cfg := testConfig(urls)
	cfg.Auth = proxy.AuthConfig{Keys: []proxy.KeyConfig{{Name: "alpha", Key: proxy.HashKey(testKeyA), Models: []string{testModel}, RequestsPerMinute: 2}}}
	inst := startTest(t, cfg, 1)
	var summary struct {
		Unauthorized bool     `json:"unauthorized"`
		Models       []string `json:"models"`
		RateLimited  bool     `json:"rate_limited"`
	}
	runNode(t, "keys.mjs", &summary, "LLMLB_BASE_URL=http://"+inst.Addr+"/v1", "LLMLB_MODEL="+testModel,
		"LLMLB_KEY="+testKeyA, "LLMLB_WRONG_KEY="+testKeyB)
	if !summary.Unauthorized || !slices.Equal(summary.Models, []string{testModel}) || !summary.RateLimited {
		t.Errorf("summary = %+v", summary)
	}
}
