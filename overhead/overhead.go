package overhead

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/llmlb/llmlb/bench"
	"github.com/llmlb/llmlb/sim"
)

// Options choose what `llmlb overhead` runs.
type Options struct {
	// LLMLB is the llmlb executable to run as a proxy (`serve`); "" skips
	// it.
	LLMLB string
	// Proxies are the rows: "direct", "llmlb", "llmlb-keyed",
	// "llmlb-redis", "llmlb-capture", "go", "haproxy", "nginx".
	Proxies []string
	// Duration is how long each scenario runs against each proxy.
	Duration time.Duration
	// Scale multiplies the clients of the concurrent scenarios (below 1
	// for a smoke run); 1 is the full benchmark.
	Scale float64
	// Require makes a proxy that is not installed an error instead of a
	// skipped row.
	Require bool
	// Scenarios, if set, are the names of the scenarios to run (see
	// [Scenarios]); empty runs every one.
	Scenarios []string
	// ProfileDir, if set, gets llmlb's CPU profile of each scenario,
	// taken from its admin listener's pprof while the load runs, as
	// llmlb-<scenario>.pprof (`go tool pprof` reads it). Profiling costs
	// llmlb CPU of its own: compare CPU figures of runs without it.
	ProfileDir string
	// Progress, if set, gets a line as each cell finishes.
	Progress io.Writer
}

// Run starts a fast emulated backend, puts each proxy in front of it
// and runs every scenario through each, one at a time.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Duration <= 0 {
		o.Duration = 5 * time.Second
	}
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if len(o.Proxies) == 0 {
		o.Proxies = []string{"direct", "llmlb", "go", "haproxy", "nginx"}
	}
	rep := Report{Duration: o.Duration.Seconds()}
	dir, err := os.MkdirTemp("", "llmlb-overhead-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)

	backend, stopBackend, err := fastBackend()
	if err != nil {
		return rep, err
	}
	defer stopBackend()

	scenarios, err := pickScenarios(Scenarios(o.Scale), o.Scenarios)
	if err != nil {
		return rep, err
	}
	for _, name := range o.Proxies {
		row := Row{Proxy: name}
		admin := ""
		if strings.HasPrefix(name, "llmlb") && o.ProfileDir != "" {
			port, err := freePort()
			if err != nil {
				return rep, err
			}
			admin = fmt.Sprintf("127.0.0.1:%d", port)
		}
		url, version, pid, stop, err := startProxy(ctx, name, o.LLMLB, backend, dir, admin)
		var missing errMissing
		switch {
		case errors.As(err, &missing) && !o.Require:
			row.Skipped = err.Error()
			rep.Rows = append(rep.Rows, row)
			continue
		case err != nil:
			return rep, fmt.Errorf("overhead: %s: %w", name, err)
		}
		row.Version = version
		for _, sc := range scenarios {
			path := cmp.Or(sc.Path, "/v1/completions")
			var before procUsage
			if pid > 0 {
				resetPeaks(pid)
				before, _ = usageOf(pid)
			}
			var profiled chan error // the profile taken while the load runs
			if admin != "" {
				profiled = make(chan error, 1)
				go func() {
					profiled <- saveProfile(ctx, admin, o.Duration, filepath.Join(o.ProfileDir, "llmlb-"+sc.Name+".pprof"))
				}()
			}
			hdr, session := rowRequest(name)
			res := Load{URL: url + path, Body: sc.Body, Bodies: sc.Bodies, Stream: sc.Stream, Clients: sc.Clients, Duration: o.Duration, PerClient: sc.PerClient,
				Header: hdr, SessionHeader: session}.Run(ctx)
			if profiled != nil {
				if err := <-profiled; err != nil {
					stop()
					return rep, fmt.Errorf("overhead: profile of %s: %w", sc.Name, err)
				}
			}
			cell := Cell{Scenario: sc.Name, Clients: sc.Clients, Requests: res.Requests, Errors: res.Errors, FirstError: res.FirstErr,
				PerSecond: float64(res.Requests) / res.Elapsed.Seconds(), P50: bench.Quantile(res.Latency, .5), P99: bench.Quantile(res.Latency, .99)}
			if pid > 0 {
				if after, ok := usageOf(pid); ok {
					cell.PeakRSS = after.PeakRSS
					if res.Requests > 0 {
						cell.CPUPerRequest = (after.CPU - before.CPU).Seconds() / float64(res.Requests)
					}
				}
			}
			if sc.Stream {
				cell.TTFTP50, cell.TTFTP90, cell.TTFTP99 = bench.Quantile(res.TTFT, .5), bench.Quantile(res.TTFT, .9), bench.Quantile(res.TTFT, .99)
				if len(res.Gaps) > 0 { // none when streams are one token long; JSON has no NaN
					cell.GapP99 = bench.Quantile(res.Gaps, .99)
				}
				cell.EventsPerS = float64(res.Events) / res.Elapsed.Seconds()
			}
			row.Cells = append(row.Cells, cell)
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "overhead: %s %s: %d requests, %d errors\n", name, sc.Name, res.Requests, res.Errors)
			}
			if ctx.Err() != nil {
				break
			}
		}
		stop()
		if name == "llmlb-capture" && ctx.Err() == nil {
			if err := checkCapture(&row, dir, o.Progress); err != nil {
				return rep, err
			}
		}
		rep.Rows = append(rep.Rows, row)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// checkCapture counts the lines the llmlb-capture row's stopped process
// wrote into row and reports them beside the requests answered. A
// capture with no lines is an error: the row then measured llmlb without
// capturing.
func checkCapture(row *Row, dir string, progress io.Writer) error {
	lines, err := captureLines(capturePath(dir))
	if err != nil {
		return fmt.Errorf("overhead: %s: %w", row.Proxy, err)
	}
	row.CaptureLines = lines
	requests := 0
	for _, c := range row.Cells {
		requests += c.Requests
	}
	if progress != nil {
		fmt.Fprintf(progress, "overhead: %s: %d capture lines for %d requests answered\n", row.Proxy, lines, requests)
	}
	if lines == 0 && requests > 0 {
		return fmt.Errorf("overhead: %s: the capture got no lines for %d requests: the row measured llmlb without capturing", row.Proxy, requests)
	}
	return nil
}

// fastBackend serves the OpenAI API on a loopback port from an emulated
// vLLM server whose first token comes at once and each next one 10ms
// later, and returns its base URL. Its KV cache (16M tokens) holds every
// prompt the scenarios have in flight at once (150 220 KB chats are 8.4M
// tokens), as a server this fast would: with the default 131k tokens,
// llmlb's saturation filter held most long prompts in its admission
// queue, which HAProxy and nginx do not have.
func fastBackend() (string, func(), error) {
	model := sim.NewSteady(sim.SteadyConfig{DecodeTokensPerSecond: 100, PrefillTokensPerSecond: 1e12,
		FirstTokenLatency: time.Nanosecond, MaxRunning: 1 << 16, NumBlocks: 1 << 20})
	srv, err := sim.NewServer(sim.ServerConfig{Model: bench.Model}, model)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { hs.Close() }, nil
}

// saveProfile asks the llmlb admin listener at admin for a CPU profile
// of the next d and writes it to path.
func saveProfile(ctx context.Context, admin string, d time.Duration, path string) error {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof answered %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
