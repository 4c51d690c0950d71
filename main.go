// Command llmlb is a load balancer for LLM inference servers (vLLM, SGLang,
// Triton TensorRT-LLM, trtllm-serve): one binary, one YAML file.
//
//	llmlb [serve] [--config config.yaml]   run the balancer (default)
//	llmlb validate config.yaml             check a config file
//	llmlb sim [flags]                      run emulated model servers
//	llmlb probe [flags] URL|FILE           show what the balancer reads from a metrics page
//	llmlb demo [flags]                     emulated servers + balancer + traffic, live view
//	llmlb bench [flags]                    routing benchmark in virtual time
//	llmlb overhead [flags]                 proxy overhead against HAProxy and nginx
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/wire"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil {
		if !errors.Is(err, errReported) && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "llmlb:", err)
		}
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(1)
	}
}

// errReported is returned when the problem was already printed in full.
var errReported = errors.New("reported")

const usage = `llmlb: a load balancer for LLM inference servers.

Usage:
  llmlb [serve] [--config PATH]   run the balancer (default config ./config.yaml)
  llmlb validate PATH             check a config file and list every problem
  llmlb sim [flags]               run emulated model servers
  llmlb probe [flags] URL|FILE    show what the balancer reads from a metrics page
  llmlb demo [flags]              emulated servers, the balancer, traffic and a live view
  llmlb bench [flags]             replay workloads through every policy in virtual time
  llmlb overhead [flags]          llmlb, HAProxy and nginx in front of one fast backend, live

Run 'llmlb COMMAND --help' for a command's flags.
`

// run is the whole program: main only supplies the process's arguments,
// environment and streams. SIGINT and SIGTERM end it gracefully.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return cmdServe(ctx, args, getenv, stdout, stderr)
	case "validate":
		return cmdValidate(args, getenv, stdout, stderr)
	case "sim":
		return cmdSim(ctx, args, stdout, stderr)
	case "probe":
		return cmdProbe(ctx, args, getenv, stdout, stderr)
	case "demo":
		return cmdDemo(ctx, args, stdout, stderr)
	case "bench":
		return cmdBench(ctx, args, stdout, stderr)
	case "overhead":
		return cmdOverhead(ctx, args, getenv, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func cmdValidate(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("validate", "llmlb validate PATH", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("validate takes exactly one config file")
	}
	path := fs.Arg(0)
	cfg, err := loadConfig(path, getenv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	fmt.Fprintf(stdout, "%s: ok (%d backends)\n", path, len(cfg.Backends))
	return nil
}

func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "llmlb serve [--config PATH]", stderr)
	path := fs.String("config", "config.yaml", "config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := loadConfig(*path, getenv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	return serve(ctx, cfg, &configSource{path: *path, getenv: getenv}, stdout, stderr)
}

// newLogger returns the logger c asks for; its level can be changed
// while it runs through the returned LevelVar.
func newLogger(c LogConfig, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	level, _ := parseLevel(c.Level) // validated
	lv := new(slog.LevelVar)
	lv.Set(level)
	opts := &slog.HandlerOptions{Level: lv}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), lv
	}
	return slog.New(slog.NewTextHandler(w, opts)), lv
}

// serve runs the balancer for cfg until ctx ends, then shuts down
// gracefully: it stops accepting, lets in-flight requests and streams finish
// within cfg.ShutdownGrace, cuts what remains, and returns nil.
func serve(ctx context.Context, cfg Config, src *configSource, stdout, stderr io.Writer) error {
	inst, err := start(ctx, cfg, src, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "llmlb: serving on http://%s (admin http://%s)\n", inst.addr, inst.adminAddr)
	return inst.wait()
}

// instance is a running balancer.
type instance struct {
	addr, adminAddr string // where it listens; adminAddr is "" when disabled
	done            chan error
}

// wait blocks until the instance has shut down.
func (in *instance) wait() error { return <-in.done }

