package proxy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
)

// metrics are the balancer's own request metrics, registered on the admin
// listener's registry.
type metrics struct {
	requests *prometheus.CounterVec   // model, target_model, backend, status
	ttfb     *prometheus.HistogramVec // backend
	ttft     *prometheus.HistogramVec // backend, model
	slo      *prometheus.CounterVec   // model, priority, slo, result
	itl      *prometheus.HistogramVec // backend, model
	duration *prometheus.HistogramVec // backend, model
	// Tokens the backends reported in usage, by backend and model.
	promptTokens, completionTokens, cachedTokens *prometheus.CounterVec
	predicted                                    *prometheus.CounterVec // backend
	reported                                     *prometheus.CounterVec // backend
	ttftPredicted, ttftObserved                  *prometheus.CounterVec // backend
	retries                                      *prometheus.CounterVec // backend (the one that failed)
	continuations                                *prometheus.CounterVec // reason, result
	evictions                                    *prometheus.CounterVec // model, backend
	picks                                        *prometheus.CounterVec // backend, reason
	tokenize                                     *prometheus.CounterVec // result
	queueWait                                    prometheus.Histogram
	pdRequests                                   *prometheus.CounterVec   // decision
	pdLegTTFB                                    *prometheus.HistogramVec // leg
}

// tokenBuckets span a single decode step on a small model (a few ms) to a
// step stalled behind long prefills.
var tokenBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5}

// latencyBuckets span a cached short prompt (tens of ms) to a long prefill
// under load or a long generation (minutes).
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

