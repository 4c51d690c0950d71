package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// DefaultLadder multiplies each workload's default arrival rate: from a
// quarter of it (light load) to four times (well past the point where
// round-robin saturates the default cluster). The Mooncake traces stop at
// twice theirs, as do trace files: round-robin is already past saturation
// at the Mooncake traces' default rate, and a run at four times takes most
// of the sweep's time.
func DefaultLadder(workload string) []float64 {
	if _, file := traceFiles(workload); file || strings.HasPrefix(workload, "mooncake-") {
		return []float64{0.25, 0.5, 1, 2}
	}
	return []float64{0.25, 0.5, 1, 2, 4}
}

// Curve is one workload's sweep: a table per arrival rate.
type Curve struct {
	Name   string  `json:"name"`
	Tables []Table `json:"rates"`
}

// Sweep runs every workload of o at each rate of its ladder, factors of
// the workload's default arrival rate: the given one, or DefaultLadder's
// when it is nil. Closed-loop runs are skipped: the sweep's throughput is
// measured at each offered load.
func Sweep(ctx context.Context, o Options, ladder []float64) ([]Curve, error) {
	if o.Params.Traces == nil {
		o.Params.Traces = new(Traces)
	}
	if len(o.Workloads) == 0 {
		o.Workloads = WorkloadNames()
	}
	o.Clients = 0
	// Every rung of every workload goes into one pool of runs, so a long
	// run of one rung does not leave the other CPUs idle.
	var curves []Curve
	for _, name := range o.Workloads {
		curves = append(curves, Curve{Name: name})
	}
	var err error
	if o.Loads, err = buildLadder(o, ladder); err != nil {
		return nil, err
	}
	rep, err := Bench(ctx, o)
	if err != nil {
		return nil, err
	}
	for _, t := range rep.Workloads {
		for i := range curves {
			if curves[i].Name == t.Name {
				curves[i].Tables = append(curves[i].Tables, t)
			}
		}
	}
	return curves, nil
}

// buildLadder builds each of o's workloads (all when none are named) at
// each factor of ladder times its default arrival rate, DefaultLadder's
// when ladder is nil, workload by workload.
func buildLadder(o Options, ladder []float64) ([]*Workload, error) {
	names := o.Workloads
	if len(names) == 0 {
		names = WorkloadNames()
	}
	var loads []*Workload
	for _, name := range names {
		rungs := ladder
		if rungs == nil {
			rungs = DefaultLadder(name)
		}
		for _, f := range rungs {
			p := o.Params
			p.Rate = f * defaultRate[name]
			w, err := Build(name, p)
			if err != nil {
				return nil, err
			}
			loads = append(loads, w)
		}
	}
	return loads, nil
}

// SweepSeeds runs Sweep once for each seed (the workloads' arrivals and
// prompts, the scrape jitter and the policies' randomness all follow it)
// and merges the runs with MergeSeeds. One seed is one draw of a chaotic
// system: near saturation a policy's TTFT p90 moves by 2x from one seed to
// the next, so a loss on one seed says little until the others agree.
func SweepSeeds(ctx context.Context, o Options, ladder []float64, seeds []uint64) ([]Curve, error) {
	runs := make([][]Curve, 0, len(seeds))
	if o.Params.Traces == nil {
		o.Params.Traces = new(Traces) // every seed replays the same traces
	}
	for _, seed := range seeds {
		o.Params.Seed = seed
		curves, err := Sweep(ctx, o, ladder)
		if err != nil {
			return nil, err
		}
		runs = append(runs, curves)
	}
	return MergeSeeds(runs), nil
}

// MergeSeeds merges sweeps of the same workloads, ladders and policies at
// different seeds: each row holds the median over the seeds of every
// figure, and in TTFTP90s and Throughputs the seeds' own values, in the
// order of runs. One run is returned as it is.
func MergeSeeds(runs [][]Curve) []Curve {
	switch len(runs) {
	case 0:
		return nil
	case 1:
		return runs[0]
	}
	out := make([]Curve, len(runs[0]))
	for ci, c := range runs[0] {
		out[ci] = Curve{Name: c.Name, Tables: make([]Table, len(c.Tables))}
		for ti, t := range c.Tables {
			mt := t
			mt.ttfts = nil
			mt.Results = make([]Row, len(t.Results))
			for ri, r := range t.Results {
				rows := make([]Row, len(runs))
				for k := range runs {
					rows[k] = runs[k][ci].Tables[ti].Results[ri]
				}
				mt.Results[ri] = medianRow(r.Policy, rows)
			}
			out[ci].Tables[ti] = mt
		}
	}
	return out
}

