package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Command is one `llmlb bench`, its flags parsed: which runs to make and
// which files to write besides the tables it prints. Each field holds its
// flag's value; a zero field means the flag's zero, not its default.
type Command struct {
	// Workloads and Policies are the tables and their rows (empty: every
	// built-in workload; [DefaultPolicies]).
	Workloads, Policies []string
	// Backends is the number of emulated servers (0: 8); Slow of
	// them run the slower a100-8b preset (0: a quarter, -1: none). With
	// Target, Backends is the number behind it, whose idle ones count in
	// the imbalance (0: those that answered).
	Backends, Slow int
	// Params size the workloads and seed them, the scrape jitter and the
	// random policies (Rate 0: each workload's default).
	Params Params
	// Clients, when positive, also runs each workload closed-loop with
	// that many clients and reports its output tokens/s as saturated
	// tok/s; -1 is 32 a server, 0 skips it.
	Clients int
	// Engine is the metrics flavour the emulated servers render.
	Engine string
	// EngineModel is how the emulated servers schedule and cache
	// ([EngineModels]; "": vllm-v1). Published experiments and Target
	// runs take only vllm-v1.
	EngineModel string
	// Perturb scales the emulated engines' costs without telling the
	// balancer, as [ParsePerturb] reads it ("": not at all).
	Perturb string
	// KVEvents has the servers publish their KV-cache events
	// ([Options].KVEvents).
	KVEvents bool
	// Replicas is how many independent balancers front the cluster;
	// above 1 the table compares them with one (0 and 1: one).
	Replicas int
	// SharedLedger, when positive, has the replicas share their ledgers
	// at this interval ([Cluster.SharedLedger]): the replica table adds
	// R replicas sharing to R independent ones, and a sweep runs its R
	// replicas sharing. It needs Replicas above 1; zero is off.
	SharedLedger time.Duration
	// SLO, when set, adds goodput and attainment to each table
	// ([Options.SLO]).
	SLO SLO
	// Sweep runs each workload at a ladder of arrival rates: Rates, a
	// comma-separated list of factors ("": [DefaultLadder]), at Seeds
	// seeds from Params.Seed on. Seeds is at least 1, and above 1 only
	// with Sweep. Without Sweep, Rates ("": Params.Rate) are the rates of
	// the replica table.
	Sweep bool
	Rates string
	Seeds int
	// Prefill and Decisions, when Prefill is positive, compare
	// disaggregated prefill/decode with the servers aggregated
	// ([Options.Prefill]).
	Prefill   int
	Decisions []string
	// Scenario, if set, replays that published experiment
	// ([LookupExperiment]) instead, beside its published figures.
	Scenario string
	// Target, if set, is the base URL of a running balancer to replay the
	// workloads against over HTTP, in real time, instead of emulating a
	// cluster; Model is the base model to ask it for ("": the first of
	// its /v1/models) and Label the result's row ([HTTPReplay]).
	Target, Model, Label string
	// Calibrate, with TraceFiles, fits the engine model's costs to the
	// capture instead ([Calibrate]).
	Calibrate bool
	// TraceFiles, if set, are a trace to replay as one more workload
	// ([TraceWorkload]): a capture, its rotated files, or a trace in the
	// Mooncake format. A run at the trace's own rate adds the row the
	// capture recorded live ([Captured]).
	TraceFiles []string
	// JSONFile, PlotFile and RecordFile, if set, also get the results as
	// JSON, the TTFT distributions as PNG (one a workload with Sweep,
	// named after PlotFile) and a [TraceWriter]'s lines, which record
	// single emulated runs only: not with Sweep, Scenario or Target.
	JSONFile, PlotFile, RecordFile string
	// Progress, if set, gets progress lines.
	Progress io.Writer
}

