package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// CalibrateOptions is one `llmlb bench --trace FILE --calibrate`: fit the
// emulated engine's costs to what a capture observed.
type CalibrateOptions struct {
	// Workload is the capture's ([TraceWorkload]).
	Workload string
	// Backends is the servers (0: as many as the capture names), Slow of
	// them on the slower preset (as [Command.Slow]), EngineModel how they
	// schedule.
	Backends, Slow int
	EngineModel    string
	// Scale fits to the capture's first share (0: all of it), as --scale
	// cuts a trace.
	Scale    float64
	Seed     uint64
	Traces   *Traces
	Progress io.Writer
}

// Calibration is the fit: the factors of the preset's costs that make the
// emulated servers answer the capture's requests as its servers did, and
// the TTFT and TPOT percentiles of the capture, of the preset and of the
// fitted model.
type Calibration struct {
	Workload string   `json:"workload"`
	Requests int      `json:"requests"` // replayed
	Timed    int      `json:"timed"`    // of those, with a TTFT observed
	Presets  []string `json:"presets"`
	Model    string   `json:"engine_model"`
	// Fit is the fitted costs as --perturb takes them: prefill, request
	// and decode, each a factor of the preset's time.
	Fit  Perturb          `json:"fit"`
	Rows []CalibrationRow `json:"rows"`
	Runs int              `json:"runs"`
}

// CalibrationRow is one model's (or the capture's) figures over the
// requests with a TTFT observed.
type CalibrationRow struct {
	Name    string  `json:"name"`
	TTFTP50 float64 `json:"ttft_p50"`
	TTFTP90 float64 `json:"ttft_p90"`
	TTFTP99 float64 `json:"ttft_p99"`
	TPOTP50 float64 `json:"tpot_p50"`
	TPOTP90 float64 `json:"tpot_p90"`
	// Error is the median over the requests of |modelled TTFT /
	// observed - 1|; 0 for the capture's own row.
	Error float64 `json:"ttft_error_p50"`
}

// observed is one captured request's times, for the fit.
type observed struct {
	i          int // its index in the workload
	ttft, tpot time.Duration
}

