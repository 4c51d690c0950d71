package overhead

import (
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// Cell is one scenario against one proxy. Times are seconds.
type Cell struct {
	Scenario   string  `json:"scenario"`
	Clients    int     `json:"clients"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	PerSecond  float64 `json:"requests_per_s"`
	P50        float64 `json:"latency_p50"`
	P99        float64 `json:"latency_p99"`
	TTFTP50    float64 `json:"ttft_p50,omitempty"`
	TTFTP90    float64 `json:"ttft_p90,omitempty"`
	TTFTP99    float64 `json:"ttft_p99,omitempty"`
	GapP99     float64 `json:"gap_p99,omitempty"`
	EventsPerS float64 `json:"events_per_s,omitempty"`
	// CPUPerRequest is the proxy's processes' user plus system CPU time
	// over the cell, from /proc, divided by the requests answered; 0 for
	// the direct row, which has no proxy process.
	CPUPerRequest float64 `json:"cpu_per_request,omitempty"`
	// PeakRSS is the sum of the proxy's processes' resident-set peaks
	// (VmHWM) during the cell, in bytes; 0 for the direct row.
	PeakRSS    int64  `json:"peak_rss_bytes,omitempty"`
	FirstError string `json:"first_error,omitempty"`
}

// Row is one proxy's results.
type Row struct {
	Proxy   string `json:"proxy"`
	Version string `json:"version"`
	Skipped string `json:"skipped,omitempty"` // why there are no cells
	Cells   []Cell `json:"cells"`
	// CaptureLines is how many lines the llmlb-capture row's capture got
	// over all its cells (and the probe that waited for it to start); 0
	// for the other rows.
	CaptureLines int `json:"capture_lines,omitempty"`
}

// Report is the whole run.
type Report struct {
	Duration float64 `json:"seconds_per_cell"`
	Rows     []Row   `json:"rows"`
}

// Write prints the report as two tables, one row a proxy. The first:
// latency at one client, requests per second at high concurrency and with
// long prompts, and first-token and inter-token times of concurrent
// streams. The second: first-token times of the long chat prompts, and
// each scenario's CPU time per request and the peak resident set.
func Write(w io.Writer, rep Report) {
	ms := func(s float64) string {
		if math.IsNaN(s) {
			return "-"
		}
		return fmt.Sprintf("%.2fms", s*1000)
	}
	num := func(x float64) string {
		if math.IsNaN(x) {
			return "-"
		}
		return fmt.Sprintf("%.0f", x)
	}
	us := func(s float64) string {
		if s == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0fµs", s*1e6)
	}
	head := []string{"proxy", "lat p50", "p99", "added p50", "rps", "p99", "256KB rps", "p50", "streams ttft p50", "p99", "gap p99", "events/s", "errors"}
	head2 := []string{"proxy", "220KB chat ttft p50", "p90", "p99", "rps", "cpu/req: lat", "rps", "256KB", "220KB chat", "streams", "peak rss"}
	if len(rep.Rows) > 0 {
		for _, c := range rep.Rows[0].Cells {
			switch c.Scenario {
			case "throughput":
				head[4] = fmt.Sprintf("rps@%d", c.Clients)
			case "streams":
				head[8] = fmt.Sprintf("%d streams ttft p50", c.Clients)
			case "long-chat":
				head2[1] = fmt.Sprintf("220KB chat@%d ttft p50", c.Clients)
			}
		}
	}
	var direct float64 = math.NaN()
	rows, rows2 := [][]string{head}, [][]string{head2}
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			rows = append(rows, []string{r.Proxy, "skipped: " + r.Skipped})
			continue
		}
		by := map[string]Cell{}
		errs := 0
		var peak int64
		for _, c := range r.Cells {
			by[c.Scenario] = c
			errs += c.Errors
			peak = max(peak, c.PeakRSS)
		}
		cell := func(name string) Cell { // a scenario not run (--scenario) prints as -
			if c, ok := by[name]; ok {
				return c
			}
			nan := math.NaN()
			return Cell{P50: nan, P99: nan, PerSecond: nan, TTFTP50: nan, TTFTP90: nan, TTFTP99: nan, GapP99: nan, EventsPerS: nan}
		}
		lat, thr, long, chat, st := cell("latency"), cell("throughput"), cell("long-prompt"), cell("long-chat"), cell("streams")
		if r.Proxy == "direct" {
			direct = lat.P50
		}
		added := "-"
		if !math.IsNaN(direct) && !math.IsNaN(lat.P50) && r.Proxy != "direct" {
			added = fmt.Sprintf("%+.2fms", (lat.P50-direct)*1000)
		}
		rows = append(rows, []string{r.Proxy, ms(lat.P50), ms(lat.P99), added, num(thr.PerSecond), ms(thr.P99),
			num(long.PerSecond), ms(long.P50), ms(st.TTFTP50), ms(st.TTFTP99), ms(st.GapP99), num(st.EventsPerS), fmt.Sprint(errs)})
		rss := "-"
		if peak > 0 {
			rss = fmt.Sprintf("%.0fMB", float64(peak)/(1<<20))
		}
		rows2 = append(rows2, []string{r.Proxy, ms(chat.TTFTP50), ms(chat.TTFTP90), ms(chat.TTFTP99), num(chat.PerSecond),
			us(lat.CPUPerRequest), us(thr.CPUPerRequest), us(long.CPUPerRequest), us(chat.CPUPerRequest), us(st.CPUPerRequest), rss})
	}
	fmt.Fprintf(w, "\noverhead: one fast emulated vLLM backend on loopback, %gs a cell (220KB chat: 4 requests a client)\n", rep.Duration)
	writeTable(w, rows)
	fmt.Fprintln(w)
	writeTable(w, rows2)
	for _, r := range rep.Rows {
		for _, c := range r.Cells {
			if c.FirstError != "" {
				fmt.Fprintf(w, "%s %s: first error: %s\n", r.Proxy, c.Scenario, c.FirstError)
			}
		}
	}
}

// writeTable prints rows in aligned columns, the first left-aligned and
// the others right-aligned; a row shorter than the first (a skipped
// proxy) is printed as it is.
func writeTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		if len(row) != len(widths) {
			continue
		}
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", max(0, widths[min(i, len(widths)-1)]-utf8.RuneCountInString(c)))
			switch {
			case i == 0:
				b.WriteString(c + pad)
			case len(row) != len(widths):
				b.WriteString("  " + c)
			default:
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