// start brings up the balancer for cfg and returns once it listens. It shuts
// down gracefully when ctx ends; wait reports the end. With a source, it
// reloads the config from it on SIGHUP and when the file changes.
func start(ctx context.Context, cfg Config, src *configSource, stderr io.Writer) (*instance, error) {
	logger, level := newLogger(cfg.Log, stderr)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	bal, err := newBalancer(cfg, reg, logger)
	if err != nil {
		return nil, err
	}
	engines, err := scrape.NewEngineSet(cfg.Engines)
	if err != nil {
		return nil, err
	}
	mgr, err := scrape.NewManager(scrape.Setup{
		Config:        cfg.Scrape,
		Backends:      cfg.Backends,
		Engines:       engines,
		DefaultEngine: cfg.DefaultEngine,
		Balancer:      bal,
		Registerer:    reg,
		Logger:        logger,
	})
	if err != nil {
		return nil, err
	}
	px := proxy.New(cfg.Proxy, bal, reg, logger)
	px.SetLogging(cfg.Log.Access, cfg.Log.Prompts)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	front := &http.Server{
		Handler:           px.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	var admin *http.Server
	var adminLn net.Listener
	if cfg.Admin.Listen != "" {
		adminLn, err = net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("admin.listen: %w", err)
		}
		admin = &http.Server{Handler: px.AdminHandler(reg), ReadHeaderTimeout: 10 * time.Second}
	}

	// Shutdown closes the listeners before it runs these hooks.
	front.RegisterOnShutdown(func() { logger.Info("stopped accepting new connections") })

	inst := &instance{addr: ln.Addr().String(), done: make(chan error, 1)}
	scrapeCtx, stopScrape := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = mgr.Run(scrapeCtx) })
	var cs configSource
	if src != nil {
		cs = *src
	}
	rl := newReloader(cs, cfg, logger, level, mgr, bal, reg)
	if src != nil {
		hup, stopHUP := notifyHUP()
		wg.Go(func() { defer stopHUP(); rl.run(scrapeCtx, hup) })
	}
	serveErr := make(chan error, 2)
	wg.Go(func() { serveErr <- ignoreClosed(front.Serve(ln)) })
	if admin != nil {
		inst.adminAddr = adminLn.Addr().String()
		wg.Go(func() { serveErr <- ignoreClosed(admin.Serve(adminLn)) })
	}
	logger.Info("serving", "listen", inst.addr, "admin", inst.adminAddr, "backends", len(cfg.Backends))

	go func() {
		var runErr error
		select {
		case <-ctx.Done():
		case runErr = <-serveErr:
		}
		logger.Info("shutting down", "grace", cfg.ShutdownGrace.String())
		graceCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
		defer cancel()
		if err := front.Shutdown(graceCtx); err != nil {
			logger.Warn("grace period over, cutting remaining requests", "err", err)
			front.Close()
		}
		if admin != nil {
			admin.Close()
		}
		stopScrape()
		wg.Wait()
		logger.Info("stopped")
		inst.done <- runErr
	}()
	return inst, nil
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func cmdSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", "llmlb sim [--engine vllm] [--preset h100-8b] [--listen ADDR] [--model NAME] [--lora a,b] [--speed X] [--count N]", stderr)
	engine := fs.String("engine", "vllm", "engine flavour to emulate: vllm, sglang, triton-tensorrt-llm or trtllm-serve")
	preset := fs.String("preset", "h100-8b", "engine model preset: "+strings.Join(sim.PresetNames(), ", "))
	listen := fs.String("listen", "127.0.0.1:8001", "address of the first server; --count servers take consecutive ports")
	model := fs.String("model", "llama-3.1-8b", "base model name served")
	lora := fs.String("lora", "", "comma-separated LoRA adapter names served on top of the model")
	speed := fs.Float64("speed", 1, "run this many times faster than real time")
	count := fs.Int("count", 1, "number of servers to start")
	maxLoRA := fs.Int("max-lora", 0, "adapters a batch may use at once (0: the preset's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ecfg, err := sim.Preset(*preset)
	if err != nil {
		return fmt.Errorf("sim: --preset: %w", err)
	}
	if *maxLoRA > 0 {
		ecfg.MaxLoRA = *maxLoRA
	}
	if *count < 1 {
		return errors.New("sim: --count must be at least 1")
	}
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("sim: --listen %q: %w", *listen, err)
	}
	var port int
	if _, err := fmt.Sscanf(portStr, "%d", &port); err != nil {
		return fmt.Errorf("sim: --listen %q: bad port", *listen)
	}
	var adapters []string
	if *lora != "" {
		adapters = strings.Split(*lora, ",")
	}
	var servers []*http.Server
	var wg sync.WaitGroup
	for i := range *count {
		s, err := sim.NewServer(sim.ServerConfig{Engine: *engine, Model: *model, Adapters: adapters}, sim.NewLive(ecfg, *speed))
		if err != nil {
			return err
		}
		addr := net.JoinHostPort(host, fmt.Sprint(port+i))
		if port == 0 {
			addr = net.JoinHostPort(host, "0")
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, hs := range servers {
				hs.Close()
			}
			return fmt.Errorf("sim: %w", err)
		}
		hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, hs)
		fmt.Fprintf(stdout, "sim: %s (%s, x%g) serving %s at http://%s\n", *engine, *preset, *speed, *model, ln.Addr())
		wg.Go(func() { _ = hs.Serve(ln) })
	}
	<-ctx.Done()
	for _, hs := range servers {
		hs.Close()
	}
	wg.Wait()
	return nil
}

// newBalancer builds the balancer for cfg's policy with the prefix index or
// tree its preset needs, and registers the index's size metrics on reg.
func newBalancer(cfg Config, reg prometheus.Registerer, logger *slog.Logger) (*balancer.Balancer, error) {
	b, idx, err := wire.Balancer(cfg.Balancer, cfg.Prefix, balancer.Deps{}, cfg.Models, logger)
	if err != nil {
		return nil, err
	}
	if reg != nil && idx != nil {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmlb_prefix_index_entries", Help: "Prompt blocks the prefix-cache index remembers, over all backends."},
				func() float64 { n, _ := idx.Stats(); return float64(n) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmlb_prefix_index_bytes", Help: "Estimated memory of the prefix-cache index (entries × prefix.EntryBytes)."},
				func() float64 { _, b := idx.Stats(); return float64(b) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmlb_prefix_block_bytes", Help: "Bytes of canonical prompt per hashed block (auto-tuned from the engines' cache block size unless set)."},
				func() float64 { return float64(idx.BlockBytes()) }),
		)
	}
	return b, nil
}