// Calibrate fits the engine model to a capture. Each request goes to the
// server standing for the backend that answered it live ([Cluster.Pinned]),
// so that a request's modelled time is set against its own observed one;
// the fit minimises the mean squared log ratio of modelled to observed
// TTFT over the prefill and request costs, then of TPOT over the decode
// cost, one at a time by golden-section search on a log scale (a fifth to
// five times the preset's), twice over.
func Calibrate(ctx context.Context, o CalibrateOptions) (Calibration, error) {
	files, ok := traceFiles(o.Workload)
	if !ok {
		return Calibration{}, fmt.Errorf("bench: --calibrate fits a capture: give --trace FILE")
	}
	if err := checkEngineModel(o.EngineModel); err != nil {
		return Calibration{}, err
	}
	if o.Traces == nil {
		o.Traces = new(Traces)
	}
	w, err := Build(o.Workload, Params{Traces: o.Traces, Seed: o.Seed, Scale: o.Scale})
	if err != nil {
		return Calibration{}, err
	}
	ft, err := o.Traces.loadFiles(files)
	if err != nil {
		return Calibration{}, err
	}
	lines := ft.lines[:len(w.Requests)] // Build cut them alike
	var obs []observed
	backends := map[string]bool{}
	for i, t := range lines {
		if t.Backend != "" {
			backends[t.Backend] = true
		}
		if t.Status != 200 || t.TTFTms <= 0 {
			continue
		}
		ob := observed{i: i, ttft: time.Duration(t.TTFTms * float64(time.Millisecond))}
		if t.OutputLength >= 2 && t.DurationMs > t.TTFTms {
			ob.tpot = time.Duration((t.DurationMs - t.TTFTms) / float64(t.OutputLength-1) * float64(time.Millisecond))
		}
		obs = append(obs, ob)
	}
	if len(obs) < 10 {
		return Calibration{}, fmt.Errorf("bench: --calibrate: %d requests of the capture have a TTFT (streamed, answered 200); at least 10 are needed", len(obs))
	}
	n := cmp.Or(o.Backends, len(backends), 1)
	cal := Calibration{Workload: o.Workload, Requests: len(w.Requests), Timed: len(obs), Presets: serverPresets(o.EngineModel, n, o.Slow),
		Model: cmp.Or(o.EngineModel, VLLMV1)}
	runs := map[Perturb][]RequestTimes{}
	run := func(p Perturb) ([]RequestTimes, error) {
		if t, ok := runs[p]; ok {
			return t, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		res, err := Run(Cluster{Presets: cal.Presets, EngineModel: o.EngineModel, Policy: DefaultPolicy, Seed: o.Seed, Perturb: p, Pinned: true}, w)
		if err != nil {
			return nil, err
		}
		runs[p] = res.ByRequest
		return res.ByRequest, nil
	}
	// cost is the mean squared log ratio of modelled to observed times,
	// TTFT or TPOT; a request the model did not serve counts as ten times
	// off.
	cost := func(p Perturb, tpot bool) (float64, error) {
		times, err := run(p)
		if err != nil {
			return 0, err
		}
		var sum float64
		k := 0
		for _, ob := range obs {
			want, got := ob.ttft, times[ob.i].TTFT
			if tpot {
				want, got = ob.tpot, times[ob.i].TPOT
				if want <= 0 {
					continue
				}
			}
			d := math.Log(10)
			if got > 0 {
				d = math.Log(float64(got) / float64(want))
			}
			sum += d * d
			k++
		}
		if k == 0 {
			return 0, nil
		}
		return sum / float64(k), nil
	}
	// Prefill and request costs trade against each other along a narrow
	// valley, which a search one cost at a time crawls along: they are
	// fitted together (Nelder-Mead on their logs), the decode cost, which
	// the TTFT hardly sees, on its own, then the first two again.
	fit := Perturb{Prefill: 1, Request: 1, Decode: 1}
	fitFirst := func() error {
		x, err := nelderMead(func(u []float64) (float64, error) {
			p := fit
			p.Prefill, p.Request = factorOf(u[0]), factorOf(u[1])
			return cost(p, false)
		}, []float64{math.Log(fit.Prefill), math.Log(fit.Request)}, 0.5, 0.002, 150)
		fit.Prefill, fit.Request = factorOf(x[0]), factorOf(x[1])
		return err
	}
	for step := range 3 {
		var err error
		switch step {
		case 1:
			fit.Decode, err = goldenLog(func(x float64) (float64, error) {
				p := fit
				p.Decode = x
				return cost(p, true)
			}, 0.2, 5)
		default:
			err = fitFirst()
		}
		if err != nil {
			return cal, err
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "calibrate: %s after %d runs\n", fit, len(runs))
		}
	}
	cal.Fit, cal.Runs = fit, len(runs)
	cal.Rows = append(cal.Rows, summarizeTimes("captured", obs, nil))
	for _, m := range []struct {
		name string
		p    Perturb
	}{{"preset", Perturb{}}, {"fitted", fit}} {
		times, err := run(m.p)
		if err != nil {
			return cal, err
		}
		cal.Rows = append(cal.Rows, summarizeTimes(m.name, obs, times))
	}
	return cal, nil
}

// factorOf is the factor of log u, kept to a fifth to five times and
// rounded to 0.1%, so that equal factors reuse a run.
func factorOf(u float64) float64 { return rounded(math.Exp(max(math.Log(0.2), min(math.Log(5), u)))) }

// rounded is x to 0.1%, so that factors a search finds equal reuse a run.
func rounded(x float64) float64 { return math.Round(x*1000) / 1000 }

// nelderMead returns a point near the minimum of f from x0, by the
// Nelder-Mead simplex with a first step of step in each coordinate, until
// the simplex's values are within tol of each other or after at most n
// evaluations.
func nelderMead(f func([]float64) (float64, error), x0 []float64, step, tol float64, n int) ([]float64, error) {
	d := len(x0)
	pts := make([][]float64, d+1)
	vals := make([]float64, d+1)
	evals := 0
	eval := func(x []float64) (float64, error) { evals++; return f(x) }
	for i := range pts {
		pts[i] = slices.Clone(x0)
		if i > 0 {
			pts[i][i-1] += step
		}
		v, err := eval(pts[i])
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	along := func(c, x []float64, t float64) []float64 { // c + t(x - c)
		out := make([]float64, d)
		for k := range out {
			out[k] = c[k] + t*(x[k]-c[k])
		}
		return out
	}
	for evals < n {
		idx := make([]int, d+1) // best first
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(vals[a], vals[b]) })
		sp, sv := make([][]float64, d+1), make([]float64, d+1)
		for i, j := range idx {
			sp[i], sv[i] = pts[j], vals[j]
		}
		pts, vals = sp, sv
		if vals[d]-vals[0] <= tol {
			break
		}
		c := make([]float64, d) // the centroid of all but the worst
		for _, p := range pts[:d] {
			for k := range c {
				c[k] += p[k] / float64(d)
			}
		}
		r := along(c, pts[d], -1)
		fr, err := eval(r)
		if err != nil {
			return nil, err
		}
		switch {
		case fr < vals[0]:
			e := along(c, pts[d], -2)
			fe, err := eval(e)
			if err != nil {
				return nil, err
			}
			if fe < fr {
				pts[d], vals[d] = e, fe
			} else {
				pts[d], vals[d] = r, fr
			}
		case fr < vals[d-1]:
			pts[d], vals[d] = r, fr
		default:
			k := along(c, pts[d], 0.5)
			fk, err := eval(k)
			if err != nil {
				return nil, err
			}
			if fk < vals[d] {
				pts[d], vals[d] = k, fk
				continue
			}
			for i := 1; i <= d; i++ { // shrink toward the best
				pts[i] = along(pts[0], pts[i], 0.5)
				if vals[i], err = eval(pts[i]); err != nil {
					return nil, err
				}
			}
		}
	}
	best := 0
	for i := range vals {
		if vals[i] < vals[best] {
			best = i
		}
	}
	return pts[best], nil
}

