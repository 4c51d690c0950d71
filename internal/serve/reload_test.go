package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
)

// TestSettlerWaitsForAFileToHold: a changed file is reloaded at the second
// poll that sees the same content, never at the first; content that changes
// between polls (a file being written) waits again; going back to the
// running content cancels.
func TestSettlerWaitsForAFileToHold(t *testing.T) {
	run, half, full := sha256.Sum256([]byte("a")), sha256.Sum256([]byte("b")), sha256.Sum256([]byte("bc"))
	var s settler
	steps := []struct {
		seen [32]byte
		want bool
	}{
		{run, false}, {half, false}, {full, false}, {full, true}, // written in two goes: only the whole one
		{half, false}, {run, false}, {half, false}, {half, true}, // back to the running content in between
	}
	for i, st := range steps {
		if got := s.ready(st.seen, run); got != st.want {
			t.Fatalf("poll %d: reload %v, want %v", i, got, st.want)
		}
	}
}

// deadUpstreamAddr is an address that refuses connections: a listener's,
// closed.
func deadUpstreamAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// newTestReloader loads the config file at path and returns a reloader of
// it over a real scrape manager, balancer and proxy, and the reloader's
// log. The manager runs until the test ends.
func newTestReloader(t *testing.T, path string) (*reloader, *bytes.Buffer) {
	t.Helper()
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	bal, err := balancer.New(cfg.Balancer, balancer.Deps{}, cfg.Models, nil)
	if err != nil {
		t.Fatal(err)
	}
	engines, err := scrape.NewEngineSet(cfg.Engines)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := scrape.NewManager(scrape.Setup{Config: cfg.Scrape, Backends: cfg.Backends, Engines: engines,
		DefaultEngine: cfg.DefaultEngine, Balancer: bal, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.New(proxy.Options{Config: cfg.Proxy, Balancer: bal, Registerer: reg, Auth: cfg.Auth})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = mgr.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	<-mgr.Started()
	logs := new(bytes.Buffer) // written only by reload, on the test's goroutine
	logger := slog.New(slog.NewTextHandler(logs, nil))
	return newReloader(Source{Path: path}, cfg, logger, new(slog.LevelVar), mgr, bal, px, newCapturer(px, reg, logger), reg), logs
}

// TestReloadNamesChangesAgainstTheConfigInForce: each reload logs one
// line naming the sections it applied and those that need a restart,
// compared with what runs rather than with the previous file: a change to
// proxy.max_attempts alone names proxy only, reverting it is no change,
// a change to tracing warns (issue 54; newcomer report items 7 and 16).
func TestReloadNamesChangesAgainstTheConfigInForce(t *testing.T) {
	backend := "http://" + deadUpstreamAddr(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(extra string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("backends:\n  - url: "+backend+"\n"+extra), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	rl, logs := newTestReloader(t, path)
	steps := []struct {
		name     string
		extra    string // appended to the file
		wantLine string // in the reload's log line
	}{
		{"max_attempts alone", "proxy:\n  max_attempts: 5\n",
			`level=WARN msg="config reloaded; some changes need a restart" file=` + path + ` trigger=test applied=[] restart=[proxy]`},
		{"max_attempts back to the value in force", "",
			`level=INFO msg="config reloaded" file=` + path + ` trigger=test applied=[] restart=[]`},
		{"tracing", "tracing:\n  endpoint: http://127.0.0.1:4318\n",
			`level=WARN msg="config reloaded; some changes need a restart" file=` + path + ` trigger=test applied=[] restart=[tracing]`},
		{"tracing back, a model alias and debug", "models:\n  - name: chat\n    targets:\n      - model: m\nlog:\n  level: debug\n",
			`level=INFO msg="config reloaded" file=` + path + ` trigger=test applied="[log.level models]" restart=[]`},
	}
	for _, st := range steps {
		logs.Reset()
		write(st.extra)
		if !rl.reload("test") {
			t.Fatalf("%s: reload refused:\n%s", st.name, logs)
		}
		if lines := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(lines) != 1 || !strings.Contains(lines[0], st.wantLine) {
			t.Errorf("%s: reload logged\n%s\nwant one line with\n%s", st.name, logs, st.wantLine)
		}
	}
}

// TestReloadAppliesEverySectionTaggedApply: the sections config tags
// reload:"apply" are those reload hands to the running components (scrape
// manager, balancer, proxy, log level); tagging another one apply needs
// code in reload that applies it.
func TestReloadAppliesEverySectionTaggedApply(t *testing.T) {
	applies := []string{"default_engine", "log.level", "auth", "models", "engines", "backends", "capture"} // as reload applies them
	var tagged []string
	for _, s := range config.Sections() {
		if s.Apply {
			tagged = append(tagged, s.Key)
		}
	}
	if !slices.Equal(tagged, applies) {
		t.Errorf("sections tagged apply %q, reload applies %q", tagged, applies)
	}
}