func newMetrics(reg prometheus.Registerer, bal *balancer.Balancer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_requests_total",
			Help: "Requests answered, by requested model, the model backends were asked for (after aliases and splits), backend that answered (\"none\" if none did) and HTTP status (499: client went away).",
		}, []string{"model", "target_model", "backend", "status"}),
		slo: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_slo_requests_total",
			Help: "Requests with a deadline (x-slo-ttft-ms, x-slo-tpot-ms), by requested model, priority (negative, zero, positive), deadline (ttft, tpot) and result: met, missed, refused (no server could meet a sheddable request's deadline) or unobserved (not a stream, or no token came).",
		}, []string{"model", "priority", "slo", "result"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_time_to_first_token_seconds",
			Help:    "Streams: time from sending the request to the backend that answered to the first event carrying output, as read by the proxy.",
			Buckets: latencyBuckets,
		}, []string{"backend", "model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_inter_token_latency_seconds",
			Help:    "Streams: time between consecutive events carrying output, as read by the proxy.",
			Buckets: tokenBuckets,
		}, []string{"backend", "model"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_time_to_first_byte_seconds",
			Help:    "Time from sending a request to a backend to the first byte of its response body: time to first token for streams.",
			Buckets: latencyBuckets,
		}, []string{"backend"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_request_duration_seconds",
			Help:    "Time from receiving a request to the end of its response, by backend that answered and requested model.",
			Buckets: latencyBuckets,
		}, []string{"backend", "model"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_prefix_predicted_tokens_total",
			Help: "Prompt tokens the balancer expected the chosen backend to hold in its prefix cache, over requests whose backend reported cached tokens; compare with llmlb_prefix_reported_tokens_total.",
		}, []string{"backend"}),
		ttftPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_ttft_predicted_seconds_total",
			Help: "The time to first token the pick estimated for streams the first chosen backend answered, summed; compare with llmlb_ttft_observed_seconds_total.",
		}, []string{"backend"}),
		ttftObserved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_ttft_observed_seconds_total",
			Help: "The time to first token those streams took, from sending the request to the backend, summed.",
		}, []string{"backend"}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_prefix_reported_tokens_total",
			Help: "Prompt tokens the backend reported serving from its prefix cache (usage.prompt_tokens_details.cached_tokens), over the same requests.",
		}, []string{"backend"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_retries_total",
			Help: "Attempts abandoned for another backend before the first byte, by the backend that failed.",
		}, []string{"backend"}),
	}
	m.continuations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_stream_continuations_total",
		Help: "Streams that broke after their first byte, by why (cut, stall, error: an error event, truncated: the body ended cleanly before the API's terminator) and what came of it (continued on another server; completed: every token had reached the client and llmlb sent the terminator; not_continued: it could not be, failed: no server took it; both end the client's stream with an error event).",
	}, []string{"reason", "result"})
	for _, reason := range []string{stream.BreakCut, stream.BreakStall, stream.BreakError, stream.BreakTruncated} {
		for _, result := range []string{stream.OutcomeContinued, stream.OutcomeCompleted, stream.OutcomeNotContinued, stream.OutcomeFailed} {
			m.continuations.WithLabelValues(reason, result) // at 0 from the start, so rates see the first break
		}
	}
	m.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_evictions_total",
		Help: "Sheddable requests (negative priority) in flight that llmlb ended for a request of higher priority that waited balancer.admission.evict_after, by requested model and the backend they were on: the client got an error event, or a 429 if nothing had been sent.",
	}, []string{"model", "backend"})
	m.picks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_picks_total",
		Help: "Backends chosen first for a request, by backend and reason (prefix-hit, least-load, lora, affinity, ...).",
	}, []string{"backend", "reason"})
	m.tokenize = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_tokenize_requests_total",
		Help: "Prompts sent to a backend's /tokenize before the pick, for the backends' KV-cache events (scrape.kv_events), by result (ok, error: matched by the prompt-text index alone).",
	}, []string{"result"})
	m.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "llmlb_admission_wait_seconds",
		Help:    "Time requests waited in the admission queue because every backend was saturated (only requests that waited).",
		Buckets: latencyBuckets,
	})
	tokens := func(name string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_" + name + "_tokens_total",
			Help: "Tokens the backends reported in usage (" + name + "), by backend and requested model.",
		}, []string{"backend", "model"})
		reg.MustRegister(c)
		return c
	}
	m.promptTokens, m.completionTokens, m.cachedTokens = tokens("prompt"), tokens("completion"), tokens("cached_prompt")
	m.pdRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_pd_requests_total",
		Help: "Requests on a fleet with prefill servers (backends[].role), by decision: pd (a prefill leg, then the decode leg) or local (the decode server alone: few uncached tokens, or no prefill server to take it).",
	}, []string{"decision"})
	m.pdLegTTFB = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmlb_pd_leg_ttfb_seconds",
		Help:    "Disaggregated requests: time from sending a leg to the first byte of its answer, by leg (prefill, decode).",
		Buckets: latencyBuckets,
	}, []string{"leg"})
	for _, d := range []string{pdSplit, pdLocal} {
		m.pdRequests.WithLabelValues(d) // at 0 from the start
	}
	for _, l := range []string{legPrefill, legDecode} {
		m.pdLegTTFB.WithLabelValues(l)
	}
	reg.MustRegister(m.pdRequests, m.pdLegTTFB)
	reg.MustRegister(m.ttftPredicted, m.ttftObserved)
	reg.MustRegister(m.requests, m.slo, m.ttfb, m.ttft, m.itl, m.duration, m.predicted, m.reported, m.retries, m.continuations, m.evictions, m.picks, m.tokenize, m.queueWait, &inFlightCollector{bal: bal})
	return m
}