// goldenLog returns the x in [lo, hi] minimising f, searched on log x by
// golden sections to within 0.5%, f taken to have one minimum there.
func goldenLog(f func(float64) (float64, error), lo, hi float64) (float64, error) {
	const g = 0.6180339887498949
	a, b := math.Log(lo), math.Log(hi)
	at := func(u float64) float64 { return rounded(math.Exp(u)) }
	c, d := b-g*(b-a), a+g*(b-a)
	fc, err := f(at(c))
	if err != nil {
		return 0, err
	}
	fd, err := f(at(d))
	if err != nil {
		return 0, err
	}
	for b-a > 0.005 {
		if fc <= fd {
			b, d, fd = d, c, fc
			c = b - g*(b-a)
			if fc, err = f(at(c)); err != nil {
				return 0, err
			}
		} else {
			a, c, fc = c, d, fd
			d = a + g*(b-a)
			if fd, err = f(at(d)); err != nil {
				return 0, err
			}
		}
	}
	return at((a + b) / 2), nil
}

// summarizeTimes is a row over the observed requests: their own times
// with times nil, else the modelled ones and their error.
func summarizeTimes(name string, obs []observed, times []RequestTimes) CalibrationRow {
	var ttft, tpot []time.Duration
	var errs []float64
	for _, ob := range obs {
		t := RequestTimes{TTFT: ob.ttft, TPOT: ob.tpot}
		if times != nil {
			t = times[ob.i]
			if t.TTFT < 0 {
				t.TTFT = time.Duration(math.MaxInt64) // not served: as late as can be
			}
			errs = append(errs, math.Abs(float64(t.TTFT)/float64(ob.ttft)-1))
		}
		ttft = append(ttft, t.TTFT)
		if ob.tpot > 0 && t.TPOT > 0 {
			tpot = append(tpot, t.TPOT)
		}
	}
	slices.Sort(ttft)
	slices.Sort(tpot)
	row := CalibrationRow{Name: name, TTFTP50: Quantile(ttft, .5), TTFTP90: Quantile(ttft, .9), TTFTP99: Quantile(ttft, .99),
		TPOTP50: Quantile(tpot, .5), TPOTP90: Quantile(tpot, .9)}
	if len(errs) > 0 {
		slices.Sort(errs)
		row.Error = errs[len(errs)/2]
	}
	return row
}

// WriteCalibration prints c: the fitted costs as rates against the
// preset's, and the percentiles of the capture, the preset and the fit.
func WriteCalibration(w io.Writer, c Calibration) {
	fmt.Fprintf(w, "llmlb bench --calibrate: %s, %d requests (%d with a TTFT), %d servers (%s), engine model %s, each request on the server standing for its backend; %d runs\n",
		c.Workload, c.Requests, c.Timed, len(c.Presets), strings.Join(compact(c.Presets), " "), c.Model, c.Runs)
	fmt.Fprintf(w, "fitted: prefill rate %.2fx the preset's, per-request cost %.2fx, decode rate %.2fx (as --perturb %s)\n",
		1/factor(c.Fit.Prefill), factor(c.Fit.Request), 1/factor(c.Fit.Decode), c.Fit)
	rows := [][]string{{"", "ttft p50", "p90", "p99", "tpot p50", "p90", "ttft error p50"}}
	for _, r := range c.Rows {
		e := "-"
		if r.Name != "captured" {
			e = fmt.Sprintf("%.0f%%", 100*r.Error)
		}
		rows = append(rows, []string{r.Name, secs(r.TTFTP50), secs(r.TTFTP90), secs(r.TTFTP99), secs(r.TPOTP50), secs(r.TPOTP90), e})
	}
	writeAligned(w, rows)
}