// medianRow is the row of rows' medians, figure by figure.
func medianRow(policy string, rows []Row) Row {
	pick := func(f func(Row) float64) float64 {
		vs := make([]float64, 0, len(rows))
		for _, r := range rows {
			vs = append(vs, f(r))
		}
		return median(vs)
	}
	m := Row{Policy: policy,
		TTFTP50:               pick(func(r Row) float64 { return r.TTFTP50 }),
		TTFTP90:               pick(func(r Row) float64 { return r.TTFTP90 }),
		TTFTP99:               pick(func(r Row) float64 { return r.TTFTP99 }),
		TTFTMean:              pick(func(r Row) float64 { return r.TTFTMean }),
		E2EP50:                pick(func(r Row) float64 { return r.E2EP50 }),
		E2EP99:                pick(func(r Row) float64 { return r.E2EP99 }),
		TPOTP50:               pick(func(r Row) float64 { return r.TPOTP50 }),
		TPOTP90:               pick(func(r Row) float64 { return r.TPOTP90 }),
		Split:                 int(math.Round(pick(func(r Row) float64 { return float64(r.Split) }))),
		Throughput:            pick(func(r Row) float64 { return r.Throughput }),
		HitRate:               pick(func(r Row) float64 { return r.HitRate }),
		Imbalance:             pick(func(r Row) float64 { return r.Imbalance }),
		Refused:               int(math.Round(pick(func(r Row) float64 { return float64(r.Refused) }))),
		Failed:                int(math.Round(pick(func(r Row) float64 { return float64(r.Failed) }))),
		FollowUps:             int(math.Round(pick(func(r Row) float64 { return float64(r.FollowUps) }))),
		FailedFollowUps:       int(math.Round(pick(func(r Row) float64 { return float64(r.FailedFollowUps) }))),
		UnsentTurns:           int(math.Round(pick(func(r Row) float64 { return float64(r.UnsentTurns) }))),
		Saturated:             pick(func(r Row) float64 { return r.Saturated }),
		EstimateError:         pick(func(r Row) float64 { return r.EstimateError }),
		EstimateRatio:         pick(func(r Row) float64 { return r.EstimateRatio }),
		Goodput:               pick(func(r Row) float64 { return r.Goodput }),
		Attainment:            pick(func(r Row) float64 { return r.Attainment }),
		SLO:                   len(rows) > 0 && rows[0].SLO,
		OwnTargets:            len(rows) > 0 && rows[0].OwnTargets,
		InteractiveGoodput:    pick(func(r Row) float64 { return r.InteractiveGoodput }),
		InteractiveAttainment: pick(func(r Row) float64 { return r.InteractiveAttainment }),
	}
	for _, r := range rows {
		m.TTFTP90s = append(m.TTFTP90s, r.TTFTP90)
		m.Throughputs = append(m.Throughputs, r.Throughput)
	}
	return m
}

