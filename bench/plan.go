package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// PlanOptions is one `llmlb plan`: the fewest servers of one class that
// serve a workload within a TTFT target, per policy, at loads of it.
type PlanOptions struct {
	// Workload is a built-in workload's name or a trace's
	// ([TraceWorkload]).
	Workload string
	// Policies are the table's rows ("": [PlanPolicies]).
	Policies []string
	// Preset is the servers' class, a sim preset ("": h100-8b); with
	// EngineModel llm-d-sim the servers are llm-d-sim's.
	Preset, EngineModel string
	// TTFTP90 is the target: 90% of the requests sent answered to their
	// first token within it; one not served missed it.
	TTFTP90 time.Duration
	// Loads multiply the workload's arrival rate (nil: 1, 1.5 and 2).
	Loads []float64
	// Max is the most servers tried (0: 64).
	Max int
	// Requests replays only the workload's first Requests requests (0:
	// all), so that a long trace plans in seconds: the load is the
	// trace's, over a shorter span.
	Requests int
	Seed     uint64
	// Traces shares parsed traces; nil parses them again.
	Traces *Traces
	// Progress, if set, gets a line per run.
	Progress io.Writer
}

// PlanPolicies are the rows of a plan by default: llmlb's default, the
// baseline and the peers' defaults.
func PlanPolicies() []string {
	return []string{DefaultPolicy, "round-robin", "epp", "dynamo-kv"}
}

// PlanRow is one policy's answers, one per load: the fewest servers that
// met the target (0: not met with Max) and the TTFT p90 they gave.
type PlanRow struct {
	Policy  string    `json:"policy"`
	Servers []int     `json:"servers"`
	TTFTP90 []float64 `json:"ttft_p90"`
}

// Plan is `llmlb plan`'s answer.
type Plan struct {
	Workload string        `json:"workload"`
	Requests int           `json:"requests"` // replayed
	Of       int           `json:"of"`       // in the workload
	Span     time.Duration `json:"span"`     // of those replayed, at load 1
	Preset   string        `json:"preset"`
	Model    string        `json:"engine_model"`
	Target   time.Duration `json:"ttft_p90_target"`
	Loads    []float64     `json:"loads"`
	Max      int           `json:"max"`
	Rows     []PlanRow     `json:"rows"`
	Runs     int           `json:"runs"`
}

