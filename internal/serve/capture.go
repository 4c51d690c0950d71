package serve

import (
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/capture"
	"github.com/llmlb/llmlb/proxy"
)

// capturer runs the capture config asks for (capture:) and swaps it when a
// reload changes it. Its methods may be called concurrently.
type capturer struct {
	// immutable after newCapturer
	px      *proxy.Server
	metrics *capture.Metrics // outlive the captures
	logger  *slog.Logger

	mu  sync.Mutex
	cfg capture.Config  // guarded by mu; the section in force
	w   *capture.Writer // guarded by mu; nil when off
}

func newCapturer(px *proxy.Server, reg prometheus.Registerer, logger *slog.Logger) *capturer {
	return &capturer{px: px, metrics: capture.NewMetrics(reg), logger: logger}
}

// apply makes cfg the capture in force. A change of sample alone goes on
// in the same file; any other change closes the running capture (its
// queued lines written) and starts a new one, reading the salt again. On
// an error (the file cannot be made) the running capture goes on.
func (c *capturer) apply(cfg capture.Config) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	same := cfg
	same.Sample = c.cfg.Sample
	if c.w != nil && same == c.cfg {
		c.w.SetSample(cfg.Sample)
		c.cfg = cfg
		return nil
	}
	if c.w == nil && !cfg.Enabled() {
		c.cfg = cfg
		return nil
	}
	var next *capture.Writer
	if cfg.Enabled() {
		salt, err := cfg.LoadSalt()
		if err != nil {
			return err
		}
		next, err = capture.Open(cfg, salt, capture.Options{Metrics: c.metrics, Logger: c.logger})
		if err != nil {
			return err
		}
	}
	c.px.SetCapture(next)
	if c.w != nil {
		if err := c.w.Close(); err != nil {
			c.logger.Warn("capture not closed cleanly", "file", c.w.Path(), "err", err)
		}
		c.logger.Info("capture stopped", "file", c.w.Path())
	}
	if next != nil {
		c.logger.Info("capture started", "file", cfg.Path, "sample", cfg.Sample, "random_salt", cfg.Salt == "" && cfg.SaltFile == "")
	}
	c.w, c.cfg = next, cfg
	return nil
}

// close stops the capture, writing what is queued: after the listeners'
// shutdown, when no request adds to it.
func (c *capturer) close() {
	c.mu.Lock()
	off := c.cfg
	c.mu.Unlock()
	off.Path = ""
	_ = c.apply(off)
}
