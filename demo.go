package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// defaultDemoStatus is where the demo's status page listens unless
// --status says otherwise: a fixed address, so a browser tab kept open
// across runs finds it again (issue 18, 8).
const defaultDemoStatus = "127.0.0.1:9091"

// cmdDemo wires emulated servers, the balancer and a load generator
// together and shows a live per-backend view until the duration ends or ctx
// does (Ctrl-C).
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "llmlb demo [--backends N] [--duration D] [--concurrency C] [--speed X] [--status ADDR]", stderr)
	n := fs.Int("backends", 4, "emulated servers (h100-8b engine model); the last one is the slower a100-8b")
	duration := fs.Duration("duration", 20*time.Second, "how long to send traffic")
	concurrency := fs.Int("concurrency", 24, "concurrent clients")
	speed := fs.Float64("speed", 1, "run the emulated servers this many times faster than real time")
	status := fs.String("status", defaultDemoStatus, "address of the admin status page (host:port; port 0 picks a free one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *concurrency < 1 || *duration <= 0 {
		return fmt.Errorf("demo: --backends, --concurrency and --duration must be positive")
	}
	const model = "llama-3.1-8b"

	cfg := config.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = *status
	cfg.Log.Level = "warn"
	cfg.ShutdownGrace = 5 * time.Second
	cfg.Scrape.HealthInterval = 500 * time.Millisecond

	var servers []*http.Server
	var wg sync.WaitGroup
	defer func() {
		for _, s := range servers {
			s.Close()
		}
		wg.Wait()
	}()
	engines := map[string]*sim.Live{}
	for i := range *n {
		preset := "h100-8b"
		if i == *n-1 && *n > 1 {
			preset = "a100-8b" // an older GPU in the same fleet
		}
		ecfg, err := sim.Preset(preset)
		if err != nil {
			return err
		}
		live := sim.NewLive(ecfg, *speed)
		s, err := sim.NewServer(sim.ServerConfig{Model: model}, live)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, hs)
		wg.Go(func() { _ = hs.Serve(ln) })
		u := "http://" + ln.Addr().String()
		engines[u] = live
		cfg.Backends = append(cfg.Backends, scrape.BackendConfig{URL: u, Labels: map[string]string{"gpu": preset}})
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("demo config: %w", err)
	}

	lbCtx, stopLB := context.WithCancel(context.Background())
	defer stopLB()
	inst, err := start(lbCtx, cfg, nil, stderr)
	if err != nil {
		return fmt.Errorf("demo: %w (choose another status page address with --status, e.g. --status 127.0.0.1:0)", err)
	}
	head := demoHeader{proxy: "http://" + inst.addr, status: "http://" + inst.adminAddr + "/", clients: *concurrency, duration: *duration}
	fmt.Fprintf(stdout, "llmlb demo: %d emulated vLLM servers behind %s (status page %s), %d clients for %s; Ctrl-C stops\n",
		*n, head.proxy, head.status, *concurrency, *duration)

	if err := waitReady(ctx, "http://"+inst.addr+"/ready", 10*time.Second); err != nil {
		return err
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, *duration)
	defer stopLoad()
	load := &sim.Load{URL: "http://" + inst.addr, Model: model, Concurrency: *concurrency, Tenants: 12, MaxTokens: 64, Seed: 1}
	loadDone := make(chan struct{})
	go func() { load.Run(loadCtx); close(loadDone) }()

	client := &http.Client{Timeout: 2 * time.Second}
	tty := isTerminal(stdout)
	begin := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	frame := func() {
		bs, err := sim.FetchBackends(client, "http://"+inst.adminAddr)
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
		renderView(&b, head, time.Since(begin), bs, load.Results(), func(url string) (sim.Stats, bool) {
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
	stopLB()
	if err := inst.wait(); err != nil {
		return err
	}
	r := load.Results()
	fmt.Fprintf(stdout, "\nllmlb demo: done; %d requests served over %d backends, %d failed\n", r.OK, len(r.ByBackend), r.Failed)
	return nil
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