// Run makes the runs c asks for and prints their tables to stdout: a
// published experiment's with Scenario, a replay's with Target, otherwise
// emulated runs in virtual time, as a sweep with Sweep, as a comparison
// with one replica with Replicas above 1, else one table a workload.
func (c Command) Run(ctx context.Context, stdout io.Writer) (err error) {
	if c.Params.Traces == nil {
		c.Params.Traces = new(Traces)
	}
	if c.RecordFile != "" && (c.Sweep || c.Scenario != "" || c.Target != "") {
		return errors.New("bench: --record records single runs: not with --sweep, --scenario or --target")
	}
	if len(c.TraceFiles) > 0 {
		if c.Scenario != "" {
			return errors.New("bench: --trace: a --scenario replays its own workload")
		}
		c.Workloads = append(c.Workloads, TraceWorkload(c.TraceFiles...))
	}
	if c.Calibrate {
		return c.runCalibrate(ctx, stdout)
	}
	if err := checkEngineModel(c.EngineModel); err != nil {
		return err
	}
	if c.EngineModel != "" && c.EngineModel != VLLMV1 && (c.Scenario != "" || c.Target != "") {
		return fmt.Errorf("bench: --engine-model %s: --scenario replays its experiment on vllm-v1, and --target emulates nothing", c.EngineModel)
	}
	switch {
	case c.Scenario != "":
		return c.runExperiment(ctx, stdout)
	case c.Target != "":
		return c.runTarget(ctx, stdout)
	case c.Backends < 0:
		return errors.New("bench: --backends must be at least 1")
	case c.Backends == 0:
		c.Backends = 8
	}
	if c.SLO.TTFT < 0 || c.SLO.TPOT < 0 {
		return fmt.Errorf("bench: --slo-ttft %v and --slo-tpot %v must not be negative", c.SLO.TTFT, c.SLO.TPOT)
	}
	if c.SharedLedger < 0 || c.SharedLedger > 0 && c.Replicas < 2 {
		return fmt.Errorf("bench: --shared-ledger %v: give a positive interval, with --replicas 2 or more", c.SharedLedger)
	}
	pert, err := ParsePerturb(c.Perturb)
	if err != nil {
		return err
	}
	switch {
	case c.Clients < -1:
		return fmt.Errorf("bench: --clients must be -1 (32 a server), 0 (no saturated run) or a count, got %d", c.Clients)
	case c.Clients == -1:
		c.Clients = 32 * c.Backends
	}
	opts := Options{Workloads: c.Workloads, Policies: c.Policies, Backends: c.Backends, Slow: c.Slow, Params: c.Params,
		Engine: c.Engine, EngineModel: c.EngineModel, Clients: c.Clients, Perturb: pert, KVEvents: c.KVEvents, Progress: c.Progress, Prefill: c.Prefill, Decisions: c.Decisions,
		SharedLedger: c.SharedLedger, SLO: c.SLO}
	if c.RecordFile != "" {
		tr, terr := NewTraceWriter(c.RecordFile, c.Params.Seed)
		if terr != nil {
			return terr
		}
		defer func() { err = cmp.Or(err, tr.Close()) }() // Run's error first
		opts.Trace = tr.WriteRun
	}
	if c.Seeds < 1 || c.Seeds > 1 && !c.Sweep {
		return fmt.Errorf("bench: --seeds %d: give a count of at least 1, with --sweep", c.Seeds)
	}
	c.writeHeader(stdout, pert)
	if c.Sweep {
		return c.runSweep(ctx, opts, stdout)
	}
	if c.Replicas > 1 {
		ladder, err := c.ladder()
		if err != nil {
			return err
		}
		if ladder != nil {
			if opts.Loads, err = buildLadder(opts, ladder); err != nil {
				return err
			}
		}
		rows, err := Replicas(ctx, opts, c.Replicas)
		if err != nil {
			return err
		}
		WriteReplicas(stdout, rows)
		return writeJSON(c.JSONFile, rows)
	}
	rep, err := Bench(ctx, opts)
	if err != nil {
		return err
	}
	if err := c.addCaptured(&rep); err != nil {
		return err
	}
	return c.writeReport(rep, stdout)
}

