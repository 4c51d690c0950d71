package scrape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"
)

// maxPageBytes bounds a metrics page. Real pages are tens to hundreds of
// KiB; a larger one is treated as unreadable.
const maxPageBytes = 32 << 20

// scrapeError is a failed scrape with the reason our metrics count it by.
type scrapeError struct {
	reason string // connect, status, read, parse, empty
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

// scrape reads the metrics page once. A readable page replaces the
// backend's metrics; an unreadable one (garbage, empty, too large), or a
// refused connection, marks them stale at once; a page that could not be
// fetched otherwise (a timeout, a reset) leaves the last reading until it
// is older than StaleAfter. A backend whose engine is not
// known yet is detected instead, and one whose row reads nothing from its
// page (or whose page is JSON) is checked against the other rows.
func (t *Target) scrape(ctx context.Context) {
	if t.scrapeOff {
		return
	}
	if t.engine == nil {
		t.detect(ctx)
		return
	}
	if t.metricsURL == "" {
		return
	}
	start := t.now()
	r, err := fetchReading(ctx, t.client, t.metricsURL, t.engine, t.cfg.ScrapeTimeout, t.now)
	if ctx.Err() != nil {
		return
	}
	t.metrics.duration.WithLabelValues(t.spec.ID).Observe(t.now().Sub(start).Seconds())
	if err != nil {
		t.failed(err)
		if errors.Is(err, errJSONPage) {
			_ = t.recheck(ctx)
		}
		return
	}
	if len(r.Used) == 0 && t.recheck(ctx) {
		return
	}
	t.accept(r)
}

// failed records a scrape that did not give a reading.
func (t *Target) failed(err error) {
	var se *scrapeError
	reason := "connect"
	if errors.As(err, &se) {
		reason = se.reason
	}
	t.metrics.errors.WithLabelValues(t.spec.ID, reason).Inc()
	if t.scrapeErr == "" {
		t.logger.Warn("metrics scrape failing", "backend", t.spec.ID, "err", err)
	}
	t.scrapeErr = err.Error()
	if reason != "connect" || errors.Is(err, syscall.ECONNREFUSED) {
		// What the server says cannot be read, or nothing listens at its
		// address: do not trust the old reading. A killed server's last
		// one says it is idle, and kept fresh it drew every pick while
		// the live servers looked saturated (issue 53). A timeout keeps
		// it: a busy server may answer its metrics late.
		t.lastGood = time.Time{}
	}
	t.spec.Stale = t.lastGood.IsZero() || t.now().Sub(t.lastGood) > t.cfg.StaleAfter
}

// accept makes r the backend's metrics.
func (t *Target) accept(r Reading) {
	if t.scrapeErr != "" {
		t.logger.Info("metrics scrape recovered", "backend", t.spec.ID)
	}
	t.scrapeErr = ""
	t.lastGood = r.Metrics.At
	t.spec.Metrics = r.Metrics
	t.spec.Stale = false
	t.rankMetrics = r.Ranks
	switch {
	case t.fixedRanks != nil:
	case len(r.Ranks) > 1: // one rank needs no header: the server has one engine
		t.setRanks(slices.Sorted(maps.Keys(r.Ranks)))
	default:
		t.setRanks(nil)
	}
	t.reportMissing(r)
}

// reportMissing logs, once per change, signals the engine row names that
// the page lacks and the backend should have (see
// [Reading.MissingExpected]), and keeps llmlb_scrape_signal_missing
// current.
func (t *Target) reportMissing(r Reading) {
	missing := r.MissingExpected(len(t.spec.Adapters) > 0)
	if slices.Equal(missing, t.missing) {
		return
	}
	for _, s := range missing {
		if !slices.Contains(t.missing, s) {
			t.metrics.missing.WithLabelValues(t.spec.ID, s).Set(1)
			t.logger.Warn("backend metrics lack a signal; check the engine row or the backend's engine", "backend", t.spec.ID,
				"engine", t.engine.Name, "signal", s, "spec", t.engine.spec(s))
		}
	}
	for _, s := range t.missing {
		if !slices.Contains(missing, s) {
			t.metrics.missing.WithLabelValues(t.spec.ID, s).Set(0)
			if !slices.Contains(r.Missing, s) { // else no longer expected: the adapters went
				t.logger.Info("backend metrics signal present again", "backend", t.spec.ID, "signal", s)
			}
		}
	}
	t.missing = slices.Clone(missing)
}

// resetMissing forgets the signals reported missing, for a new engine row.
func (t *Target) resetMissing() {
	for _, s := range t.missing {
		t.metrics.missing.WithLabelValues(t.spec.ID, s).Set(0)
	}
	t.missing = nil
}

// Fetch GETs the metrics page at u and extracts e's signals from it, as a
// backend's scrape loop does; `llmlb probe` uses it.
func Fetch(ctx context.Context, client *http.Client, u string, e *Engine, timeout time.Duration) (Reading, error) {
	return fetchReading(ctx, client, u, e, timeout, time.Now)
}

// fetchReading GETs a metrics page and extracts e's signals from it.
func fetchReading(ctx context.Context, client *http.Client, u string, e *Engine, timeout time.Duration, now func() time.Time) (Reading, error) {
	page, err := fetchPage(ctx, client, u, timeout)
	if err != nil {
		return Reading{}, err
	}
	r, err := e.Extract(page, now())
	if errors.Is(err, ErrNoData) {
		return Reading{}, &scrapeError{"empty", fmt.Errorf("metrics %s: %w", u, err)}
	}
	if err != nil {
		return Reading{}, &scrapeError{"parse", fmt.Errorf("metrics %s: %w", u, err)}
	}
	return r, nil
}

// errJSONPage is a metrics page answered as JSON.
var errJSONPage = errors.New("answered JSON, not Prometheus text")

// fetchPage GETs a Prometheus text page. A page answered as JSON is an
// error: trtllm-serve's /metrics is JSON, its Prometheus text lives at
// /prometheus/metrics.
func fetchPage(ctx context.Context, client *http.Client, u string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, &scrapeError{"connect", err}
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, &scrapeError{"connect", err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &scrapeError{"status", fmt.Errorf("metrics %s: status %d", u, resp.StatusCode)}
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, maxPageBytes+1))
	if err != nil {
		return nil, &scrapeError{"read", fmt.Errorf("metrics %s: %w", u, err)}
	}
	if len(page) > maxPageBytes {
		return nil, &scrapeError{"read", fmt.Errorf("metrics %s: page larger than %d MiB", u, maxPageBytes>>20)}
	}
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		return nil, &scrapeError{"parse", fmt.Errorf("metrics %s: %w (trtllm-serve serves Prometheus at /prometheus/metrics)", u, errJSONPage)}
	}
	return page, nil
}
