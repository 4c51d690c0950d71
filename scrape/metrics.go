package scrape

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
)

// metrics are scrape's own metrics on the admin listener.
type metrics struct {
	duration   *prometheus.HistogramVec // backend
	errors     *prometheus.CounterVec   // backend, reason
	missing    *prometheus.GaugeVec     // backend, signal
	mismatch   *prometheus.GaugeVec     // backend, declared, detected
	dnsErrors  *prometheus.CounterVec   // name
	dnsTargets *prometheus.GaugeVec     // name
	kvBatches  *prometheus.CounterVec   // backend
	kvResets   *prometheus.CounterVec   // backend, reason
	kvBlocks   *prometheus.GaugeVec     // backend
}

func newMetrics(reg prometheus.Registerer, bal *balancer.Balancer, now func() time.Time) *metrics {
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_scrape_duration_seconds",
			Help:    "Time to fetch and read one backend's metrics page.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1},
		}, []string{"backend"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_scrape_errors_total",
			Help: "Metrics scrapes that failed, by backend and reason (connect, status, read, parse, empty).",
		}, []string{"backend", "reason"}),
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmlb_scrape_signal_missing",
			Help: "1 when the backend's metrics page lacks a signal its engine row names (the spec may be wrong for this server version), else 0.",
		}, []string{"backend", "signal"}),
		mismatch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmlb_backend_engine_mismatch",
			Help: "1 while a backend's metrics page contradicts its declared engine: the page has none of the declared row's signals and is read with the row it matches (detected); absent otherwise.",
		}, []string{"backend", "declared", "detected"}),
		dnsErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_discovery_dns_errors_total",
			Help: "DNS lookups of a backends entry that failed; the last good set of backends is kept.",
		}, []string{"name"}),
		dnsTargets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmlb_discovery_dns_backends",
			Help: "Backends the last good DNS answer of a backends entry gave.",
		}, []string{"name"}),
		kvBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_kv_event_batches_total",
			Help: "Batches of KV-cache events entered from each backend (scrape.kv_events).",
		}, []string{"backend"}),
		kvResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_kv_event_resets_total",
			Help: "Times what a backend's events said it holds was forgotten for want of events, by reason (restart, gap: batches lost and not replayed, unreadable).",
		}, []string{"backend", "reason"}),
		kvBlocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmlb_kv_event_blocks",
			Help: "Blocks a backend's KV-cache events say its prefix cache holds, as of the last batch.",
		}, []string{"backend"}),
	}
	if reg != nil {
		reg.MustRegister(m.duration, m.errors, m.missing, m.mismatch, m.dnsErrors, m.dnsTargets, m.kvBatches, m.kvResets, m.kvBlocks, &ageCollector{bal: bal, now: now})
	}
	return m
}

var ageDesc = prometheus.NewDesc("llmlb_backend_metrics_age_seconds",
	"Age of the last good reading of each backend's metrics page; absent before the first.", []string{"backend"}, nil)

// ageCollector reports each backend's metrics age at collection time.
type ageCollector struct {
	bal *balancer.Balancer
	now func() time.Time
}

func (c *ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- ageDesc }

func (c *ageCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, be := range c.bal.Snapshot().Backends {
		if be.Metrics.At.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, now.Sub(be.Metrics.At).Seconds(), be.ID)
	}
}