// writeHeader prints the line that says what the emulated runs run on.
func (c Command) writeHeader(stdout io.Writer, pert Perturb) {
	seeds := fmt.Sprintf("seed %d", c.Params.Seed)
	if c.Seeds > 1 {
		seeds = fmt.Sprintf("seeds %d-%d", c.Params.Seed, c.Params.Seed+uint64(c.Seeds)-1)
	}
	model := cmp.Or(c.EngineModel, VLLMV1)
	fmt.Fprintf(stdout, "llmlb bench: %d servers (%s), engine model %s, %s, virtual time", c.Backends,
		strings.Join(compact(serverPresets(model, c.Backends, c.Slow)), " "), model, seeds)
	if p := pert.String(); p != "" {
		fmt.Fprintf(stdout, ", engines perturbed (%s) without telling the balancer", p)
	}
	if c.KVEvents {
		fmt.Fprint(stdout, ", servers publishing KV events")
	}
	if c.SharedLedger > 0 {
		fmt.Fprintf(stdout, ", replicas sharing their ledgers every %v", c.SharedLedger)
	}
	fmt.Fprintln(stdout)
}

// ladder is c's --rates, nil when none are given.
func (c Command) ladder() ([]float64, error) {
	var ladder []float64
	for f := range strings.SplitSeq(c.Rates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		var x float64
		if _, err := fmt.Sscan(f, &x); err != nil || x <= 0 {
			return nil, fmt.Errorf("bench: --rates: %q is not a positive factor", f)
		}
		ladder = append(ladder, x)
	}
	return ladder, nil
}

// runSweep runs o at each rate of c's ladder and each of its seeds.
func (c Command) runSweep(ctx context.Context, o Options, stdout io.Writer) error {
	ladder, err := c.ladder() // nil: each workload's default
	if err != nil {
		return err
	}
	o.Replicas = c.Replicas
	var seeds []uint64
	for k := range c.Seeds {
		seeds = append(seeds, c.Params.Seed+uint64(k))
	}
	curves, err := SweepSeeds(ctx, o, ladder, seeds)
	if err != nil {
		return err
	}
	WriteSweep(stdout, curves)
	if c.PlotFile != "" {
		files, err := PlotSweep(strings.TrimSuffix(c.PlotFile, ".png"), curves)
		if err != nil {
			return fmt.Errorf("bench: --plot: %w", err)
		}
		fmt.Fprintf(stdout, "plots: %s\n", strings.Join(files, " "))
	}
	return writeJSON(c.JSONFile, curves)
}

// runCalibrate fits the engine model to the capture c.TraceFiles.
func (c Command) runCalibrate(ctx context.Context, stdout io.Writer) error {
	if len(c.TraceFiles) == 0 || len(c.Workloads) > 1 || c.Sweep || c.Target != "" || c.Replicas > 1 {
		return errors.New("bench: --calibrate fits the engine model to one capture: give --trace FILE, without --workload, --sweep, --target or --replicas")
	}
	if c.Backends < 0 {
		return errors.New("bench: --backends must be at least 1")
	}
	slow := c.Slow
	if slow == 0 { // one class unless told
		slow = -1
	}
	cal, err := Calibrate(ctx, CalibrateOptions{Workload: c.Workloads[0], Backends: c.Backends, Slow: slow, EngineModel: c.EngineModel,
		Seed: c.Params.Seed, Scale: c.Params.Scale, Traces: c.Params.Traces, Progress: c.Progress})
	if err != nil {
		return err
	}
	WriteCalibration(stdout, cal)
	return writeJSON(c.JSONFile, cal)
}

