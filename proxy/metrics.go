package proxy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
)

// metrics are the balancer's own request metrics, registered on the admin
// listener's registry.
type metrics struct {
	requests  *prometheus.CounterVec   // model, backend, status
	ttfb      *prometheus.HistogramVec // backend
	duration  *prometheus.HistogramVec // backend
	retries   *prometheus.CounterVec   // backend (the one that failed)
	picks     *prometheus.CounterVec   // backend, reason
	queueWait prometheus.Histogram
}

// latencyBuckets span a cached short prompt (tens of ms) to a long prefill
// under load or a long generation (minutes).
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

func newMetrics(reg prometheus.Registerer, bal *balancer.Balancer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_requests_total",
			Help: "Requests answered, by requested model, backend that answered (\"none\" if none did) and HTTP status (499: client went away).",
		}, []string{"model", "backend", "status"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_time_to_first_byte_seconds",
			Help:    "Time from sending a request to a backend to the first byte of its response body: time to first token for streams.",
			Buckets: latencyBuckets,
		}, []string{"backend"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_request_duration_seconds",
			Help:    "Time from receiving a request to the end of its response, by backend that answered.",
			Buckets: latencyBuckets,
		}, []string{"backend"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_retries_total",
			Help: "Attempts abandoned for another backend before the first byte, by the backend that failed.",
		}, []string{"backend"}),
	}
	m.picks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_picks_total",
		Help: "Backends chosen first for a request, by backend and reason (prefix-hit, least-load, lora, affinity, ...).",
	}, []string{"backend", "reason"})
	m.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "llmlb_admission_wait_seconds",
		Help:    "Time requests waited in the admission queue because every backend was saturated (only requests that waited).",
		Buckets: latencyBuckets,
	})
	reg.MustRegister(m.requests, m.ttfb, m.duration, m.retries, m.picks, m.queueWait, &inFlightCollector{bal: bal})
	return m
}

var (
	inFlightDesc = prometheus.NewDesc("llmlb_in_flight_requests",
		"Requests sent to a backend and not yet finished, from the balancer's ledger.",
		[]string{"backend"}, nil)
	queueLenDesc = prometheus.NewDesc("llmlb_admission_queue_length",
		"Requests waiting in the admission queue.", nil, nil)
	refusedDesc = prometheus.NewDesc("llmlb_admission_refused_total",
		"Requests the admission queue turned away, by reason: queue-full (429), shed (429), timeout (503), cancelled (client left while waiting).",
		[]string{"reason"}, nil)
)

// inFlightCollector reads the ledger at scrape time, so the gauge can never
// drift from the counts the balancer routes on.
type inFlightCollector struct{ bal *balancer.Balancer }

func (c *inFlightCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inFlightDesc
	ch <- queueLenDesc
	ch <- refusedDesc
}

func (c *inFlightCollector) Collect(ch chan<- prometheus.Metric) {
	for _, be := range c.bal.Snapshot().Backends {
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(be.Ledger.InFlight()), be.ID)
	}
	ch <- prometheus.MustNewConstMetric(queueLenDesc, prometheus.GaugeValue, float64(c.bal.QueueLen()))
	refused := c.bal.Refusals()
	for _, reason := range []string{"queue-full", "shed", "timeout", "cancelled"} {
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(refused[reason]), reason)
	}
}

func statusLabel(code int) string { return strconv.Itoa(code) }
