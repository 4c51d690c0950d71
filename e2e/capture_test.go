package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/sim"
)

// captureLine is what TestCaptureEndToEnd reads of a capture line.
type captureLine struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	Model        string   `json:"model"`
	API          string   `json:"api"`
	Stream       bool     `json:"stream"`
	Priority     *int     `json:"priority"`
	Conversation uint64   `json:"conversation"`
	Session      uint64   `json:"session"`
	PromptTokens *int     `json:"prompt_tokens"`
	CachedTokens *int     `json:"cached_tokens"`
	Backend      string   `json:"backend"`
	Status       int      `json:"status"`
	TTFTms       float64  `json:"ttft_ms"`
}

// captureTraffic is the test's traffic: chats on one long system prompt,
// each with a question of its own, streamed and not, and a completion.
// Every word of every prompt is one the capture must not hold.
func captureTraffic() (bodies []string, paths []string, words []string) {
	system := strings.Repeat("Marmalade lighthouse protocol: answer with pelican brevity. ", 60) // 3,600 bytes: a whole block shared
	questions := []string{"Which quokka hoards tangerines?", "Describe the zeppelin orchestra.", "Why does the narwhal juggle?", "Translate gorgonzola into semaphore."}
	for i, q := range questions {
		b, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 8, "stream": i%2 == 0,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": q}}})
		bodies, paths = append(bodies, string(b)), append(paths, "/v1/chat/completions")
	}
	bodies = append(bodies, completion("Crimson wombat ledger, "+strings.Repeat("velvet ", 400), 8))
	paths = append(paths, "/v1/completions")
	for _, text := range append(questions, system, "Crimson wombat ledger velvet") {
		for _, w := range regexp.MustCompile(`[A-Za-z]{5,}`).FindAllString(text, -1) {
			words = append(words, strings.ToLower(w))
		}
	}
	return bodies, paths, words
}

