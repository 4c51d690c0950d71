package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// BackendView is the part of a backend's GET /debug/backends entry the live
// view shows.
type BackendView struct {
	ID          string   `json:"id"`
	URL         string   `json:"url"`
	State       string   `json:"state"`
	Engine      string   `json:"engine"`
	Stale       bool     `json:"metrics_stale"`
	Models      []string `json:"models"`
	InFlight    int64    `json:"in_flight"`
	Requests    int64    `json:"requests_total"`
	Failures    int64    `json:"failures_total"`
	TTFBSeconds float64  `json:"ttfb_seconds"`
}

// FetchBackends reads the balancer's admin /debug/backends.
func FetchBackends(client *http.Client, adminURL string) ([]BackendView, error) {
	resp, err := client.Get(adminURL + "/debug/backends")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("debug/backends: status %d", resp.StatusCode)
	}
	var body struct {
		Backends []BackendView `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("debug/backends: %w", err)
	}
	return body.Backends, nil
}

// RenderView writes one frame of the live view: a row per backend with its
// state, requests in flight, requests served and its share, its smoothed
// time to first token and, when engine knows the server behind a backend
// URL, the server's own KV use and prefix-cache hit rate (prompt tokens
// served from cache over prompt tokens looked up); then the client-side
// totals.
func RenderView(w io.Writer, elapsed time.Duration, backends []BackendView, r LoadResults, engine func(url string) (Stats, bool)) {
	var total int64
	for _, b := range backends {
		total += b.Requests
	}
	fmt.Fprintf(w, "llmlb demo: %s elapsed\n\n", elapsed.Truncate(time.Second))
	fmt.Fprintf(w, "%-26s %-8s %9s %9s %7s %10s %6s %6s  %s\n", "backend", "state", "in-flight", "requests", "share", "ttft", "kv", "hits", "load")
	for _, b := range backends {
		share := 0.0
		if total > 0 {
			share = float64(b.Requests) / float64(total)
		}
		bar := strings.Repeat("#", int(b.InFlight))
		if len(bar) > 30 {
			bar = bar[:30] + "+"
		}
		kv, hits := "-", "-"
		if engine != nil {
			if st, ok := engine(b.URL); ok {
				kv = fmt.Sprintf("%.0f%%", 100*st.KVUsage)
				if st.PrefixQueries > 0 {
					hits = fmt.Sprintf("%.0f%%", 100*float64(st.PrefixHits)/float64(st.PrefixQueries))
				}
			}
		}
		fmt.Fprintf(w, "%-26s %-8s %9d %9d %6.1f%% %8.0fms %6s %6s  %s\n",
			b.ID, b.State, b.InFlight, b.Requests, 100*share, 1000*b.TTFBSeconds, kv, hits, bar)
	}
	rate := 0.0
	if elapsed > 0 {
		rate = float64(r.OK) / elapsed.Seconds()
	}
	fmt.Fprintf(w, "\nclients: %d ok (%.1f/s), %d failed; TTFT p50 %s, p99 %s; %d output tokens\n",
		r.OK, rate, r.Failed, Percentile(r.TTFT, 50).Round(time.Millisecond), Percentile(r.TTFT, 99).Round(time.Millisecond), r.OutputTokens)
	if r.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", r.LastError)
	}
}
