package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// chromium finds Debian's chromium. Where LLMLB_REQUIRE_CHROMIUM is set
// (.ci/run sets it, after installing the package) its absence fails the
// test instead of skipping it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("LLMLB_REQUIRE_CHROMIUM") != "" {
		t.Fatal("chromium not found, and LLMLB_REQUIRE_CHROMIUM is set")
	}
	t.Skip("chromium not installed (apt-get install chromium)")
	return ""
}

// headless runs chromium headless on url with extra flags and returns its
// standard output.
func headless(t *testing.T, bin, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir()}, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errb.String())
	}
	return out.Bytes()
}

// TestStatusPageInChromium runs the demo (emulated engines, the balancer,
// traffic) and loads the admin status page in headless Chromium: the page
// Chromium builds lists every backend of the demo as ready, with its
// engine, and the picks so far. A screenshot is kept where
// LLMLB_STATUS_SCREENSHOT points.
func TestStatusPageInChromium(t *testing.T) {
	bin := chromium(t)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	// The demo runs until the test has its pages (a fixed duration could end
	// it between the DOM dump and the screenshot on a loaded machine).
	ctx, stop := context.WithCancel(t.Context())
	go func() {
		err := run(ctx, []string{"demo", "--duration", "2m", "--speed", "4", "--concurrency", "8"}, noEnv, pw, io.Discard)
		pw.CloseWithError(err)
		done <- err
	}()
	sc := bufio.NewScanner(pr)
	var admin string
	for sc.Scan() {
		if m := regexp.MustCompile(`status page (http://\S+/)`).FindStringSubmatch(sc.Text()); m != nil {
			admin = m[1]
			break
		}
	}
	if admin == "" {
		t.Fatalf("demo never printed its status page: %v", sc.Err())
	}
	go io.Copy(io.Discard, pr) // the demo's live view
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("demo: %v", err)
		}
	})

	// Once every backend has served, the page has something to show.
	deadline := time.Now().Add(20 * time.Second)
	var ids []string
	for {
		bs, err := sim.FetchBackends(http.DefaultClient, strings.TrimSuffix(admin, "/"))
		if err == nil {
			ids = ids[:0]
			served := 0
			for _, b := range bs {
				ids = append(ids, b.ID)
				if b.Requests > 0 {
					served++
				}
			}
			if len(bs) == 4 && served == 4 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo backends never all served: %v %v", bs, err)
		}
		<-time.After(50 * time.Millisecond)
	}

	dom := string(headless(t, bin, admin, "--dump-dom"))
	if got := strings.Count(dom, `<tr class="backend">`); got != 4 {
		t.Errorf("page shows %d backend rows, want 4:\n%s", got, dom)
	}
	for _, id := range ids {
		row := regexp.MustCompile(`(?s)<tr class="backend">\s*<td class="l">` + regexp.QuoteMeta(id) + `</td><td class="l">vllm</td>\s*<td class="l"><span class="ready">ready</span>`)
		if !row.MatchString(dom) {
			t.Errorf("no ready vllm row for %s", id)
		}
	}
	for _, want := range []string{"Picks by reason", "Recent requests", "llama-3.1-8b"} {
		if !strings.Contains(dom, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	shot := os.Getenv("LLMLB_STATUS_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "status.png")
	}
	abs, _ := filepath.Abs(shot)
	headless(t, bin, admin, "--screenshot="+abs, "--window-size=1500,700", "--hide-scrollbars")
	if b, err := os.ReadFile(abs); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("screenshot: %v", err)
	}
}
