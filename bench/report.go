package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Row is one policy's line of a workload's table, as `--json` writes it.
// Times are seconds.
type Row struct {
	Policy  string  `json:"policy"`
	TTFTP50 float64 `json:"ttft_p50"`
	TTFTP90 float64 `json:"ttft_p90"`
	TTFTP99 float64 `json:"ttft_p99"`
	// TTFTMean is the mean time to first token: a percentile alone can
	// sit on the step between two kinds of request (where misses are a
	// tenth of the requests, the p90 is the fastest misses' time or the
	// slowest hits').
	TTFTMean float64 `json:"ttft_mean"`
	E2EP50   float64 `json:"e2e_p50"`
	E2EP99   float64 `json:"e2e_p99"`
	// TPOTP50 and TPOTP90 are quantiles of the time per output token
	// after the first, over requests of two tokens or more.
	TPOTP50 float64 `json:"tpot_p50"`
	TPOTP90 float64 `json:"tpot_p90"`
	// Split is the requests that took a prefill leg ([Result.Split]).
	Split int `json:"split,omitempty"`
	// EstimateError is the median of each request's |estimated TTFT -
	// observed| / observed, from the pick, and EstimateRatio the median
	// estimated / observed (below 1: the estimate is short); 0 for a
	// policy that estimates no TTFT.
	EstimateError float64 `json:"ttft_estimate_error_p50,omitempty"`
	EstimateRatio float64 `json:"ttft_estimate_ratio_p50,omitempty"`
	// Goodput is, with SLO targets (--slo-ttft, --slo-tpot), the requests
	// that met them per second, and Attainment their share of the
	// requests sent (a refused or failed one missed them); SLO says the
	// targets were set.
	Goodput    float64 `json:"goodput_per_s,omitempty"`
	Attainment float64 `json:"attainment,omitempty"`
	SLO        bool    `json:"slo,omitempty"`
	// OwnTargets: the workload's requests carry their own targets, each
	// judged by its own (a request without any meets them if served:
	// [Request.SLO]); InteractiveGoodput and InteractiveAttainment are
	// then the goodput and attainment of the requests that carry targets
	// alone (slo-mixed's interactive class).
	OwnTargets            bool    `json:"own_targets,omitempty"`
	InteractiveGoodput    float64 `json:"interactive_goodput_per_s,omitempty"`
	InteractiveAttainment float64 `json:"interactive_attainment,omitempty"`
	Throughput            float64 `json:"output_tokens_per_s"`
	HitRate               float64 `json:"hit_rate"`
	Imbalance             float64 `json:"imbalance"`
	Refused               int     `json:"refused"`
	Failed                int     `json:"failed"`
	// FollowUps is the stored follow-ups sent, FailedFollowUps those that
	// reached a server not storing the response they continue (a 404,
	// counted in neither Refused nor Failed), and UnsentTurns the later
	// turns of sessions that ended at a turn not answered ([Result]).
	FollowUps       int `json:"stored_follow_ups"`
	FailedFollowUps int `json:"failed_follow_ups"`
	UnsentTurns     int `json:"unsent_turns"`
	// Saturated is the output tokens per second of the closed-loop run
	// (Options.Clients); 0 when there was none.
	Saturated float64 `json:"saturated_output_tokens_per_s,omitempty"`
	// TTFTP90s and Throughputs are each seed's own figures when the row
	// is the median of several (MergeSeeds); nil for one run.
	TTFTP90s    []float64 `json:"ttft_p90_by_seed,omitempty"`
	Throughputs []float64 `json:"output_tokens_per_s_by_seed,omitempty"`
}

// Table is one workload's results.
type Table struct {
	Name     string  `json:"name"`
	Backends int     `json:"backends"`
	Requests int     `json:"requests"`
	Rate     float64 `json:"rate"`
	// Clients is the closed-loop clients of the Saturated column; 0 when
	// it was not run.
	Clients int   `json:"clients,omitempty"`
	Results []Row `json:"results"`
	// PD: the rows compare disaggregated prefill/decode with the servers
	// aggregated ([Options.Prefill]).
	PD bool `json:"pd,omitempty"`

	ttfts [][]time.Duration // each row's sorted TTFTs, for Plot
}

// Report is every workload's table.
type Report struct {
	Workloads []Table `json:"workloads"`
}

// Quantile returns the q-quantile of sorted ds (nearest rank), in seconds.
func Quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))].Seconds()
}

// mean returns the mean of ds in seconds, NaN for none.
func mean(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum.Seconds() / float64(len(ds))
}

