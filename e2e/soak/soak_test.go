package soak

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/proxy"
)

// TestSoak is `make soak` (issue 17): LLMLBTEST_SOAK_STREAMS concurrent
// streams (default 2,000) for LLMLBTEST_SOAK (a duration; the test is skipped
// without it) through the llmlb binary at LLMLBTEST_BIN against five emulated
// servers in five `llmlb sim` processes: one is killed (SIGKILL) halfway and
// started again a tenth of the run later, and one, for the whole run, ends
// a fifth of its streams cleanly after their third chunk, its chunked body
// whole but its stream without finish_reason or [DONE]
// (die-mid-stream:events=3,framing=clean,share=0.2, issue 53). It prints
// requests completed, failed (refused before their stream began), streams
// broken (begun and ended visibly unwhole: cut, or with an error event),
// streams silently truncated (ended cleanly but not whole: neither [DONE]
// after all 16 pieces nor an error event) and lost; llmlb's RSS,
// goroutines and file descriptors before, during (peak) and after; and
// memory and goroutines per stream. It fails if a request is lost, fails
// or breaks, or a stream is silently truncated (llmlb continues the
// streams a server cut or ended early on another, and three servers are
// up throughout, so a request that fails had another server to go to), or
// if llmlb's ledger or goroutines do not come back to their starting
// level (counting two goroutines for each keep-alive connection its pools
// still hold).
func TestSoak(t *testing.T) {
	spec := os.Getenv("LLMLBTEST_SOAK")
	if spec == "" {
		t.Skip("LLMLBTEST_SOAK not set: make soak runs it")
	}
	dur, err := time.ParseDuration(spec)
	if err != nil || dur <= 0 {
		t.Fatalf("LLMLBTEST_SOAK=%q: want a duration such as 10m", spec)
	}
	streams := 2000
	if s := os.Getenv("LLMLBTEST_SOAK_STREAMS"); s != "" {
		if streams, err = strconv.Atoi(s); err != nil || streams < 1 {
			t.Fatalf("LLMLBTEST_SOAK_STREAMS=%q: want a count", s)
		}
	}
	bin, err := filepath.Abs(cmp.Or(os.Getenv("LLMLBTEST_BIN"), "../../bin/llmlb"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no llmlb binary at %s (make build): %v", bin, err)
	}

	ports := freePorts(t, 7) // three good servers, the victim, the truncating server, llmlb, admin
	for _, p := range ports[:3] {
		startProc(t, bin, "sim", "--count", "1", "--listen", "127.0.0.1:"+p)
	}
	victimArgs := []string{"sim", "--count", "1", "--listen", "127.0.0.1:" + ports[3]}
	victim := startProc(t, bin, victimArgs...)
	victimURL := "http://127.0.0.1:" + ports[3]
	startProc(t, bin, "sim", "--count", "1", "--listen", "127.0.0.1:"+ports[4], "--fault", truncateFault)
	truncatorURL := "http://127.0.0.1:" + ports[4]

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "soak.yaml")
	var backends strings.Builder
	for _, p := range ports[:5] {
		fmt.Fprintf(&backends, "  - url: http://127.0.0.1:%s\n", p)
	}
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`listen: 127.0.0.1:%s
admin:
  listen: 127.0.0.1:%s
log:
  level: info
  format: json
balancer:
  admission:             # room for every stream: a soak, not a refusal test
    max_queue: %d
    timeout: 2m
backends:
%s`, ports[5], ports[6], 2*streams, backends.String())), 0o600); err != nil {
		t.Fatal(err)
	}
	// Its warnings, and the access lines of requests it failed with a 5xx
	// (they say why), go to the test's output; the rest are dropped.
	lb := startProcTo(t, &failedLines{w: os.Stderr}, bin, "serve", "--config", cfgPath)
	addr, admin := "127.0.0.1:"+ports[5], "http://127.0.0.1:"+ports[6]
	e2etest.WaitBackends(t, "127.0.0.1:"+ports[6], 5)
	// The names clients see in X-Llmlb-Backend, to say whose a bad outcome was.
	roles := map[string]string{
		e2etest.BackendHeader(t, "127.0.0.1:"+ports[6], victimURL):    " (the killed server)",
		e2etest.BackendHeader(t, "127.0.0.1:"+ports[6], truncatorURL): " (the truncating server)",
	}

	before := measure(t, lb.Process.Pid, admin)
	t.Logf("before: %s", before)

	var (
		started, finished     atomic.Int64
		outcomes              [outcomeKinds]atomic.Int64
		mu                    sync.Mutex
		bad                   []string // guarded by mu; the first few bad outcomes
		killedAt, restartedAt time.Time
	)
	stop := make(chan struct{})
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: streams, MaxConnsPerHost: 0}}
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			prompt := fmt.Sprintf("client %d asks for a story about the sea", i)
			for {
				select {
				case <-stop:
					return
				default:
				}
				started.Add(1)
				backend, o, err := soakStream(client, addr, prompt)
				finished.Add(1)
				outcomes[o].Add(1)
				if o == completed {
					continue
				}
				// Every other outcome fails the soak: three servers are up
				// throughout, so even a request on its way to the killed
				// server had another to go to.
				mu.Lock()
				if len(bad) < 20 {
					bad = append(bad, fmt.Sprintf("%s, backend %q%s: %v", o, backend, roles[backend], err))
				}
				mu.Unlock()
			}
		})
	}

	// During: procSample every second; kill the victim halfway, start it
	// again a tenth of the run later.
	peak := before
	start := time.Now()
	// The victim stays down a tenth of the run from when it was killed,
	// not from when it was meant to be: a loaded machine's ticks come
	// late, and a late kill must not be followed by a restart in the same
	// tick.
	killAt, down := start.Add(dur/2), max(dur/10, 3*time.Second)
	heapAt := start.Add(dur / 4) // streams up, nothing killed yet
	tick := time.NewTicker(time.Second)
	for now := range tick.C {
		if m, err := measureErr(lb.Process.Pid, admin); err == nil {
			peak = peak.max(m)
		}
		if path := os.Getenv("LLMLBTEST_SOAK_HEAP"); path != "" && !heapAt.IsZero() && now.After(heapAt) {
			heapAt = time.Time{}
			saveHeapProfile(t, admin, path)
		}
		if killedAt.IsZero() && now.After(killAt) {
			killedAt = time.Now()
			_ = victim.Process.Kill()
			_ = victim.Wait()
			t.Logf("%s: killed the server at %s", time.Since(start).Round(time.Second), victimURL)
		}
		if !killedAt.IsZero() && restartedAt.IsZero() && now.After(killedAt.Add(down)) {
			victim = startProc(t, bin, victimArgs...)
			restartedAt = time.Now()
			t.Logf("%s: started it again", restartedAt.Sub(start).Round(time.Second))
		}
		if now.Sub(start) >= dur {
			break
		}
	}
	tick.Stop()
	during := peak
	close(stop)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Minute):
	}
	lost := started.Load() - finished.Load()
	client.CloseIdleConnections()

	// After: the ledger at 0 and goroutines back. A run of five minutes
	// or more waits, up to two minutes, for llmlb's keep-alive pools to
	// idle out (90 s) and wants the starting goroutines and descriptors
	// back; a shorter one allows two goroutines for each connection still
	// kept alive.
	strict := dur >= 5*time.Minute
	settled := func(a procSample) bool {
		if strict {
			return a.inFlight == 0 && a.goroutines <= before.goroutines+goroutineSlack && a.fds <= before.fds+4
		}
		return a.inFlight == 0 && a.goroutines <= before.goroutines+2*max(0, a.fds-before.fds)+goroutineSlack
	}
	var after procSample
	deadline := time.Now().Add(30 * time.Second)
	if strict {
		deadline = time.Now().Add(2 * time.Minute)
	}
	for {
		after = measure(t, lb.Process.Pid, admin)
		if settled(after) || time.Now().After(deadline) {
			break
		}
		e2etest.PollPause()
	}
	secs := time.Since(start).Seconds()
	fmt.Printf("soak: %d streams for %s through llmlb, server %s killed at %s and started again at %s, server %s showing %s\n",
		streams, dur, victimURL, killedAt.Sub(start).Round(time.Second), restartedAt.Sub(start).Round(time.Second), truncatorURL, truncateFault)
	fmt.Printf("soak: requests completed %d, failed %d, streams broken %d, silently truncated %d, lost %d (%.0f/s)\n",
		outcomes[completed].Load(), outcomes[failed].Load(), outcomes[broken].Load(), outcomes[truncated].Load(), lost, float64(finished.Load())/secs)
	fmt.Printf("soak: before  %s\n", before)
	fmt.Printf("soak: during  %s (peak)\n", during)
	fmt.Printf("soak: after   %s (%s after the run)\n", after, time.Since(start.Add(dur)).Round(time.Second))
	fmt.Printf("soak: per stream: %.1f KiB of RSS, %.2f goroutines\n",
		float64(during.rssKiB-before.rssKiB)/float64(streams), float64(during.goroutines-before.goroutines)/float64(streams))
	conts, err := continuations(admin)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("soak: streams continued or ended by llmlb: %s\n", conts)

	if lost != 0 {
		t.Errorf("%d requests lost (neither completed nor failed)", lost)
	}
	if n := outcomes[failed].Load() + outcomes[broken].Load() + outcomes[truncated].Load(); n > 0 {
		t.Errorf("%d requests failed, %d streams broke and %d were silently truncated, with at least three servers up; the first %d:\n%s",
			outcomes[failed].Load(), outcomes[broken].Load(), outcomes[truncated].Load(), len(bad), strings.Join(bad, "\n"))
	}
	if outcomes[completed].Load() == 0 {
		t.Errorf("no request completed")
	}
	if conts.truncated == 0 {
		t.Errorf("llmlb counted no stream truncated (llmlb_stream_continuations_total{reason=\"truncated\"}): the truncating server's fault did not show, and the soak tested none")
	}
	if after.inFlight != 0 {
		t.Errorf("ledger in flight %d after the run, want 0", after.inFlight)
	}
	if !settled(after) {
		t.Errorf("after the run: %s; before: %s (strict %v: two goroutines allowed per kept-alive connection unless strict, %d to spare)",
			after, before, strict, goroutineSlack)
	}
}

