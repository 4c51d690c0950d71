package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmlb/llmlb/cluster"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/tracing"
)

// Run serves cfg until ctx ends, then shuts down gracefully: it stops
// accepting, lets in-flight requests and streams finish within
// cfg.ShutdownGrace, cuts what remains, and returns nil. It prints where
// it listens to stdout and logs to stderr.
func Run(ctx context.Context, cfg config.Config, src *Source, stdout, stderr io.Writer) error {
	inst, err := Start(ctx, cfg, src, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "llmlb: serving on %s://%s (admin http://%s)\n", inst.Scheme, inst.Addr, inst.AdminAddr)
	return inst.Wait()
}

// Instance is a running balancer. Its fields are set by [Start] and not
// changed after.
type Instance struct {
	Addr      string // where clients reach it, host:port
	AdminAddr string // the admin listener, host:port; "" when disabled
	Scheme    string // of Addr: http, or https with tls configured
	done      chan error
}

// Wait blocks until the instance has shut down and returns why it did:
// nil when ctx ended, else the listener's error.
func (in *Instance) Wait() error { return <-in.done }

// Start brings up the balancer for cfg and returns once it listens. It
// shuts down gracefully when ctx ends; [Instance.Wait] reports the end.
// With a source, it reloads the config from it on SIGHUP and when the file
// changes.
func Start(ctx context.Context, cfg config.Config, src *Source, stderr io.Writer) (*Instance, error) {
	logger, level := newLogger(cfg.Log, stderr)
	// The files cfg names, read and parsed as `llmlb validate` checks them.
	files, err := cfg.OpenFiles(logger)
	if err != nil {
		return nil, err
	}
	backendTLS, certs := files.BackendTLS, files.Certs
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var kv *kvevents.Store // the backends' KV-cache events, when they publish them
	if scrape.WantsKVEvents(cfg.Scrape, cfg.Backends) {
		kv = kvevents.NewStore()
	}
	bal, err := newInstrumentedBalancer(cfg, kv, reg, logger)
	if err != nil {
		return nil, err
	}
	engines, err := scrape.NewEngineSet(cfg.Engines)
	if err != nil {
		return nil, err
	}
	mgr, err := scrape.NewManager(scrape.Setup{
		TLS:           backendTLS,
		Config:        cfg.Scrape,
		Backends:      cfg.Backends,
		Engines:       engines,
		DefaultEngine: cfg.DefaultEngine,
		Balancer:      bal,
		Registerer:    reg,
		Logger:        logger,
		KVEvents:      kv,
	})
	if err != nil {
		return nil, err
	}
	tp, stopTracing, err := tracing.Start(cfg.Tracing)
	if err != nil {
		return nil, err
	}
	var cl *cluster.Cluster // nil: an llmlb alone
	var pf proxy.Fleet
	if cfg.Cluster.Enabled() {
		cl = cluster.New(cfg.Cluster, files.Cluster, bal, reg, logger)
		pf = fleet{cl}
	}
	px, err := proxy.New(proxy.Options{Config: cfg.Proxy, Balancer: bal, Registerer: reg, Logger: logger,
		AccessLog: cfg.Log.Access, LogPrompts: cfg.Log.Prompts, BackendTLS: backendTLS, KVEvents: kv, Auth: cfg.Auth,
		Tracer: tp, DropTraceContext: !cfg.Tracing.Propagate, Fleet: pf})
	if err != nil {
		return nil, err
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	// Counted beneath TLS, so that a stalled handshake is a silent reader.
	shed := proxy.NewShedder(cfg.Proxy, reg, logger)
	ln = shed.Listener(ln)
	front := px.HTTPServer(slog.NewLogLogger(logger.Handler(), slog.LevelDebug))
	if certs != nil {
		front.TLSConfig = certs.TLSConfig()
		ln = tls.NewListener(ln, front.TLSConfig)
	}
	var admin *http.Server
	var adminLn net.Listener
	if cfg.Admin.Listen != "" {
		adminLn, err = net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("admin.listen: %w", err)
		}
		h := px.AdminHandler(reg)
		if cfg.Admin.Token != "" {
			if h, err = px.RequireToken(cfg.Admin.Token, h); err != nil {
				ln.Close()
				adminLn.Close()
				return nil, err
			}
		}
		admin = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	}

	capt := newCapturer(px, reg, logger)
	if err := capt.apply(cfg.Capture); err != nil {
		ln.Close()
		if adminLn != nil {
			adminLn.Close()
		}
		return nil, err
	}

	// Shutdown closes the listeners before it runs these hooks.
	front.RegisterOnShutdown(func() { logger.Info("stopped accepting new connections") })

	inst := &Instance{Addr: ln.Addr().String(), Scheme: "http", done: make(chan error, 1)}
	if certs != nil {
		inst.Scheme = "https"
	}
	scrapeCtx, stopScrape := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = mgr.Run(scrapeCtx) })
	if cl != nil {
		wg.Go(func() { cl.Run(scrapeCtx) })
	}
	var cs Source
	if src != nil {
		cs = *src
	}
	rl := newReloader(cs, cfg, logger, level, mgr, bal, px, capt, reg)
	if src != nil {
		hup, stopHUP := notifyHUP()
		wg.Go(func() { defer stopHUP(); rl.run(scrapeCtx, hup) })
	}
	serveErr := make(chan error, 2)
	wg.Go(func() { serveErr <- ignoreClosed(front.Serve(ln)) })
	if admin != nil {
		inst.AdminAddr = adminLn.Addr().String()
		wg.Go(func() { serveErr <- ignoreClosed(admin.Serve(adminLn)) })
	}
	logger.Info("serving", "listen", inst.Addr, "scheme", inst.Scheme, "admin", inst.AdminAddr, "backends", len(cfg.Backends),
		"max_reading_connections", shed.Max())

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
		capt.close() // the requests are over: what they queued is written
		flushCtx, cancelFlush := context.WithTimeout(context.Background(), 5*time.Second)
		if err := stopTracing(flushCtx); err != nil {
			logger.Warn("spans not flushed", "err", err)
		}
		cancelFlush()
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

// newLogger returns the logger c asks for; its level can be changed
// while it runs through the returned LevelVar.
func newLogger(c config.LogConfig, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	level, _ := config.ParseLevel(c.Level) // validated
	lv := new(slog.LevelVar)
	lv.Set(level)
	opts := &slog.HandlerOptions{Level: lv}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), lv
	}
	return slog.New(slog.NewTextHandler(w, opts)), lv
}