// Summarize turns a Result into a Row. Imbalance is the busiest server's
// requests over the mean (1 is perfectly even).
func Summarize(r Result) Row {
	ttft, e2e, tpot := slices.Clone(r.TTFT), slices.Clone(r.E2E), slices.Clone(r.TPOT)
	slices.Sort(ttft)
	slices.Sort(e2e)
	slices.Sort(tpot)
	row := Row{
		Policy: r.Policy, Refused: r.Refused, Failed: r.Failed,
		FollowUps: r.FollowUps, FailedFollowUps: r.FailedFollowUps, UnsentTurns: r.Unsent,
		TTFTP50: Quantile(ttft, .5), TTFTP90: Quantile(ttft, .9), TTFTP99: Quantile(ttft, .99),
		TTFTMean: mean(ttft),
		E2EP50:   Quantile(e2e, .5), E2EP99: Quantile(e2e, .99),
		TPOTP50: Quantile(tpot, .5), TPOTP90: Quantile(tpot, .9), Split: r.Split,
	}
	if r.Duration > 0 {
		row.Throughput = float64(r.OutputTokens) / r.Duration.Seconds()
	}
	if r.PromptTokens > 0 {
		row.HitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	if r.judged() {
		row.SLO, row.OwnTargets = true, r.OwnTargets
		if r.Duration > 0 {
			row.Goodput = float64(r.Met) / r.Duration.Seconds()
			row.InteractiveGoodput = float64(r.TargetedMet) / r.Duration.Seconds()
		}
		if sent := len(r.TTFT) + r.Refused + r.Failed; sent > 0 {
			row.Attainment = float64(r.Met) / float64(sent)
		}
		if r.Targeted > 0 {
			row.InteractiveAttainment = float64(r.TargetedMet) / float64(r.Targeted)
		}
	}
	if n := len(r.EstimateRatios); n > 0 {
		ratios, errs := slices.Clone(r.EstimateRatios), make([]float64, n)
		for i, x := range ratios {
			errs[i] = math.Abs(x - 1)
		}
		slices.Sort(ratios)
		slices.Sort(errs)
		row.EstimateRatio, row.EstimateError = ratios[n/2], errs[n/2]
	}
	total, most := 0, 0
	for _, n := range r.PerBackend {
		total += n
		most = max(most, n)
	}
	if total > 0 {
		row.Imbalance = float64(most) / (float64(total) / float64(len(r.PerBackend)))
	}
	return row
}

// WriteTable prints t as an aligned text table.
func WriteTable(w io.Writer, t Table) {
	fmt.Fprintf(w, "\n%s: %d requests, %d servers, rate x%g", t.Name, t.Requests, t.Backends, t.Rate)
	if t.Clients > 0 {
		fmt.Fprintf(w, "; saturated: %d clients, closed loop", t.Clients)
	}
	fmt.Fprintln(w)
	head := []string{"policy", "ttft p50", "p90", "p99", "e2e p50", "p99", "out tok/s", "hit rate", "imbalance", "refused", "failed"}
	if t.PD {
		head = []string{"servers, P/D decision", "ttft p50", "p90", "p99", "tpot p50", "p90", "e2e p99", "out tok/s", "hit rate", "split", "refused", "failed"}
	}
	stored := t.hasFollowUps()
	if stored {
		head = append(head, "failed follow-ups", "unsent turns")
	}
	slo, own := t.hasSLO(), t.hasOwnTargets()
	if slo {
		head = append(head, "goodput", "attained")
	}
	if own {
		head = append(head, "interactive goodput", "attained")
	}
	estimated := t.hasEstimates()
	if estimated {
		head = append(head, "ttft est err", "est/obs")
	}
	if t.Clients > 0 {
		head = append(head, "saturated tok/s")
	}
	rows := [][]string{head}
	for _, r := range t.Results {
		row := []string{r.Policy, secs(r.TTFTP50), secs(r.TTFTP90), secs(r.TTFTP99), secs(r.E2EP50), secs(r.E2EP99),
			fmt.Sprintf("%.0f", r.Throughput), fmt.Sprintf("%.1f%%", 100*r.HitRate), fmt.Sprintf("%.2f", r.Imbalance),
			fmt.Sprint(r.Refused), fmt.Sprint(r.Failed)}
		if t.PD {
			row = []string{r.Policy, secs(r.TTFTP50), secs(r.TTFTP90), secs(r.TTFTP99), secs(r.TPOTP50), secs(r.TPOTP90), secs(r.E2EP99),
				fmt.Sprintf("%.0f", r.Throughput), fmt.Sprintf("%.1f%%", 100*r.HitRate), fmt.Sprint(r.Split), fmt.Sprint(r.Refused), fmt.Sprint(r.Failed)}
		}
		if stored {
			row = append(row, followUps(r), fmt.Sprint(r.UnsentTurns))
		}
		if slo {
			row = append(row, fmt.Sprintf("%.1f/s", r.Goodput), fmt.Sprintf("%.1f%%", 100*r.Attainment))
		}
		if own {
			row = append(row, fmt.Sprintf("%.1f/s", r.InteractiveGoodput), fmt.Sprintf("%.1f%%", 100*r.InteractiveAttainment))
		}
		if estimated {
			row = append(row, "-", "-")
			if r.EstimateRatio > 0 {
				row[len(row)-2], row[len(row)-1] = fmt.Sprintf("%.0f%%", 100*r.EstimateError), fmt.Sprintf("%.2f", r.EstimateRatio)
			}
		}
		if t.Clients > 0 {
			row = append(row, fmt.Sprintf("%.0f", r.Saturated))
		}
		rows = append(rows, row)
	}
	writeAligned(w, rows)
}

// hasFollowUps reports whether some row sent stored follow-ups; only then
// does a table show the columns that count them.
func (t Table) hasFollowUps() bool {
	for _, r := range t.Results {
		if r.FollowUps > 0 {
			return true
		}
	}
	return false
}

// hasSLO reports whether the rows were judged against SLO targets.
func (t Table) hasSLO() bool {
	return len(t.Results) > 0 && t.Results[0].SLO
}

// hasOwnTargets reports whether the workload's requests carried their
// own targets, so that the table shows the interactive class apart.
func (t Table) hasOwnTargets() bool {
	return len(t.Results) > 0 && t.Results[0].OwnTargets
}

// hasEstimates reports whether some row's policy estimated TTFT; only
// then does a table show how far the estimates were from the first
// tokens.
func (t Table) hasEstimates() bool {
	for _, r := range t.Results {
		if r.EstimateRatio > 0 {
			return true
		}
	}
	return false
}

// followUps is r's failed stored follow-ups of those sent, "failed/sent".
func followUps(r Row) string { return fmt.Sprintf("%d/%d", r.FailedFollowUps, r.FollowUps) }

func secs(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	if s < 1 {
		return fmt.Sprintf("%.0fms", s*1000)
	}
	return fmt.Sprintf("%.2fs", s)
}

// MarshalJSON writes the row with null for a time no request had (NaN).
func (r Row) MarshalJSON() ([]byte, error) {
	num := func(v float64) any {
		if math.IsNaN(v) {
			return nil
		}
		return v
	}
	var p90s []any
	for _, v := range r.TTFTP90s {
		p90s = append(p90s, num(v))
	}
	// The times are written in place of the embedded row's own fields of
	// the same names (the shallower field wins).
	type plain Row
	return json.Marshal(struct {
		plain
		TTFTP50  any   `json:"ttft_p50"`
		TTFTP90  any   `json:"ttft_p90"`
		TTFTP99  any   `json:"ttft_p99"`
		TTFTMean any   `json:"ttft_mean"`
		E2EP50   any   `json:"e2e_p50"`
		E2EP99   any   `json:"e2e_p99"`
		TPOTP50  any   `json:"tpot_p50"`
		TPOTP90  any   `json:"tpot_p90"`
		TTFTP90s []any `json:"ttft_p90_by_seed,omitempty"`
	}{plain(r), num(r.TTFTP50), num(r.TTFTP90), num(r.TTFTP99), num(r.TTFTMean), num(r.E2EP50), num(r.E2EP99), num(r.TPOTP50), num(r.TPOTP90), p90s})
}

// WriteJSON writes the report as the --json file.
func WriteJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// NewTable is the table of one or more results of workload w, in order, on
// a cluster of the given number of backends.
func NewTable(w *Workload, backends int, results ...Result) Table {
	t := Table{Name: w.Name, Backends: backends, Requests: len(w.Requests), Rate: w.Rate}
	for _, r := range results {
		t.Results = append(t.Results, Summarize(r))
		ttft := slices.Clone(r.TTFT)
		slices.Sort(ttft)
		t.ttfts = append(t.ttfts, ttft)
	}
	return t
}

// writeAligned prints rows as a table: the first column left-aligned, the
// others right-aligned, each as wide as its widest cell.
func writeAligned(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", widths[i], c)
			} else {
				fmt.Fprintf(&b, "  %*s", widths[i], c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}