// runCapture serves the test traffic through `llmlb serve` with capture on
// under salt, one request after another, shuts it down (which writes the
// capture out) and returns the capture file's bytes.
func runCapture(t *testing.T, urls []string, salt string) []byte {
	t.Helper()
	cfg := testConfig(urls)
	cfg.Capture.Path = filepath.Join(t.TempDir(), "capture.jsonl")
	cfg.Capture.Salt = salt
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	inst, err := serve.Start(ctx, cfg, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e2etest.WaitBackends(t, inst.AdminAddr, len(urls))
	bodies, paths, _ := captureTraffic()
	for i, b := range bodies {
		req, _ := http.NewRequest(http.MethodPost, "http://"+inst.Addr+paths[i], strings.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	// Refused: a body that does not parse (no line) and a model nobody
	// serves (a line, its name not written).
	for _, b := range []string{`{"model": "zebra-secret-model", "prompt": "x"`, `{"model":"zebra-secret-model","prompt":"hello"}`} {
		resp, err := http.Post("http://"+inst.Addr+"/v1/completions", "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	cancel()
	if err := inst.Wait(); err != nil { // returns once the capture is closed
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg.Capture.Path)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(cfg.Capture.Path); st.Mode().Perm() != 0o600 {
		t.Errorf("capture file mode %v, want 0600", st.Mode().Perm())
	}
	return b
}

func parseCapture(t *testing.T, b []byte) []captureLine {
	t.Helper()
	var out []captureLine
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l captureLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("capture line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// TestCaptureEndToEnd: traffic through `llmlb serve` with capture on gives
// one valid line per request with the Mooncake fields and routing's, no
// word of any prompt, leading ids shared by the requests that share a
// prefix, and other ids under another salt.
func TestCaptureEndToEnd(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100})
	const saltA, saltB = "first capture salt, 32 bytes....", "second capture salt, 32 bytes..."
	a := runCapture(t, urls, saltA)
	bodies, paths, words := captureTraffic()
	lower := strings.ToLower(string(a))
	for _, w := range words {
		if strings.Contains(lower, w) {
			t.Errorf("the capture holds the prompt word %q", w)
		}
	}
	if strings.Contains(lower, "zebra") {
		t.Error("the capture holds a model name nobody serves")
	}
	lines := parseCapture(t, a)
	if len(lines) != len(bodies)+1 {
		t.Fatalf("%d capture lines for %d requests and one refused:\n%s", len(lines), len(bodies), a)
	}
	if l := lines[len(lines)-1]; l.Status != http.StatusNotFound || l.Model != "unknown" || l.Backend != "" {
		t.Errorf("refused request's line %+v, want status 404, model unknown, no backend", l)
	}
	lines = lines[:len(bodies)]
	backends := map[string]bool{}
	for _, u := range urls {
		backends[u] = true
	}
	for i, l := range lines {
		api, stream := "chat", i%2 == 0
		if paths[i] == "/v1/completions" {
			api, stream = "completions", false
		}
		if l.Timestamp == nil || l.InputLength < 1 || l.OutputLength != 8 || len(l.HashIDs) == 0 || l.Model != testModel ||
			l.API != api || l.Stream != stream || l.Priority == nil || l.PromptTokens == nil || *l.PromptTokens != l.InputLength ||
			l.CachedTokens == nil || !backends[l.Backend] || l.Status != http.StatusOK || (stream && l.TTFTms <= 0) {
			t.Errorf("line %d = %+v, want the request's fields (%s, stream %v)", i, l, api, stream)
		}
		if want := (l.InputLength + 127) / 128; len(l.HashIDs) < want-1 || len(l.HashIDs) > want+1 {
			t.Errorf("line %d: %d ids for %d tokens, want about one per 128", i, len(l.HashIDs), l.InputLength)
		}
	}
	// The chats share the system prompt's first block, and only it; each
	// is a conversation of its own.
	var convs []uint64
	for i, l := range lines[:4] {
		if l.HashIDs[0] != lines[0].HashIDs[0] || (i > 0 && slices.Equal(l.HashIDs, lines[0].HashIDs)) {
			t.Errorf("chat %d ids %v, chat 0 %v: want the first shared, not all", i, l.HashIDs, lines[0].HashIDs)
		}
		convs = append(convs, l.Conversation)
	}
	if slices.Contains(lines[4].HashIDs, lines[0].HashIDs[0]) {
		t.Error("the completion shares a block with the chats")
	}
	slices.Sort(convs)
	if len(slices.Compact(convs)) != 4 || convs[0] == 0 {
		t.Errorf("conversation keys %v, want four, set", convs)
	}
	// The same traffic under another salt: no id in common.
	b := parseCapture(t, runCapture(t, urls, saltB))
	seen := map[uint64]bool{}
	for _, l := range lines {
		for _, id := range l.HashIDs {
			seen[id] = true
		}
	}
	b = b[:min(len(b), len(lines))]
	if len(b) != len(lines) {
		t.Fatalf("second capture: %d lines, want %d", len(b), len(lines))
	}
	for i, l := range b {
		if len(l.HashIDs) != len(lines[i].HashIDs) {
			t.Errorf("line %d: %d ids under one salt, %d under the other", i, len(lines[i].HashIDs), len(l.HashIDs))
		}
		for _, id := range l.HashIDs {
			if seen[id] {
				t.Errorf("line %d: id %d under both salts", i, id)
			}
		}
	}
}

// TestReloadTurnsCaptureOnAndOff: a reload starts a capture, changes its
// sample, and stops it, writing out what it holds.
func TestReloadTurnsCaptureOnAndOff(t *testing.T) {
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100})
	dir := t.TempDir()
	capPath := filepath.Join(dir, "capture.jsonl")
	path := writeConfig(t, reloadConfig(urls, ""))
	inst := startFromFile(t, path, 20*time.Millisecond, 1)
	send := func(n int) {
		t.Helper()
		bodies := make([]string, n)
		for i := range bodies {
			bodies[i] = completion(fmt.Sprintf("request %d", i), 4)
		}
		fire(t, inst.Addr, bodies, 1)
	}
	reloads := 0.0
	reload := func(extra string) {
		t.Helper()
		replaceFile(t, path, reloadConfig(urls, extra))
		reloads++
		waitMetric(t, inst.AdminAddr, `llmlb_config_reloads_total{result="success"}`, reloads)
	}
	send(2) // before: not captured
	reload(fmt.Sprintf("capture:\n  path: %s\n", capPath))
	send(3)
	reload(fmt.Sprintf("capture:\n  path: %s\n  sample: 0\n", capPath))
	send(2)
	reload("") // off: the capture is closed, its lines written
	b, err := os.ReadFile(capPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(parseCapture(t, b)); got != 3 {
		t.Errorf("%d lines captured, want the 3 sent while on at sample 1:\n%s", got, b)
	}
	if got := metricValue(t, inst.AdminAddr, "llmlb_capture_lines_total"); got != 3 {
		t.Errorf("llmlb_capture_lines_total = %v, want 3", got)
	}
}