// RunPlan answers o. Each policy's loads are searched in order, more load
// needing no fewer servers: the first by doubling from one server and
// halving back, each later one from the last answer scaled by the load.
// A run stops as soon as the target is missed ([Cluster.GiveUp]).
func RunPlan(ctx context.Context, o PlanOptions) (Plan, error) {
	if o.TTFTP90 <= 0 {
		return Plan{}, fmt.Errorf("plan: give a TTFT p90 target (--ttft-p90)")
	}
	if err := checkEngineModel(o.EngineModel); err != nil {
		return Plan{}, err
	}
	if len(o.Policies) == 0 {
		o.Policies = PlanPolicies()
	}
	if len(o.Loads) == 0 {
		o.Loads = []float64{1, 1.5, 2}
	}
	o.Max = cmp.Or(o.Max, 64)
	o.Preset = cmp.Or(o.Preset, "h100-8b")
	if o.EngineModel == LLMDSim {
		o.Preset = LLMDSim
	}
	if !slices.IsSorted(o.Loads) || o.Loads[0] <= 0 {
		return Plan{}, fmt.Errorf("plan: --loads %v: positive factors, rising", o.Loads)
	}
	for _, p := range o.Policies {
		if err := checkPolicy(p); err != nil {
			return Plan{}, err
		}
	}
	if o.Traces == nil {
		o.Traces = new(Traces)
	}
	// A trace's load is its own timestamps'; a built-in workload's, its
	// default rate's.
	base := rate(o.Workload, Params{})
	if _, file := traceFiles(o.Workload); file || strings.HasPrefix(o.Workload, "mooncake-") {
		base = 1
	}
	loads := make([]*Workload, len(o.Loads))
	for i, l := range o.Loads {
		w, err := Build(o.Workload, Params{Rate: base * l, Seed: o.Seed, Traces: o.Traces})
		if err != nil {
			return Plan{}, err
		}
		if w.hasSessions() { // a later turn's arrival waits on the answers
			return Plan{}, fmt.Errorf("plan: %s: its turns wait for earlier turns' answers, which the plan's deadlines do not follow", o.Workload)
		}
		if o.Requests > 0 && o.Requests < len(w.Requests) {
			w.Requests = w.Requests[:o.Requests]
		}
		loads[i] = w
	}
	p := Plan{Workload: o.Workload, Requests: len(loads[0].Requests), Preset: o.Preset, Model: cmp.Or(o.EngineModel, VLLMV1),
		Target: o.TTFTP90, Loads: o.Loads, Max: o.Max, Rows: make([]PlanRow, len(o.Policies))}
	if all, err := Build(o.Workload, Params{Rate: base, Seed: o.Seed, Traces: o.Traces}); err == nil {
		p.Of = len(all.Requests)
		w := all.Requests[:p.Requests]
		p.Span = w[len(w)-1].At - w[0].At
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	work := make(chan int)
	for range max(1, min(runtime.GOMAXPROCS(0), len(o.Policies))) {
		wg.Go(func() {
			for i := range work {
				row, runs, err := o.planPolicy(ctx, o.Policies[i], loads, &mu)
				mu.Lock()
				p.Rows[i], p.Runs = row, p.Runs+runs
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	for i := range o.Policies {
		work <- i
	}
	close(work)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return p, first
}

// planPolicy searches each load of one policy; mu guards o.Progress.
func (o PlanOptions) planPolicy(ctx context.Context, policy string, loads []*Workload, mu *sync.Mutex) (PlanRow, int, error) {
	row := PlanRow{Policy: policy}
	runs := 0
	lo, last := 1, 0 // no fewer than lo; the last load's answer
	for li, w := range loads {
		tried := map[int]float64{} // servers -> TTFT p90; +Inf when missed
		meets := func(n int) (bool, error) {
			if p90, ok := tried[n]; ok {
				return p90 <= o.TTFTP90.Seconds(), nil
			}
			if err := ctx.Err(); err != nil {
				return false, err
			}
			p90, err := o.trial(policy, w, n)
			runs++
			if err != nil {
				return false, err
			}
			tried[n] = p90
			if o.Progress != nil {
				mu.Lock()
				fmt.Fprintf(o.Progress, "plan: %s x%g on %d servers: TTFT p90 %s\n", policy, o.Loads[li], n, secs(p90))
				mu.Unlock()
			}
			return p90 <= o.TTFTP90.Seconds(), nil
		}
		guess := lo
		if last > 0 {
			guess = max(lo, int(math.Ceil(float64(last)*o.Loads[li]/o.Loads[li-1])))
		}
		n, err := search(meets, lo, min(guess, o.Max), o.Max)
		if err != nil {
			return row, runs, err
		}
		row.Servers = append(row.Servers, n)
		if n == 0 {
			row.TTFTP90 = append(row.TTFTP90, math.Inf(1))
			for range loads[li+1:] { // more load needs no fewer
				row.Servers, row.TTFTP90 = append(row.Servers, 0), append(row.TTFTP90, math.Inf(1))
			}
			return row, runs, nil
		}
		row.TTFTP90 = append(row.TTFTP90, tried[n])
		lo, last = n, n
	}
	return row, runs, nil
}

// search returns the fewest servers in [lo, most] that meet, trying guess
// first; 0 when most do not. Meeting is taken to hold for every count
// above one that meets.
func search(meets func(int) (bool, error), lo, guess, most int) (int, error) {
	ok, err := meets(guess)
	if err != nil {
		return 0, err
	}
	bad, good := lo-1, 0 // the most known to miss, the fewest known to meet
	if ok {
		// A guess scaled from the last load's answer is near: one fewer
		// first, before halving the rest of the gap.
		good = guess
		if guess-1 > bad {
			if ok, err = meets(guess - 1); err != nil {
				return 0, err
			}
			if ok {
				good = guess - 1
			} else {
				bad = guess - 1
			}
		}
	} else {
		bad = guess
		for step := 1; good == 0; step *= 2 { // up by doubling steps
			n := min(most, bad+step)
			if ok, err = meets(n); err != nil {
				return 0, err
			}
			if ok {
				good = n
			} else if bad = n; n == most {
				return 0, nil
			}
		}
	}
	for good-bad > 1 { // halve the gap
		n := (bad + good) / 2
		if ok, err = meets(n); err != nil {
			return 0, err
		}
		if ok {
			good = n
		} else {
			bad = n
		}
	}
	return good, nil
}

// trial runs w on n servers under policy and returns its TTFT p90 over the
// requests sent, +Inf when it gave up or served too few.
func (o PlanOptions) trial(policy string, w *Workload, n int) (float64, error) {
	total := len(w.Requests)
	allowed := total - int(math.Ceil(0.9*float64(total))) // late requests the p90 allows
	presets := make([]string, n)
	for i := range presets {
		presets[i] = o.Preset
	}
	res, err := Run(Cluster{Presets: presets, EngineModel: o.EngineModel, Policy: policy, Seed: o.Seed,
		GiveUp: GiveUp{TTFT: o.TTFTP90, Late: allowed + 1}}, w)
	if err != nil {
		return 0, err
	}
	if res.GaveUp {
		return math.Inf(1), nil
	}
	ttft := slices.Clone(res.TTFT)
	for len(ttft) < total { // not served: missed
		ttft = append(ttft, time.Duration(math.MaxInt64))
	}
	slices.Sort(ttft)
	if q := Quantile(ttft, 0.9); q < float64(math.MaxInt64)/1e9 {
		return q, nil
	}
	return math.Inf(1), nil
}

// checkPolicy reports whether p names a policy the bench runs.
func checkPolicy(p string) error {
	if _, ok, err := ablated(p); ok {
		return err
	}
	if p == DefaultPolicy || slices.Contains(DefaultPolicies(), p) {
		return nil
	}
	if _, err := balancer.LookupPreset(p); err != nil {
		return fmt.Errorf("bench: unknown policy %q (have %v)", p, DefaultPolicies())
	}
	return nil
}

// WritePlan prints p as a table: a row per policy, a column per load, each
// cell the fewest servers that met the target and the TTFT p90 they gave.
func WritePlan(w io.Writer, p Plan) {
	what := fmt.Sprintf("%d requests", p.Requests)
	if p.Of > p.Requests {
		what = fmt.Sprintf("its first %d of %d requests", p.Requests, p.Of)
	}
	fmt.Fprintf(w, "llmlb plan: %s, %s (%s at x1), servers %s (%s), target TTFT p90 %v, %d runs in virtual time\n",
		p.Workload, what, p.Span.Round(time.Second), p.Preset, p.Model, p.Target, p.Runs)
	head := []string{"policy"}
	for _, l := range p.Loads {
		head = append(head, fmt.Sprintf("x%g", l))
	}
	rows := [][]string{head}
	for _, r := range p.Rows {
		row := []string{r.Policy}
		for i, n := range r.Servers {
			if n == 0 {
				row = append(row, fmt.Sprintf("more than %d", p.Max))
				continue
			}
			row = append(row, fmt.Sprintf("%d (%s)", n, secs(r.TTFTP90[i])))
		}
		rows = append(rows, row)
	}
	writeAligned(w, rows)
	fmt.Fprintln(w, strings.TrimSpace(`
Each cell: the fewest servers whose TTFT p90 met the target at that load, with that p90.`))
}