// median of vs, NaN (a time no request had) ignored; NaN when all are.
func median(vs []float64) float64 {
	vs = slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// WriteSweep prints each workload's TTFT p90 and output tokens/s per
// policy at every rate (and its failed stored follow-ups of those sent,
// for a workload that has them), then the default's worst ratio to each peer over
// the ladder. Merged over seeds (MergeSeeds), the figures are medians, and
// the summary adds the range of the seeds' own ratios where the worst is
// and the seeds at which the default is worse by more than 3% anywhere on
// the ladder.
func WriteSweep(w io.Writer, curves []Curve) {
	for _, c := range curves {
		if len(c.Tables) == 0 {
			continue
		}
		stored := slices.ContainsFunc(c.Tables, Table.hasFollowUps)
		what := "TTFT p90 / output tok/s"
		if stored {
			what += " / failed of stored follow-ups"
		}
		fmt.Fprintf(w, "\n%s: %d servers; %s at each arrival-rate factor\n", c.Name, c.Tables[0].Backends, what)
		head := []string{"policy"}
		for _, t := range c.Tables {
			head = append(head, fmt.Sprintf("x%g", t.Rate))
		}
		rows := [][]string{head}
		for pi, r := range c.Tables[0].Results {
			row := []string{r.Policy}
			for _, t := range c.Tables {
				x := t.Results[pi]
				cell := fmt.Sprintf("%s / %.0f", secs(x.TTFTP90), x.Throughput)
				if stored {
					cell += " / " + followUps(x)
				}
				row = append(row, cell)
			}
			rows = append(rows, row)
		}
		writeAligned(w, rows)
		if slices.ContainsFunc(c.Tables, Table.hasSLO) {
			writeAttainment(w, c)
		}
	}
	seeds := 0
	if len(curves) > 0 && len(curves[0].Tables) > 0 && len(curves[0].Tables[0].Results) > 0 {
		seeds = len(curves[0].Tables[0].Results[0].TTFTP90s)
	}
	if seeds > 1 {
		fmt.Fprintf(w, "\nsummary over %d seeds: the default's worst ratio of medians to each policy over the ladder (TTFT p90 default/peer, above 1 is worse; output tok/s default/peer, below 1 is worse), the seeds' own ratios at that rate, and how many seeds the default is worse than the policy by more than 3%% at some rate\n", seeds)
		if seeds >= minPaired {
			fmt.Fprintf(w, "paired: at the same rates, the median of the seeds' own ratios (each seed runs both policies on the same arrivals) and its 95%% bootstrap interval; an interval that holds 1 is a gap the seeds do not tell from noise\n")
		}
	} else {
		fmt.Fprintf(w, "\nsummary: the default's worst ratio to each policy over the ladder (TTFT p90 default/peer, above 1 is worse; output tok/s default/peer, below 1 is worse)\n")
	}
	head := []string{"workload", "policy", "worst TTFT p90 ratio", "at", "worst tok/s ratio", "at"}
	if seeds > 1 {
		head = []string{"workload", "policy", "worst TTFT p90 ratio", "seeds", "at", "worst tok/s ratio", "seeds", "at", "seeds worse"}
	}
	paired := seeds >= minPaired
	if paired {
		head = append(head, "paired TTFT p90 (95%)", "paired tok/s (95%)")
	}
	rows := [][]string{head}
	for _, c := range curves {
		for pi, r := range c.Tables[0].Results {
			if pi == 0 {
				continue
			}
			worstT, worstR, atT, atR := math.Inf(-1), math.Inf(1), 0, 0
			worse := make([]bool, seeds)
			for ti, t := range c.Tables {
				d, p := t.Results[0], t.Results[pi]
				if v := d.TTFTP90 / p.TTFTP90; v > worstT {
					worstT, atT = v, ti
				}
				if v := d.Throughput / p.Throughput; v < worstR {
					worstR, atR = v, ti
				}
				for k := range worse {
					dt, pt := d.TTFTP90s[k], p.TTFTP90s[k]
					// No first token at all (NaN) is worse than any.
					if dt/pt > 1.03 || math.IsNaN(dt) && !math.IsNaN(pt) || d.Throughputs[k]/p.Throughputs[k] < 0.97 {
						worse[k] = true
					}
				}
			}
			row := []string{c.Name, r.Policy, fmt.Sprintf("%.2f", worstT)}
			if seeds > 1 {
				row = append(row, seedRatios(c.Tables[atT], pi, func(r Row) []float64 { return r.TTFTP90s }))
			}
			row = append(row, fmt.Sprintf("x%g", c.Tables[atT].Rate), fmt.Sprintf("%.2f", worstR))
			if seeds > 1 {
				row = append(row, seedRatios(c.Tables[atR], pi, func(r Row) []float64 { return r.Throughputs }))
			}
			row = append(row, fmt.Sprintf("x%g", c.Tables[atR].Rate))
			if seeds > 1 {
				n := 0
				for _, b := range worse {
					if b {
						n++
					}
				}
				row = append(row, fmt.Sprintf("%d of %d", n, seeds))
			}
			if paired {
				row = append(row, pairedCell(c.Tables[atT], pi, func(r Row) []float64 { return r.TTFTP90s }),
					pairedCell(c.Tables[atR], pi, func(r Row) []float64 { return r.Throughputs }))
			}
			rows = append(rows, row)
		}
	}
	writeAligned(w, rows)
}

// attainmentGoal is the share of requests meeting their SLO targets at
// which a policy sustains a rate, the serving papers' usual 90%
// (DistServe, Zhong et al., OSDI 2024).
const attainmentGoal = 0.9

// writeAttainment prints a curve's goodput and attainment per policy at
// every rate, and the highest rate of the ladder up to which each policy
// attains attainmentGoal at every rate.
//
// For a workload whose requests carry their own targets, each cell adds
// the interactive class's attainment (the requests with targets), and a
// second column the rate each policy sustains at 90% of those.
func writeAttainment(w io.Writer, c Curve) {
	own := slices.ContainsFunc(c.Tables, Table.hasOwnTargets)
	what := "goodput / attained"
	if own {
		what += " / interactive attained"
	}
	fmt.Fprintf(w, "\n%s: %s at each arrival-rate factor, and the rate each policy sustains at %.0f%% attained\n", c.Name, what, 100*attainmentGoal)
	head := []string{"policy"}
	for _, t := range c.Tables {
		head = append(head, fmt.Sprintf("x%g", t.Rate))
	}
	head = append(head, "sustains")
	if own {
		head = append(head, "interactive sustains")
	}
	rows := [][]string{head}
	for pi, r := range c.Tables[0].Results {
		row := []string{r.Policy}
		sustains, ok := "-", true
		inter, iok := "-", true
		for _, t := range c.Tables {
			x := t.Results[pi]
			cell := fmt.Sprintf("%.1f/s / %.1f%%", x.Goodput, 100*x.Attainment)
			if own {
				cell += fmt.Sprintf(" / %.1f%%", 100*x.InteractiveAttainment)
			}
			row = append(row, cell)
			if ok = ok && x.Attainment >= attainmentGoal; ok {
				sustains = fmt.Sprintf("x%g", t.Rate)
			}
			if iok = iok && x.InteractiveAttainment >= attainmentGoal; iok {
				inter = fmt.Sprintf("x%g", t.Rate)
			}
		}
		row = append(row, sustains)
		if own {
			row = append(row, inter)
		}
		rows = append(rows, row)
	}
	writeAligned(w, rows)
}

// seedRatios is the range of the default's ratio to row pi's policy over
// the seeds, "lo-hi", in table t.
func seedRatios(t Table, pi int, of func(Row) []float64) string {
	d, p := of(t.Results[0]), of(t.Results[pi])
	lo, hi := math.Inf(1), math.Inf(-1)
	for k := range d {
		v := d[k] / p[k]
		if math.IsNaN(v) {
			continue
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo > hi {
		return "-"
	}
	return fmt.Sprintf("%.2f-%.2f", lo, hi)
}

// minPaired is the fewest seeds the summary gives a paired interval for.
const minPaired = 8

// pairedCell is pairedRatio of the default's and row pi's values in t,
// "median (lo-hi)", or "-" when too few seeds have both.
func pairedCell(t Table, pi int, of func(Row) []float64) string {
	med, lo, hi, ok := pairedRatio(of(t.Results[0]), of(t.Results[pi]))
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.3f (%.3f-%.3f)", med, lo, hi)
}

// pairedRatio is the median over seeds of d[k]/p[k], the default's figure
// over a peer's at one seed (both replayed the same arrivals, so the
// seed's luck is in both and divides out), with a 95% percentile
// bootstrap interval of that median: 2,000 resamples of the seeds drawn
// with a fixed seed, so a run prints the same interval twice. A seed at
// which either value is missing (NaN) or the peer's is 0 is left out; ok
// is false when fewer than minPaired remain.
func pairedRatio(d, p []float64) (med, lo, hi float64, ok bool) {
	var rs []float64
	for k := range min(len(d), len(p)) {
		if v := d[k] / p[k]; !math.IsNaN(v) && !math.IsInf(v, 0) {
			rs = append(rs, v)
		}
	}
	if len(rs) < minPaired {
		return 0, 0, 0, false
	}
	const resamples = 2000
	rng := rand.New(rand.NewPCG(1, 2))
	meds := make([]float64, resamples)
	buf := make([]float64, len(rs))
	for i := range meds {
		for j := range buf {
			buf[j] = rs[rng.IntN(len(rs))]
		}
		meds[i] = median(buf)
	}
	slices.Sort(meds)
	return median(rs), meds[resamples*25/1000], meds[resamples*975/1000-1], true
}

// PlotSweep draws one PNG per workload, prefix + "-" + workload + ".png":
// TTFT p90 against the arrival rate and output tokens/s against it, one
// line per policy.
func PlotSweep(prefix string, curves []Curve) ([]string, error) {
	var files []string
	for _, c := range curves {
		if len(c.Tables) == 0 {
			continue
		}
		pl := [][]*plot.Plot{{plot.New(), plot.New()}}
		lat, tput := pl[0][0], pl[0][1]
		lat.Title.Text = c.Name + ": TTFT p90"
		lat.Y.Label.Text = "TTFT p90 (s)"
		lat.Y.Scale = plot.LogScale{}
		lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		tput.Title.Text = c.Name + ": output tokens/s"
		tput.Y.Label.Text = "output tokens/s"
		for _, p := range []*plot.Plot{lat, tput} {
			p.X.Label.Text = "arrival rate (x the workload's)"
			p.Legend.Top, p.Legend.Left = true, true
		}
		for pi, r := range c.Tables[0].Results {
			var lp, tp plotter.XYs
			for _, t := range c.Tables {
				x := t.Results[pi]
				if !math.IsNaN(x.TTFTP90) {
					lp = append(lp, plotter.XY{X: t.Rate, Y: math.Max(x.TTFTP90, 1e-3)})
				}
				tp = append(tp, plotter.XY{X: t.Rate, Y: x.Throughput})
			}
			for k, pts := range []plotter.XYs{lp, tp} {
				if len(pts) == 0 {
					continue
				}
				l, err := plotter.NewLine(pts)
				if err != nil {
					return files, err
				}
				style(&l.LineStyle, pi)
				if pi == 0 {
					l.Width = vg.Points(2.5)
				}
				p := []*plot.Plot{lat, tput}[k]
				p.Add(l)
				if k == 0 {
					p.Legend.Add(r.Policy, l)
				}
			}
		}
		const w, h = 7 * vg.Inch, 4.5 * vg.Inch
		img := vgimg.New(2*w, h)
		dc := draw.New(img)
		tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
		canvases := plot.Align(pl, tiles, dc)
		lat.Draw(canvases[0][0])
		tput.Draw(canvases[0][1])
		file := prefix + "-" + c.Name + ".png"
		if err := savePNG(file, img); err != nil {
			return files, err
		}
		files = append(files, file)
	}
	return files, nil
}

// ReplicaRow compares one policy at R replicas against one, and with a
// shared ledger against R independent ones.
type ReplicaRow struct {
	Workload   string  `json:"workload"`
	Policy     string  `json:"policy"`
	Rate       float64 `json:"rate"` // the workload's arrival-rate factor
	Replicas   int     `json:"replicas"`
	HitRate1   float64 `json:"hit_rate_1"`
	HitRateR   float64 `json:"hit_rate_r"`
	TTFTP901   float64 `json:"ttft_p90_1"`
	TTFTP90R   float64 `json:"ttft_p90_r"`
	Throughput float64 `json:"output_tokens_per_s_1"`
	ThroughR   float64 `json:"output_tokens_per_s_r"`
	// SharedLedger is the interval at which the R replicas of the
	// Shared figures shared their ledgers ([Cluster.SharedLedger]); zero,
	// and the Shared figures absent, when they were not run.
	SharedLedger  time.Duration `json:"shared_ledger_ns,omitempty"`
	HitRateShared float64       `json:"hit_rate_shared,omitempty"`
	TTFTP90Shared float64       `json:"ttft_p90_shared,omitempty"`
	ThroughShared float64       `json:"output_tokens_per_s_shared,omitempty"`
}

// Replicas runs o once with one balancer and once with r independent
// ones and pairs each policy's rows; with o.SharedLedger positive, also
// once with r replicas sharing their ledgers at that interval.
func Replicas(ctx context.Context, o Options, r int) ([]ReplicaRow, error) {
	o.Clients = 0
	shared := o.SharedLedger
	o.Replicas, o.SharedLedger = 1, 0
	one, err := Bench(ctx, o)
	if err != nil {
		return nil, err
	}
	o.Replicas = r
	many, err := Bench(ctx, o)
	if err != nil {
		return nil, err
	}
	var sharing Report
	if shared > 0 {
		o.SharedLedger = shared
		if sharing, err = Bench(ctx, o); err != nil {
			return nil, err
		}
	}
	var out []ReplicaRow
	for wi, t := range one.Workloads {
		for pi, a := range t.Results {
			b := many.Workloads[wi].Results[pi]
			row := ReplicaRow{Workload: t.Name, Policy: a.Policy, Rate: t.Rate, Replicas: r, HitRate1: a.HitRate, HitRateR: b.HitRate,
				TTFTP901: a.TTFTP90, TTFTP90R: b.TTFTP90, Throughput: a.Throughput, ThroughR: b.Throughput}
			if shared > 0 {
				s := sharing.Workloads[wi].Results[pi]
				row.SharedLedger, row.HitRateShared, row.TTFTP90Shared, row.ThroughShared = shared, s.HitRate, s.TTFTP90, s.Throughput
			}
			out = append(out, row)
		}
	}
	return out, nil
}

// WriteReplicas prints the replica table: hit rate, TTFT p90 and output
// tokens/s at one replica and at R, and the share of one's hit rate R
// keep; with a shared ledger, each figure also at R replicas sharing it.
func WriteReplicas(w io.Writer, rows []ReplicaRow) {
	if len(rows) == 0 {
		return
	}
	r, shared := rows[0].Replicas, rows[0].SharedLedger
	n, s := fmt.Sprint(r), fmt.Sprintf("%d shared", r)
	if shared == 0 {
		fmt.Fprintf(w, "\nreplicas: %d independent balancers against one (each arrival to one at random)\n", r)
	} else {
		fmt.Fprintf(w, "\nreplicas: one balancer, %d independent and %[1]d sharing their ledgers every %[2]v (%[3]s), each arrival to one at random; kept is the share of one's hit rate\n", r, shared, s)
	}
	// cols are the column heads of one figure: at one, at R, and at R
	// shared when there is a shared ledger.
	cols := func(what string) []string {
		if shared == 0 {
			return []string{what + " 1", what + " " + n}
		}
		return []string{what + " 1", n, s}
	}
	head := []string{"workload", "rate", "policy"}
	head = append(head, cols("hit rate")...)
	head = append(head, "kept")
	if shared > 0 {
		head = append(head, "kept "+s)
	}
	head = append(head, cols("ttft p90")...)
	head = append(head, cols("tok/s")...)
	out := [][]string{head}
	kept := func(hit, one float64) string {
		if one > 0 {
			return fmt.Sprintf("%.2f", hit/one)
		}
		return "-"
	}
	for _, x := range rows {
		cells := func(one, many, sh string) []string {
			if shared == 0 {
				return []string{one, many}
			}
			return []string{one, many, sh}
		}
		pct := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
		tok := func(v float64) string { return fmt.Sprintf("%.0f", v) }
		row := []string{x.Workload, fmt.Sprintf("x%g", x.Rate), x.Policy}
		row = append(row, cells(pct(x.HitRate1), pct(x.HitRateR), pct(x.HitRateShared))...)
		row = append(row, kept(x.HitRateR, x.HitRate1))
		if shared > 0 {
			row = append(row, kept(x.HitRateShared, x.HitRate1))
		}
		row = append(row, cells(secs(x.TTFTP901), secs(x.TTFTP90R), secs(x.TTFTP90Shared))...)
		row = append(row, cells(tok(x.Throughput), tok(x.ThroughR), tok(x.ThroughShared))...)
		out = append(out, row)
	}
	writeAligned(w, out)
}
