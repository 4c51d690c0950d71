package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/balancer"
)

// BackendStatus is one backend as GET /debug/backends shows it.
type BackendStatus struct {
	ID       string             `json:"id"`
	Name     string             `json:"name"` // what clients see in x-llmlb-backend
	URL      string             `json:"url"`
	Engine   string             `json:"engine"`
	Models   []string           `json:"models"`
	Adapters []balancer.Adapter `json:"adapters"`
	State    balancer.State     `json:"state"`
	Reason   string             `json:"reason,omitempty"`
	Warning  string             `json:"warning,omitempty"`
	Labels   map[string]string  `json:"labels,omitempty"`
	Role     balancer.Role      `json:"role"` // prefill, decode or both
	// Rank is the global data-parallel rank of a backend that is one rank
	// of its server (balancer.Backend.Ranked); absent for the others.
	Rank      *int               `json:"data_parallel_rank,omitempty"`
	Ejections int                `json:"ejections_total"`
	Ejection  *balancer.Ejection `json:"ejection,omitempty"` // passive health's ejection; absent when in rotation
	Since     time.Time          `json:"since"`
	Metrics   *balancer.Metrics  `json:"metrics"` // null before the first reading
	Stale     bool               `json:"metrics_stale"`
	InFlight  int64              `json:"in_flight"`
	// PeersInFlight is what the other replicas sharing the ledger
	// (cluster.share_load) have in flight on the backend, as last heard.
	PeersInFlight int64   `json:"peers_in_flight"`
	Requests      int64   `json:"requests_total"`
	Failures      int64   `json:"failures_total"`
	TTFBSeconds   float64 `json:"ttfb_seconds"`
	// BytesPerToken is the prompt bytes a token of the backend covers,
	// learned from its answers' usage; absent until learned.
	BytesPerToken float64 `json:"bytes_per_token,omitempty"`
	// IndexFit is the prefix index's size correction from the backend's
	// cached_tokens (1: none).
	IndexFit float64 `json:"index_fit"`
	// FirstToken is the first-token model learned from the backend's
	// answers, which deadlines are judged by; absent until learned.
	FirstToken *balancer.FirstTokenModel `json:"first_token_model,omitempty"`
}

// Statuses returns every backend's live state, sorted by ID.
func Statuses(snap *balancer.Snapshot) []BackendStatus {
	out := make([]BackendStatus, 0, len(snap.Backends))
	for _, be := range snap.Backends {
		ej := be.Ledger.Ejection()
		var rank *int
		if be.Ranked {
			rank = &be.Rank
		}
		out = append(out, BackendStatus{
			Rank:          rank,
			ID:            be.ID,
			Name:          be.Name,
			URL:           be.URL.String(),
			Engine:        be.Engine,
			Models:        be.Models,
			Adapters:      be.Adapters,
			State:         be.State,
			Reason:        be.Reason,
			Warning:       be.Warning,
			Labels:        be.Labels,
			Role:          be.Role,
			Ejections:     ej.Total,
			Ejection:      ejectionOrNil(ej),
			Since:         be.Since,
			Metrics:       metricsOrNil(be.Metrics),
			Stale:         be.Stale,
			InFlight:      be.Ledger.InFlight(),
			PeersInFlight: be.Ledger.Peers().InFlight,
			Requests:      be.Ledger.Total(),
			Failures:      be.Ledger.Failures(),
			TTFBSeconds:   be.Ledger.TTFB().Seconds(),
			BytesPerToken: be.Ledger.BytesPerToken(),
			IndexFit:      be.Ledger.IndexFit(),
			FirstToken:    firstTokenOrNil(be.Ledger.FirstTokenModel()),
		})
	}
	return out
}

// firstTokenOrNil returns m, or nil while it is not learned.
func firstTokenOrNil(m balancer.FirstTokenModel) *balancer.FirstTokenModel {
	if !m.Learned() {
		return nil
	}
	return &m
}

// FetchBackends reads GET /debug/backends from the admin listener at
// adminURL (scheme and host): the client side of [BackendStatus], for the
// demo's live view and the end-to-end tests.
func FetchBackends(client *http.Client, adminURL string) ([]BackendStatus, error) {
	resp, err := client.Get(adminURL + "/debug/backends")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("debug/backends: status %d", resp.StatusCode)
	}
	var body struct {
		Backends []BackendStatus `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("debug/backends: %w", err)
	}
	return body.Backends, nil
}

func metricsOrNil(m balancer.Metrics) *balancer.Metrics {
	if m.At.IsZero() {
		return nil
	}
	return &m
}

// AdminHandler returns the admin routes: the status page at /, /metrics
// from g, /debug/backends, /debug/route and pprof. It belongs on a listener operators reach, not clients.
func (s *Server) AdminHandler(g prometheus.Gatherer) http.Handler {
	r := chi.NewRouter()
	r.Get("/", s.serveStatus)
	r.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: nil}))
	r.Get("/debug/backends", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"backends": Statuses(s.bal.Snapshot())})
	})
	r.Post("/debug/route", s.serveRoute)
	r.HandleFunc("/debug/pprof/*", pprof.Index)
	r.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	r.HandleFunc("/debug/pprof/profile", pprof.Profile)
	r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	r.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return r
}

// serveRoute answers POST /debug/route: the body is a completions or chat
// request (chat when it has "messages"; ?kind=completions or ?kind=chat
// forces one), and the answer is how the balancer would route it, every
// backend's score breakdown included, each backend by its URL (id) and by
// the name x-llmlb-backend gives it; on a fleet with roles, "pd" is the
// disaggregation decision and the prefill pick. Nothing is sent to any
// backend and no routing state changes.
func (s *Server) serveRoute(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)); err != nil {
		writeError(w, badRequest("", "The request body could not be read: %v.", err))
		return
	}
	k := KindCompletion
	switch r.URL.Query().Get("kind") {
	case "chat":
		k = KindChat
	case "completions":
	case "":
		if bytes.Contains(buf.Bytes(), []byte(`"messages"`)) {
			k = KindChat
		}
	default:
		writeError(w, badRequest("kind", "kind must be chat or completions."))
		return
	}
	req, err := ParseRequest(k, buf.Bytes())
	if err != nil {
		writeError(w, s.errorFor(r.Context(), err))
		return
	}
	breq, _, err := s.balancerRequest(r, req, nil) // operators may set the priority header and deadlines
	if err != nil {
		writeError(w, s.errorFor(r.Context(), err))
		return
	}
	s.tokenize(r.Context(), &exchange{req: req}, breq)
	ex := s.bal.Explain(breq)
	out := map[string]any{
		"requested_model": req.Model,
		"target_model":    breq.Model,
		"explanation":     ex,
	}
	if pd := s.explainPD(breq, ex); pd != nil { // a fleet with roles: the prefill leg's decision
		out["pd"] = pd
	}
	writeJSON(w, http.StatusOK, out)
}

func ejectionOrNil(e balancer.Ejection) *balancer.Ejection {
	if !e.Ejected {
		return nil
	}
	return &e
}
