package demo

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/bench"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// header is what stays at the top of every frame of the demo's live
// view: where to look and what is running.
type header struct {
	proxy, status string // addresses, with scheme
	clients       int
	duration      time.Duration
}

// viewLegend explains every column of the live view, in its order.
var viewLegend = []string{
	"backend   its name, as the x-llmlb-backend header gives it, and its address",
	"preset    the engine model the emulated server runs: h100-8b (Llama 3.1 8B on an H100), a100-8b (the same on an A100, slower)",
	"state     health as llmlb sees it: ready, down, draining, unknown",
	"in-flight requests llmlb has sent the server and not seen finish",
	"requests  requests the server was sent since the start; share is its part of all of them",
	"ttft      llmlb's smoothed time to first byte from the server",
	"kv        the server's own KV-cache use; hits: its prompt tokens served from the prefix cache",
	"load      one # per request in flight",
}

// render writes one frame of the demo's live view: the header (the
// status page's address stays on screen for the whole run), a row per
// backend with its preset, state, requests in flight, requests served and
// its share, its smoothed time to first token and, when engine knows the
// server behind a backend URL, the server's own KV use and prefix-cache
// hit rate (prompt tokens served from cache over prompt tokens looked
// up); the legend; then the client-side totals.
func render(w io.Writer, h header, elapsed time.Duration, backends []proxy.BackendStatus, r LoadResults, engine func(url string) (sim.Stats, bool)) {
	var total int64
	for _, b := range backends {
		total += b.Requests
	}
	fmt.Fprintf(w, "llmlb demo: %s of %s; status page %s; proxy %s; %d clients; Ctrl-C stops\n\n",
		elapsed.Truncate(time.Second), h.duration, h.status, h.proxy, h.clients)
	fmt.Fprintf(w, "%-24s %-8s %-8s %9s %9s %7s %10s %6s %6s  %s\n", "backend", "preset", "state", "in-flight", "requests", "share", "ttft", "kv", "hits", "load")
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
		preset := b.Labels["gpu"]
		if preset == "" {
			preset = "-"
		}
		// The name clients see in x-llmlb-backend, then the address.
		fmt.Fprintf(w, "%-24s %-8s %-8s %9d %9d %6.1f%% %8.0fms %6s %6s  %s\n",
			b.Name+" "+strings.TrimPrefix(b.ID, "http://"), preset, b.State, b.InFlight, b.Requests, 100*share, 1000*b.TTFBSeconds, kv, hits, bar)
	}
	fmt.Fprintln(w)
	for _, l := range viewLegend {
		fmt.Fprintf(w, "  %s\n", l)
	}
	rate := 0.0
	if elapsed > 0 {
		rate = float64(r.OK) / elapsed.Seconds()
	}
	fmt.Fprintf(w, "\nclients: %d ok (%.1f/s), %d failed; TTFT p50 %s, p99 %s; %d output tokens\n",
		r.OK, rate, r.Failed, quantile(r.TTFT, 0.5), quantile(r.TTFT, 0.99), r.OutputTokens)
	if r.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", r.LastError)
	}
}

// quantile returns the q-quantile of ds to the millisecond, or 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return time.Duration(bench.Quantile(s, q) * float64(time.Second)).Round(time.Millisecond)
}