// goroutineSlack is the goroutines llmlb may have above its start once a
// soak is over: timers and pollers that come and go.
const goroutineSlack = 16

// continuationCounts is llmlb_stream_continuations_total's samples that
// are not 0, as the page writes them, and those of reason "truncated"
// summed.
type continuationCounts struct {
	samples   []string
	truncated float64
}

func (c continuationCounts) String() string {
	if len(c.samples) == 0 {
		return "none"
	}
	return strings.Join(c.samples, ", ")
}

// continuations reads llmlb_stream_continuations_total from llmlb's admin
// metrics page.
func continuations(admin string) (continuationCounts, error) {
	var c continuationCounts
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		labels, ok := strings.CutPrefix(sc.Text(), "llmlb_stream_continuations_total")
		if !ok {
			continue
		}
		i := strings.LastIndexByte(labels, ' ')
		v, err := strconv.ParseFloat(labels[i+1:], 64)
		if err != nil || v == 0 {
			continue
		}
		c.samples = append(c.samples, strings.TrimSpace(labels))
		if strings.Contains(labels, `reason="truncated"`) {
			c.truncated += v
		}
	}
	return c, sc.Err()
}

// truncateFault is the truncating server's fault: a fifth of its streams
// end cleanly after their third chunk, the chunked body ended with its
// last chunk but the stream with no finish_reason or [DONE].
const truncateFault = "die-mid-stream:events=3,framing=clean,share=0.2"

