//go:build linux

package serve

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// pressureChildEnv, set to "BACKEND_URL MAX_READING", makes this test
// binary run llmlb under a descriptor limit of childFDs instead of its
// tests (see TestDescriptorPressure).
const pressureChildEnv = "LLMLBTEST_FD_CHILD"

// childFDs is the child's RLIMIT_NOFILE, soft and hard.
const childFDs = 256

func TestMain(m *testing.M) {
	if spec := os.Getenv(pressureChildEnv); spec != "" {
		os.Exit(pressureChild(spec))
	}
	os.Exit(m.Run())
}

// pressureChild lowers the process's descriptor limit to childFDs, serves
// llmlb (serve.Start, as `llmlb serve` does) in front of the backend at
// the URL spec names, prints its client and admin addresses on a line,
// and shuts down when standard input closes. The limit applies to the
// whole process, which is why it runs in a process of its own.
func pressureChild(spec string) int {
	backend, maxReading, _ := strings.Cut(spec, " ")
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: childFDs, Max: childFDs}); err != nil {
		fmt.Fprintln(os.Stderr, "setrlimit:", err)
		return 2
	}
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin.Listen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Log.Access = false
	cfg.ShutdownGrace = time.Second
	cfg.Scrape.HealthInterval = 100 * time.Millisecond
	cfg.Proxy.MaxReadingConnections, _ = strconv.Atoi(maxReading)
	cfg.Backends = []scrape.BackendConfig{{URL: backend}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inst, err := Start(ctx, cfg, nil, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(inst.Addr, inst.AdminAddr)
	io.Copy(io.Discard, os.Stdin)
	cancel()
	if err := inst.Wait(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestDescriptorPressure runs llmlb in a child process limited to 256 file
// descriptors (issue 44's attack): 300 connections send a completion's
// headers, announce a 100-byte body and send none of it, and stay open;
// then 20 real requests, each on a new connection, are sent. With the
// bound derived from the limit (64), every real request is answered 200,
// the child never runs out of descriptors (no accept fails with EMFILE),
// and the silent connections are shed for the cap. The control run, with
// the bound set far above the limit, shows the 300 connections do exhaust
// the child's descriptors: its accepts fail with EMFILE, and it survives
// by shedding for that reason instead.
func TestDescriptorPressure(t *testing.T) {
	s, err := sim.NewServer(sim.ServerConfig{Model: "m"}, sim.NewSteady(sim.SteadyConfig{Speed: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(s.Handler())
	t.Cleanup(backend.Close)

	t.Run("derived", func(t *testing.T) {
		r := runPressure(t, backend.URL, 0)
		if !strings.Contains(r.log, "max_reading_connections="+strconv.Itoa(childFDs/4)) {
			t.Errorf("the child did not log a bound of %d at a limit of %d:\n%s", childFDs/4, childFDs, r.log)
		}
		if r.ok != r.sent {
			t.Errorf("%d of %d real requests answered 200: %v", r.ok, r.sent, r.failures)
		}
		if r.shed["cap"] < slowConns-childFDs/4 {
			t.Errorf("%v connections shed for the cap, want at least %d", r.shed["cap"], slowConns-childFDs/4)
		}
		if r.shed["descriptors"] != 0 {
			t.Errorf("%v accepts found no descriptor, want none: the bound should keep them free", r.shed["descriptors"])
		}
	})
	t.Run("control", func(t *testing.T) {
		r := runPressure(t, backend.URL, 100000)
		t.Logf("with the bound at 100000: %d of %d real requests answered 200, %v connections shed for want of descriptors", r.ok, r.sent, r.shed["descriptors"])
		if r.shed["descriptors"] == 0 {
			t.Errorf("no accept failed for want of descriptors: the attack did not reach the child's limit of %d", childFDs)
		}
	})
}

// slowConns is the number of connections that hold their bodies.
const slowConns = 300

// pressureRun is what one child run saw.
type pressureRun struct {
	sent, ok int
	failures []string
	shed     map[string]float64 // llmlb_connections_shed_total by reason
	log      string             // the child's standard error
}

// runPressure starts the child with proxy.max_reading_connections at
// maxReading, attacks it, sends the real requests, reads its shed counter
// and stops it.
func runPressure(t *testing.T, backendURL string, maxReading int) pressureRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pressureChildEnv+"="+backendURL+" "+strconv.Itoa(maxReading))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("child: %v\n%s", err, stderr.String())
			}
		}
	}
	defer stop()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	addr, admin, _ := strings.Cut(strings.TrimSpace(line), " ")
	waitReady(t, admin)

	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := range slowConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		slow = append(slow, c)
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: llmlb\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
	}

	var r pressureRun
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for i := range 20 {
		r.sent++
		resp, err := client.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":4}`))
		if err != nil {
			r.failures = append(r.failures, fmt.Sprintf("request %d: %v", i, err))
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			r.failures = append(r.failures, fmt.Sprintf("request %d: status %d", i, resp.StatusCode))
			continue
		}
		r.ok++
	}

	// The slow connections go before the admin listener is asked, which
	// otherwise competes for the same descriptors in the control run.
	for _, c := range slow {
		c.Close()
	}
	slow = nil
	r.shed = shedCounts(t, admin)
	stop()
	r.log = stderr.String()
	return r
}

// waitReady looks at the child's backends every 20 ms until its one
// backend is ready, for 10 s at most.
func waitReady(t *testing.T, admin string) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); <-tick.C {
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+admin)
		if err == nil && len(bs) == 1 && bs[0].State == balancer.StateReady && len(bs[0].Models) > 0 {
			return
		}
	}
	t.Fatal("the child's backend is not ready within 10s")
}

// shedCounts reads llmlb_connections_shed_total from the admin listener,
// summed by reason.
func shedCounts(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	re := regexp.MustCompile(`(?m)^llmlb_connections_shed_total\{reason="([a-z]+)",state="[a-z]+"\} (\S+)$`)
	for _, m := range re.FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		out[string(m[1])] += v
	}
	if len(out) != 2 {
		t.Fatalf("/metrics has no llmlb_connections_shed_total by reason:\n%s", b)
	}
	return out
}

// lockedBuffer is a bytes.Buffer the child's output may be copied into
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
