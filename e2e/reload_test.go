package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// reloadConfig is a config file for the backends at urls.
func reloadConfig(urls []string, extra string) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nlog:\n  level: warn\nscrape:\n  health_interval: 100ms\n")
	b.WriteString(extra)
	b.WriteString("backends:\n")
	for _, u := range urls {
		fmt.Fprintf(&b, "  - url: %s\n", u)
	}
	return b.String()
}

// startFromFile runs the balancer on the config file at path, reloading it
// on SIGHUP and when it changes (checked every poll).
func startFromFile(t *testing.T, path string, poll time.Duration, n int) *serve.Instance {
	t.Helper()
	cfg, err := config.Load(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	return startSource(t, cfg, &serve.Source{Path: path, Env: noEnv, Poll: poll}, n)
}

// metricValue reads one sample, `name{labels}` as the page writes it,
// from the admin /metrics page; -1 if absent.
func metricValue(t *testing.T, adminAddr, sample string) float64 {
	t.Helper()
	name, labels, _ := strings.Cut(sample, "{")
	if labels != "" {
		labels = "{" + labels
	}
	for _, s := range scrapeAdmin(t, adminAddr)[name] {
		if s.labels == labels {
			return s.value
		}
	}
	return -1
}

// replaceFile writes content to path by renaming a new file over it, as
// editors and config tools do, so that no poll sees it half written (the
// exact reload counts below rely on that; a file written in place is
// TestSettlerWaitsForAFileToHold's).
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func waitMetric(t *testing.T, adminAddr, sample string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, adminAddr, sample) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %g (now %g)", sample, want, metricValue(t, adminAddr, sample))
		}
		<-time.After(10 * time.Millisecond)
	}
}

func backendStates(t *testing.T, adminAddr string) map[string]string {
	t.Helper()
	return backendField(t, adminAddr, func(b proxy.BackendStatus) (string, string) { return b.ID, b.State.String() })
}

// TestReloadOnFileChange: a new backend list written over the config file
// takes effect while a stream runs on a backend it removes, and that stream
// ends whole; a file with a typo is refused and the old config keeps
// serving; both show in llmlb_config_reloads_total.
func TestReloadOnFileChange(t *testing.T) {
	urls := simBackends(t, 3, sim.SteadyConfig{Speed: 1, DecodeTokensPerSecond: 50})
	path := writeConfig(t, reloadConfig(urls[:2], ""))
	inst := startFromFile(t, path, 20*time.Millisecond, 2)

	body := `{"model":"` + testModel + `","prompt":"hello","max_tokens":40,"stream":true}`
	resp, err := http.Post("http://"+inst.Addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	busyName := resp.Header.Get("X-Llmlb-Backend") // names are never reused
	busy := backendNames(t, inst.AdminAddr)[busyName]
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("stream start %q %v", line, err)
	}
	// The new file drops the busy backend and adds the third.
	var keep []string
	for _, u := range urls[:2] {
		if u != busy {
			keep = append(keep, u)
		}
	}
	if len(keep) != 1 {
		t.Fatalf("stream went to %q, not one of %v", busy, urls[:2])
	}
	replaceFile(t, path, reloadConfig(append(keep, urls[2]), ""))
	waitMetric(t, inst.AdminAddr, `llmlb_config_reloads_total{result="success"}`, 1)
	deadline := time.Now().Add(10 * time.Second)
	for st := backendStates(t, inst.AdminAddr); st[busy] != "draining" || st[urls[2]] != "ready"; st = backendStates(t, inst.AdminAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("states after reload: %v", st)
		}
		<-time.After(10 * time.Millisecond)
	}
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream on the removed backend was cut: %v\n%s", err, rest)
	}
	deadline = time.Now().Add(10 * time.Second)
	for _, ok := backendStates(t, inst.AdminAddr)[busy]; ok; _, ok = backendStates(t, inst.AdminAddr)[busy] {
		if time.Now().After(deadline) {
			t.Fatal("the drained backend was never removed")
		}
		<-time.After(10 * time.Millisecond)
	}
	for range 6 {
		if be := completeOnce(t, inst.Addr); be == busyName {
			t.Fatalf("a request went to the removed backend %s", be)
		}
	}

	// A typo: refused, counted, and the running config keeps serving.
	replaceFile(t, path, reloadConfig(urls[2:], "balancer:\n  polcy: ttft\n"))
	waitMetric(t, inst.AdminAddr, `llmlb_config_reloads_total{result="error"}`, 1)
	if st := backendStates(t, inst.AdminAddr); len(st) != 2 || st[keep[0]] != "ready" || st[urls[2]] != "ready" {
		t.Fatalf("a refused file changed the backends: %v", st)
	}
	completeOnce(t, inst.Addr)
	if v := metricValue(t, inst.AdminAddr, `llmlb_config_reloads_total{result="success"}`); v != 1 {
		t.Errorf("successful reloads %g, want 1", v)
	}
}

// TestReloadOnSIGHUP: with no file polling to speak of, SIGHUP rereads
// the file.
func TestReloadOnSIGHUP(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100})
	path := writeConfig(t, reloadConfig(urls[:1], ""))
	inst := startFromFile(t, path, time.Hour, 1)
	if err := os.WriteFile(path, []byte(reloadConfig(urls, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, inst.AdminAddr, `llmlb_config_reloads_total{result="success"}`, 1)
	e2etest.WaitBackends(t, inst.AdminAddr, 2)
}

// completeOnce sends one small completion and returns the name of the
// backend that answered it.
func completeOnce(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Llmlb-Backend")
}