// runExperiment replays the published experiment c.Scenario.
func (c Command) runExperiment(ctx context.Context, stdout io.Writer) error {
	if e, ok := lookupPDExperiment(c.Scenario); ok {
		rows, err := RunPDExperiment(ctx, e, Params{Scale: c.Params.Scale, Seed: c.Params.Seed}, c.Progress)
		if err != nil {
			return err
		}
		WritePDExperiment(stdout, e, rows)
		return writeJSON(c.JSONFile, rows)
	}
	sc, err := LookupExperiment(c.Scenario)
	if err != nil {
		return err
	}
	rows, err := RunExperiment(ctx, sc, Params{Scale: c.Params.Scale, Seed: c.Params.Seed}, c.Progress)
	if err != nil {
		return err
	}
	WriteExperiment(stdout, sc, rows)
	return writeJSON(c.JSONFile, rows)
}

// runTarget replays each workload against the running balancer c.Target,
// printing each table as its replay ends.
func (c Command) runTarget(ctx context.Context, stdout io.Writer) error {
	workloads := c.Workloads
	chosen := len(workloads) > 0
	if !chosen {
		workloads = WorkloadNames()
	}
	t := &HTTPReplay{URL: c.Target, Model: c.Model, Label: c.Label, Progress: c.Progress}
	fmt.Fprintf(stdout, "llmlb bench: target %s, seed %d, real time\n", c.Target, c.Params.Seed)
	var rep Report
	for _, name := range workloads {
		w, err := Build(name, c.Params)
		if err != nil {
			return err
		}
		if !chosen && w.hasSessions() {
			fmt.Fprintf(stdout, "\n%s: skipped: its turns wait for earlier turns' answers, which the HTTP replay does not do\n", name)
			continue
		}
		res, err := t.Replay(ctx, w)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", name, err)
		}
		for len(res.PerBackend) < c.Backends {
			res.PerBackend = append(res.PerBackend, 0)
		}
		tab := NewTable(w, len(res.PerBackend), res)
		WriteTable(stdout, tab)
		rep.Workloads = append(rep.Workloads, tab)
	}
	return c.writeReport(rep, nil)
}

// writeReport prints every table to stdout (unless nil) and writes the
// JSON and plot files c asks for.
func (c Command) writeReport(rep Report, stdout io.Writer) error {
	if stdout != nil {
		for _, t := range rep.Workloads {
			WriteTable(stdout, t)
		}
	}
	if err := writeJSON(c.JSONFile, rep); err != nil {
		return err
	}
	if c.PlotFile != "" {
		if err := Plot(c.PlotFile, rep); err != nil {
			return fmt.Errorf("bench: --plot: %w", err)
		}
	}
	return nil
}

// WriteJSONFile writes v, indented, to file, as `--json` does; "" writes
// nothing.
func WriteJSONFile(file string, v any) error { return writeJSON(file, v) }

// writeJSON writes v, indented, to file, as [WriteJSON] writes a report;
// "" writes nothing.
func writeJSON(file string, v any) error {
	if file == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		err = os.WriteFile(file, append(b, '\n'), 0o644)
	}
	if err != nil {
		return fmt.Errorf("bench: --json: %w", err)
	}
	return nil
}

// compact turns [a a a b] into [3×a 1×b].
func compact(names []string) []string {
	var out []string
	for i := 0; i < len(names); {
		j := i
		for j < len(names) && names[j] == names[i] {
			j++
		}
		out = append(out, fmt.Sprintf("%d×%s", j-i, names[i]))
		i = j
	}
	return out
}

// addCaptured adds to each table of a trace replayed at its own rate the
// row its capture recorded live ([Captured]).
func (c Command) addCaptured(rep *Report) error {
	for i := range rep.Workloads {
		t := &rep.Workloads[i]
		if t.Rate != 1 {
			continue
		}
		row, ok, err := Captured(t.Name, c.Params)
		if err != nil {
			return err
		}
		if ok {
			t.Results = append(t.Results, row)
			t.ttfts = append(t.ttfts, nil)
		}
	}
	return nil
}
