package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// DefaultStatus is where the demo's status page listens unless told
// otherwise: a fixed address, so a browser tab kept open across runs finds
// it again.
const DefaultStatus = "127.0.0.1:9091"

// Options are the demo's settings, one per flag of `llmlb demo`.
type Options struct {
	Backends    int           // emulated servers; the last of two or more runs the slower a100-8b
	Duration    time.Duration // how long clients send traffic
	Concurrency int           // concurrent clients
	Speed       float64       // the servers run this many times faster than real time
	Status      string        // the admin listener, host:port; port 0 picks a free one
}

// model is the base model the demo's servers serve.
const model = "llama-3.1-8b"

// Run wires emulated servers, the balancer and a load generator together
// and writes a live per-backend view to stdout, a frame a second, until
// the duration ends or ctx does (Ctrl-C).
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	if o.Backends < 1 || o.Concurrency < 1 || o.Duration <= 0 {
		return fmt.Errorf("demo: --backends, --concurrency and --duration must be positive")
	}
	fc := sim.FleetConfig{Server: sim.ServerConfig{Model: model}, Speed: o.Speed, Listen: "127.0.0.1:0"}
	presets := make([]string, o.Backends)
	for i := range presets {
		presets[i] = "h100-8b"
		if i == o.Backends-1 && o.Backends > 1 {
			presets[i] = "a100-8b" // an older GPU in the same fleet
		}
		ecfg, err := sim.Preset(presets[i])
		if err != nil {
			return err
		}
		fc.Engines = append(fc.Engines, ecfg)
	}
	if o.Backends > 1 {
		// The older server also ends a tenth of its streams early, cleanly
		// to HTTP but without [DONE], as a failing engine can: llmlb
		// continues each on another server and no client sees it.
		fc.Faults, fc.FaultOn = sim.Faults{truncating}, []int{o.Backends - 1}
	}
	fleet, err := sim.StartFleet(fc)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer fleet.Close()

	cfg := config.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = o.Status
	cfg.Log.Level = "warn"
	cfg.ShutdownGrace = 5 * time.Second
	cfg.Scrape.HealthInterval = 500 * time.Millisecond
	engines := map[string]*sim.Live{}
	for i, u := range fleet.URLs {
		engines[u] = fleet.Engines[i]
		cfg.Backends = append(cfg.Backends, scrape.BackendConfig{URL: u, Labels: map[string]string{"gpu": presets[i]}})
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("demo config: %w", err)
	}

	lbCtx, stopLB := context.WithCancel(context.Background())
	defer stopLB()
	inst, err := serve.Start(lbCtx, cfg, nil, stderr)
	if err != nil {
		return fmt.Errorf("demo: %w (choose another status page address with --status, e.g. --status 127.0.0.1:0)", err)
	}
	head := header{proxy: "http://" + inst.Addr, status: "http://" + inst.AdminAddr + "/", clients: o.Concurrency, duration: o.Duration}
	fmt.Fprintf(stdout, "llmlb demo: %d emulated vLLM servers behind %s (status page %s), %d clients for %s; Ctrl-C stops\n",
		o.Backends, head.proxy, head.status, o.Concurrency, o.Duration)

	if err := waitReady(ctx, "http://"+inst.Addr+"/ready", 10*time.Second); err != nil {
		return err
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, o.Duration)
	defer stopLoad()
	load := &Load{URL: "http://" + inst.Addr, Model: model, Concurrency: o.Concurrency, Tenants: 12, MaxTokens: 64, Seed: 1}
	loadDone := make(chan struct{})
	go func() { load.Run(loadCtx); close(loadDone) }()

	client := &http.Client{Timeout: 2 * time.Second}
	tty := isTerminal(stdout)
	begin := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	frame := func() {
		bs, err := proxy.FetchBackends(client, "http://"+inst.AdminAddr)
		if err != nil {
			fmt.Fprintf(stdout, "view: %v\n", err)
			return
		}
		var b strings.Builder
		if tty {
			b.WriteString("\033[H\033[2J")
		} else {
			b.WriteString("\n")
		}
		render(&b, head, time.Since(begin), bs, load.Results(), func(url string) (sim.Stats, bool) {
			if l := engines[strings.TrimSuffix(url, "/")]; l != nil {
				return l.Stats(), true
			}
			return sim.Stats{}, false
		})
		io.WriteString(stdout, b.String())
	}
	for running := true; running; {
		select {
		case <-loadDone:
			running = false
		case <-tick.C:
			frame()
		}
	}
	frame()
	continued := continuedStreams(client, "http://"+inst.AdminAddr+"/metrics")
	stopLB()
	if err := inst.Wait(); err != nil {
		return err
	}
	r := load.Results()
	fmt.Fprintf(stdout, "\nllmlb demo: done; %d requests served over %d backends, %d failed; %d streams a server ended early continued on another\n",
		r.OK, len(r.ByBackend), r.Failed, continued)
	return nil
}

// truncating is the fault of the demo's older server: a tenth of its
// streams end after 8 tokens, the chunked body whole, without [DONE].
var truncating = sim.Fault{Kind: sim.FaultDieMidStream, Events: 8, Framing: sim.FramingClean, Share: 0.1}

// continuedStreams reads from llmlb's metrics page how many streams it
// continued on another server; 0 if it cannot.
func continuedStreams(client *http.Client, url string) int {
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "llmlb_stream_continuations_total{") && strings.Contains(line, `result="continued"`) {
			if i := strings.LastIndexByte(line, ' '); i >= 0 {
				v, _ := strconv.ParseFloat(line[i+1:], 64)
				n += v
			}
		}
	}
	return int(n)
}

// waitReady polls url until it answers 200, ctx ends or limit passes.
func waitReady(ctx context.Context, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: balancer not ready after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// isTerminal reports whether w is a character device, where the view
// redraws in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
