package serve

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
)

// Source is where a running balancer rereads its config from.
type Source struct {
	Path string         // the config file
	Env  config.Environ // the environment its LLMLB_* overrides come from
	// Poll is how often the file is checked for a change. (default 1s)
	Poll time.Duration
}

// reloader applies a changed config file to a running balancer, on SIGHUP
// and when the file's content changes. The new file is loaded and
// validated in full first; a file with any problem is refused and logged
// with every problem, and the running config keeps serving.
//
// What a reload applies is the `reload` tag of each section of
// [config.Config] ([config.Sections]): backends (and discovery entries),
// engines, default_engine, models, auth (API keys) and log.level are
// applied at once; unchanged backends, requests in flight and streams are
// untouched, backends that left are drained. A change to any other
// section is compared with the config in force, not with the previous
// file, and logged as needing a restart.
type reloader struct {
	src    Source
	logger *slog.Logger
	level  *slog.LevelVar
	mgr    *scrape.Manager
	bal    *balancer.Balancer
	px     *proxy.Server
	capt   *capturer
	result *prometheus.CounterVec // result
	last   prometheus.Gauge

	mu   sync.Mutex    // serialises reloads
	cur  config.Config // guarded by mu; the config in force: restart-only sections as started
	hash [32]byte      // guarded by mu; of the file cur came from
}

func newReloader(src Source, cfg config.Config, logger *slog.Logger, level *slog.LevelVar, mgr *scrape.Manager, bal *balancer.Balancer, px *proxy.Server, capt *capturer, reg prometheus.Registerer) *reloader {
	if src.Poll <= 0 {
		src.Poll = time.Second
	}
	r := &reloader{src: src, logger: logger, level: level, mgr: mgr, bal: bal, px: px, capt: capt, cur: cfg,
		result: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_config_reloads_total",
			Help: "Config file reloads, by result: success, or error (the file was refused and the running config kept).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmlb_config_last_reload_success_timestamp_seconds",
			Help: "When the running config was loaded, at start or by the last successful reload.",
		}),
	}
	r.result.WithLabelValues("success")
	r.result.WithLabelValues("error")
	r.last.SetToCurrentTime()
	reg.MustRegister(r.result, r.last)
	if src.Path == "" {
		return r // metrics only: nothing to reload from
	}
	if b, err := os.ReadFile(src.Path); err == nil {
		r.hash = sha256.Sum256(b)
	}
	return r
}

// run reloads on SIGHUP and on every change of the file's content until
// ctx ends. The signal handler is in place when run is called; a SIGHUP
// that comes before the scrape manager runs waits for it instead of being
// refused.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	select {
	case <-r.mgr.Started():
	case <-ctx.Done():
		return
	}
	tick := time.NewTicker(r.src.Poll)
	defer tick.Stop()
	var settle settler
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload("signal")
		case <-tick.C:
			b, err := os.ReadFile(r.src.Path)
			if err != nil {
				continue // mid-replace, or gone: the next change will tell
			}
			r.mu.Lock()
			running := r.hash
			r.mu.Unlock()
			if settle.ready(sha256.Sum256(b), running) {
				r.reload("file change")
			}
		}
	}
}

// settler applies a change of the file once its content has held for a
// whole poll: a file written in place (truncated, then written) is not
// read half way, where a cut-off backend list would be valid and applied.
type settler struct{ pending [32]byte }

// ready takes the content hash seen at a poll and the running config's,
// and reports whether to reload now.
func (s *settler) ready(seen, running [32]byte) bool {
	switch {
	case seen == running:
		s.pending = [32]byte{}
		return false
	case seen != s.pending:
		s.pending = seen // seen once: wait a poll for it to settle
		return false
	}
	s.pending = [32]byte{}
	return true
}

// notifyHUP starts delivering SIGHUP to the returned channel; stop ends it.
func notifyHUP() (ch chan os.Signal, stop func()) {
	ch = make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}

// reload loads, validates and applies the file. It reports whether the
// new config is in force.
func (r *reloader) reload(trigger string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := os.ReadFile(r.src.Path)
	if err == nil {
		r.hash = sha256.Sum256(b) // a refused file is not retried until it changes again
	}
	cfg, err := config.Load(r.src.Path, r.src.Env) // validated in full, every problem named
	if err == nil {
		// First: a capture file that cannot be made refuses the reload
		// before anything of it is applied.
		err = r.capt.apply(cfg.Capture)
	}
	if err == nil {
		var engines scrape.EngineSet
		if engines, err = scrape.NewEngineSet(cfg.Engines); err == nil {
			err = r.mgr.Reload(cfg.Backends, engines, cfg.DefaultEngine)
		}
	}
	if err != nil {
		r.result.WithLabelValues("error").Inc()
		r.logger.Error("config reload refused; the running config keeps serving", "file", r.src.Path, "trigger", trigger, "err", err.Error())
		return false
	}
	r.bal.SetModels(cfg.Models)
	_ = r.px.SetAuth(cfg.Auth)                   // validated by Load; requests admitted keep their key
	level, _ := config.ParseLevel(cfg.Log.Level) // validated
	r.level.Set(level)
	applied, restart := config.Changes(r.cur, cfg)
	r.cur = config.InForce(r.cur, cfg)
	r.result.WithLabelValues("success").Inc()
	r.last.SetToCurrentTime()
	attrs := []any{"file", r.src.Path, "trigger", trigger, "applied", applied, "restart", restart,
		"backends", len(cfg.Backends), "models", len(cfg.Models), "keys", len(cfg.Auth.Keys)}
	if len(restart) > 0 {
		r.logger.Warn("config reloaded; some changes need a restart", attrs...)
	} else {
		r.logger.Info("config reloaded", attrs...)
	}
	return true
}