// outcome is how one soak request ended.
type outcome int

const (
	completed outcome = iota // [DONE] after all 16 pieces
	failed                   // no stream began: an error, or a status other than 200
	broken                   // the stream began and ended visibly unwhole: cut, or with an error event
	truncated                // the stream began and ended cleanly but not whole: no [DONE] and no error event, or [DONE] too early
	outcomeKinds
)

func (o outcome) String() string {
	return [...]string{"completed", "failed", "broken stream", "silently truncated stream"}[o]
}

// soakStream sends one streaming chat completion, reads it to its end and
// says how it ended; err says why when it did not complete.
func soakStream(client *http.Client, addr, prompt string) (backend string, o outcome, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := `{"model":"llama-3.1-8b","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":16,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", failed, err
	}
	defer resp.Body.Close()
	backend = resp.Header.Get("X-Llmlb-Backend")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return backend, failed, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	// From here on the stream has begun.
	pieces := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.Equal(line, []byte("data: [DONE]")) {
			_, _ = io.Copy(io.Discard, resp.Body)
			if pieces != 16 {
				// Ended as if whole, but short: as silent as no [DONE].
				return backend, truncated, fmt.Errorf("[DONE] after %d of 16 pieces", pieces)
			}
			return backend, completed, nil
		}
		if bytes.HasPrefix(line, []byte(`data: {"error"`)) {
			return backend, broken, fmt.Errorf("error event after %d of 16 pieces: %s", pieces, line)
		}
		if bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`)) {
			pieces++
		}
	}
	if sc.Err() != nil {
		return backend, broken, fmt.Errorf("cut after %d of 16 pieces: %w", pieces, sc.Err())
	}
	return backend, truncated, fmt.Errorf("the body ended cleanly after %d of 16 pieces, with neither [DONE] nor an error event", pieces)
}