var (
	inFlightDesc = prometheus.NewDesc("llmlb_in_flight_requests",
		"Requests sent to a backend and not yet finished, from the balancer's ledger.",
		[]string{"backend"}, nil)
	queueLenDesc = prometheus.NewDesc("llmlb_admission_queue_length",
		"Requests waiting in the admission queue.", nil, nil)
	saturationDesc = prometheus.NewDesc("llmlb_model_saturation",
		"How saturated each model's backends are, 0 to 1: the mean over its ready backends of max(queued / balancer.saturation.queue, KV use / balancer.saturation.kv), capped at 1. At 1 new requests wait or are shed: a signal to scale on.",
		[]string{"model"}, nil)
	stateDesc = prometheus.NewDesc("llmlb_backend_state",
		"1 for the state each backend is in (unknown, ready, down, draining), 0 for the others.",
		[]string{"backend", "state"}, nil)
	slotsDesc = prometheus.NewDesc("llmlb_backend_slots",
		"Requests each backend runs at once as llmlb learned them (balancer.Ledger.Slots): confirmed on the backend, or by another of its engine and KV size; absent while not known.",
		[]string{"backend"}, nil)
	signalDescs = [3]*prometheus.Desc{
		prometheus.NewDesc("llmlb_backend_queued_requests", "Requests waiting in each backend's queue, from its last metrics reading; absent while unknown.", []string{"backend"}, nil),
		prometheus.NewDesc("llmlb_backend_running_requests", "Requests running on each backend, from its last metrics reading; absent while unknown.", []string{"backend"}, nil),
		prometheus.NewDesc("llmlb_backend_kv_cache_usage_ratio", "Used fraction of each backend's KV cache, from its last metrics reading; absent while unknown.", []string{"backend"}, nil),
	}
	ejectedDesc = prometheus.NewDesc("llmlb_backend_ejected",
		"1 while passive health has the backend out of rotation, else 0.", []string{"backend"}, nil)
	backendEjectionsDesc = prometheus.NewDesc("llmlb_backend_ejections_total",
		"Times passive health took each backend out of rotation.", []string{"backend"}, nil)
	ejectionsDesc = prometheus.NewDesc("llmlb_ejections_total",
		"Passive ejections by reason: the last failure of the streak (connect, 5xx, 429, first-byte-timeout, stall, stream-cut: cut or ended before its terminator), a refused connection (refused, which ejects at once) or ttft-outlier.",
		[]string{"reason"}, nil)
	cappedDesc = prometheus.NewDesc("llmlb_ejections_capped_total",
		"Ejections passive health wanted but balancer.passive.max_ejection_percent refused.", nil, nil)
	refusedDesc = prometheus.NewDesc("llmlb_admission_refused_total",
		"Requests the admission queue turned away, by reason: queue-full (429), shed (429), timeout (503), cancelled (client left while waiting).",
		[]string{"reason"}, nil)
)

// inFlightCollector reads the ledger at scrape time, so the gauge can never
// drift from the counts the balancer routes on.
type inFlightCollector struct{ bal *balancer.Balancer }

func (c *inFlightCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inFlightDesc
	ch <- stateDesc
	for _, d := range signalDescs {
		ch <- d
	}
	ch <- slotsDesc
	ch <- queueLenDesc
	ch <- saturationDesc
	ch <- refusedDesc
	ch <- ejectedDesc
	ch <- backendEjectionsDesc
	ch <- ejectionsDesc
	ch <- cappedDesc
}

func (c *inFlightCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.bal.Saturation() {
		ch <- prometheus.MustNewConstMetric(saturationDesc, prometheus.GaugeValue, s.Level, s.Model)
	}
	for _, be := range c.bal.Snapshot().Backends {
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(be.Ledger.InFlight()), be.ID)
		ej := be.Ledger.Ejection()
		ch <- prometheus.MustNewConstMetric(ejectedDesc, prometheus.GaugeValue, b2f(ej.Ejected), be.ID)
		ch <- prometheus.MustNewConstMetric(backendEjectionsDesc, prometheus.CounterValue, float64(ej.Total), be.ID)
		for _, st := range []balancer.State{balancer.StateUnknown, balancer.StateReady, balancer.StateDown, balancer.StateDraining} {
			v := 0.0
			if be.State == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, be.ID, st.String())
		}
		if n := be.Ledger.Slots(); n > 0 {
			ch <- prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(n), be.ID)
		}
		for i, val := range []balancer.Value{be.Metrics.Queued, be.Metrics.Running, be.Metrics.KVUsage} {
			if val.Known && !be.Metrics.At.IsZero() {
				ch <- prometheus.MustNewConstMetric(signalDescs[i], prometheus.GaugeValue, val.V, be.ID)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(queueLenDesc, prometheus.GaugeValue, float64(c.bal.QueueLen()))
	refused := c.bal.Refusals()
	for _, reason := range []string{"queue-full", "shed", "timeout", "cancelled"} {
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(refused[reason]), reason)
	}
	byReason, capped := c.bal.Ejections()
	for i, reason := range balancer.EjectReasons() {
		ch <- prometheus.MustNewConstMetric(ejectionsDesc, prometheus.CounterValue, float64(byReason[i]), reason)
	}
	ch <- prometheus.MustNewConstMetric(cappedDesc, prometheus.CounterValue, float64(capped))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func statusLabel(code int) string { return strconv.Itoa(code) }