// procSample is llmlb's process at one moment.
type procSample struct {
	rssKiB, hwmKiB int64
	fds            int
	goroutines     int
	inFlight       int64
}

func (s procSample) String() string {
	return fmt.Sprintf("RSS %.1f MiB (high-water %.1f MiB), %d goroutines, %d file descriptors, %d in flight",
		float64(s.rssKiB)/1024, float64(s.hwmKiB)/1024, s.goroutines, s.fds, s.inFlight)
}

func (s procSample) max(o procSample) procSample {
	return procSample{rssKiB: max(s.rssKiB, o.rssKiB), hwmKiB: max(s.hwmKiB, o.hwmKiB), fds: max(s.fds, o.fds),
		goroutines: max(s.goroutines, o.goroutines), inFlight: max(s.inFlight, o.inFlight)}
}

func measure(t *testing.T, pid int, admin string) procSample {
	t.Helper()
	s, err := measureErr(pid, admin)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// saveHeapProfile writes llmlb's heap profile, from its admin pprof, to
// path (LLMLBTEST_SOAK_HEAP: where the memory per stream goes).
func saveHeapProfile(t *testing.T, admin, path string) {
	resp, err := http.Get(admin + "/debug/pprof/heap")
	if err != nil {
		t.Errorf("heap profile: %v", err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Errorf("heap profile: %v", err)
		return
	}
	t.Logf("heap profile in %s", path)
}

// measureErr reads the process's RSS and descriptors from /proc, and its
// goroutines and in-flight ledger from its admin listener.
func measureErr(pid int, admin string) (procSample, error) {
	var s procSample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for line := range strings.Lines(string(status)) {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "VmHWM:") {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			if f[0] == "VmRSS:" {
				s.rssKiB = n
			} else {
				s.hwmKiB = n
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.fds = len(fds)
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			s.goroutines = int(f)
		}
	}
	bs, err := proxy.FetchBackends(http.DefaultClient, admin)
	if err != nil {
		return s, err
	}
	for _, b := range bs {
		s.inFlight += b.InFlight
	}
	return s, nil
}

// freePorts returns n ports free a moment ago.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		_, p, _ := net.SplitHostPort(ln.Addr().String())
		out = append(out, p)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// startProc starts bin with args until the test ends.
func startProc(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	return startProcTo(t, os.Stderr, bin, args...)
}

// startProcTo is startProc with the process's stderr to w.
func startProcTo(t *testing.T, w io.Writer, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = w
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LLMLB_") { // llmlb reads those as config
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
			}
		}
	})
	return cmd
}

// failedLines passes to w the lines of llmlb's JSON log that are not access
// lines of requests answered below 500.
type failedLines struct {
	w    io.Writer
	line []byte // a line not yet ended
}

func (f *failedLines) Write(p []byte) (int, error) {
	f.line = append(f.line, p...)
	for {
		i := bytes.IndexByte(f.line, '\n')
		if i < 0 {
			return len(p), nil
		}
		l := f.line[:i+1]
		var rec struct {
			Msg    string `json:"msg"`
			Status int    `json:"status"`
		}
		if json.Unmarshal(l, &rec) != nil || rec.Msg != "request" || rec.Status >= 500 {
			if _, err := f.w.Write(l); err != nil {
				return len(p), err
			}
		}
		f.line = f.line[:copy(f.line, f.line[i+1:])]
	}
}
