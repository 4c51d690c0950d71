package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb/bench"
	"github.com/llmlb/llmlb/overhead"
)

// cmdBench replays workloads through every policy on an emulated cluster in
// virtual time and prints one table per workload; with --target it replays
// them in real time over HTTP against a running balancer instead.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) (retErr error) {
	fs := newFlagSet("bench", "llmlb bench [--workload W,...] [--policy P,...] [--backends N] [--slow N] [--rate X] [--scale F] [--seed S] [--clients N] [--engine E] [--sweep [--rates F,...] [--seeds N]] [--replicas R] [--scenario NAME] [--json FILE] [--plot FILE.png] [--trace FILE] [--quiet] [--target URL [--model M] [--label L]]", stderr)
	workloads := fs.String("workload", strings.Join(bench.WorkloadNames(), ","), "comma-separated workloads")
	policies := fs.String("policy", strings.Join(bench.DefaultPolicies(), ","), "comma-separated policies; default is llmlb's default; ttft-true-cache and llm-d-precise know every cache")
	backends := fs.Int("backends", 8, "emulated servers; with --target, the backends behind it (for imbalance; default: those that answered)")
	slow := fs.Int("slow", 0, "of those, servers on the slower a100-8b preset (0: a quarter, -1: none)")
	rate := fs.Float64("rate", 0, "arrival-rate factor (0: each workload's default)")
	scale := fs.Float64("scale", 1, "share of each workload to run (requests, groups or trace lines)")
	seed := fs.Uint64("seed", 1, "seed for workloads, scrape jitter and random policies")
	clients := fs.Int("clients", -1, "also run each workload closed-loop with this many clients and report its output tokens/s as saturated tok/s; -1: 32 a server, 0: skip it")
	engine := fs.String("engine", "vllm", "metrics flavour the emulated servers render and llmlb scrapes")
	jsonFile := fs.String("json", "", "also write the results as JSON to this file")
	plotFile := fs.String("plot", "", "also draw TTFT distributions per policy to this PNG file")
	quiet := fs.Bool("quiet", false, "no progress line")
	target := fs.String("target", "", "replay over HTTP, in real time, against the balancer (or server) at this base URL instead of emulating a cluster; the lora workload needs adapters lora-00..lora-15 there")
	model := fs.String("model", "", "with --target: the base model to ask for (default: the first base model of the target's /v1/models)")
	label := fs.String("label", "target", "with --target: the name of the result's row")
	sweep := fs.Bool("sweep", false, "run each workload at a ladder of arrival rates (x0.25 to x4 its default, x2 for the Mooncake traces) and print TTFT p90 and output tok/s per policy at each, the default's worst ratio to each peer, and with --plot one PNG per workload")
	rates := fs.String("rates", "", "with --sweep: comma-separated arrival-rate factors instead of the default ladder")
	seeds := fs.Int("seeds", 1, "with --sweep: run every point at N seeds (--seed, --seed+1, ...) and print the medians, the seeds' own ratios where the default's worst is, and at how many seeds it is more than 3% worse than each policy")
	replicas := fs.Int("replicas", 1, "independent balancers in front of the cluster, each arrival to one at random; above 1 also prints the table against one replica")
	kvEvents := fs.Bool("kv-events", false, "the emulated servers publish their KV-cache events, as vLLM does with --kv-events-config, and llmlb's default reads them (each request tokenized first, at a cost); the peers run as without")
	perturb := fs.String("perturb", "", "scale the emulated engines' costs without telling the balancer: prefill=F (prefill per token and attention), request=F (per-request intake), tokens=F (the prompt tokens the balancer is told, as another tokenizer counts them), comma-separated")
	traceFile := fs.String("trace", "", "also write one JSON line per served request of each emulated run to this file: its server and reason, what every server's cache held of its prompt and the prefill work truly queued at the pick, and its time to first token (not with --sweep, --scenario or --target)")
	scenario := fs.String("scenario", "", "replay a published experiment and print its published figures beside ours: llm-d-kv-cache-wins or sglang-v04-shared-prefix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *traceFile != "" && (*sweep || *scenario != "" || *target != "") {
		return fmt.Errorf("bench: --trace records single runs: not with --sweep, --scenario or --target")
	}
	if *scenario != "" {
		sc, err := bench.LookupExperiment(*scenario)
		if err != nil {
			return err
		}
		var progress io.Writer
		if !*quiet {
			progress = stderr
		}
		rows, err := bench.RunExperiment(ctx, sc, bench.Params{Scale: *scale, Seed: *seed}, progress)
		if err != nil {
			return err
		}
		bench.WriteExperiment(stdout, sc, rows)
		return writeJSON(*jsonFile, rows)
	}
	if *target != "" {
		n := 0 // backends behind the target: only those that answered, unless --backends says
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "backends" {
				n = *backends
			}
		})
		return benchTarget(ctx, *target, *model, *label, n, split(*workloads), bench.Params{Rate: *rate, Scale: *scale, Seed: *seed}, *quiet, *jsonFile, *plotFile, stdout, stderr)
	}
	if *backends < 1 {
		return fmt.Errorf("bench: --backends must be at least 1")
	}
	pert, err := bench.ParsePerturb(*perturb)
	if err != nil {
		return err
	}
	switch {
	case *clients < -1:
		return fmt.Errorf("bench: --clients must be -1 (32 a server), 0 (no saturated run) or a count, got %d", *clients)
	case *clients == -1:
		*clients = 32 * *backends
	}
	opts := bench.Options{
		Workloads: split(*workloads),
		Policies:  split(*policies),
		Backends:  *backends,
		Slow:      *slow,
		Params:    bench.Params{Rate: *rate, Scale: *scale, Seed: *seed},
		Engine:    *engine,
		Clients:   *clients,
		Perturb:   pert,
		KVEvents:  *kvEvents,
	}
	if !*quiet {
		opts.Progress = stderr
	}
	if *traceFile != "" {
		tr, err := newTraceWriter(*traceFile, *seed)
		if err != nil {
			return err
		}
		defer tr.close(&retErr)
		opts.Trace = tr.write
	}
	if *seeds < 1 || *seeds > 1 && !*sweep {
		return fmt.Errorf("bench: --seeds %d: give a count of at least 1, with --sweep", *seeds)
	}
	seedText := fmt.Sprintf("seed %d", *seed)
	if *seeds > 1 {
		seedText = fmt.Sprintf("seeds %d-%d", *seed, *seed+uint64(*seeds)-1)
	}
	fmt.Fprintf(stdout, "llmlb bench: %d servers (%s), %s, virtual time", *backends, strings.Join(compact(bench.Presets(*backends, *slow)), " "), seedText)
	if p := pert.String(); p != "" {
		fmt.Fprintf(stdout, ", engines perturbed (%s) without telling the balancer", p)
	}
	if *kvEvents {
		fmt.Fprint(stdout, ", servers publishing KV events")
	}
	fmt.Fprintln(stdout)
	if *sweep {
		var ladder []float64 // nil: each workload's default
		if *rates != "" {
			for _, f := range split(*rates) {
				var x float64
				if _, err := fmt.Sscan(f, &x); err != nil || x <= 0 {
					return fmt.Errorf("bench: --rates: %q is not a positive factor", f)
				}
				ladder = append(ladder, x)
			}
		}
		opts.Replicas = *replicas
		var list []uint64
		for k := range *seeds {
			list = append(list, *seed+uint64(k))
		}
		curves, err := bench.SweepSeeds(ctx, opts, ladder, list)
		if err != nil {
			return err
		}
		bench.WriteSweep(stdout, curves)
		if *plotFile != "" {
			files, err := bench.PlotSweep(strings.TrimSuffix(*plotFile, ".png"), curves)
			if err != nil {
				return fmt.Errorf("bench: --plot: %w", err)
			}
			fmt.Fprintf(stdout, "plots: %s\n", strings.Join(files, " "))
		}
		return writeJSON(*jsonFile, curves)
	}
	if *replicas > 1 {
		rows, err := bench.Replicas(ctx, opts, *replicas)
		if err != nil {
			return err
		}
		bench.WriteReplicas(stdout, rows)
		return writeJSON(*jsonFile, rows)
	}
	rep, err := bench.Bench(ctx, opts)
	if err != nil {
		return err
	}
	return writeReport(rep, *jsonFile, *plotFile, stdout)
}

// benchTarget replays each workload against a running balancer.
func benchTarget(ctx context.Context, url, model, label string, backends int, workloads []string, p bench.Params, quiet bool, jsonFile, plotFile string, stdout, stderr io.Writer) error {
	if len(workloads) == 0 {
		workloads = bench.WorkloadNames()
	}
	t := &bench.HTTPReplay{URL: url, Model: model, Label: label}
	if !quiet {
		t.Progress = stderr
	}
	fmt.Fprintf(stdout, "llmlb bench: target %s, seed %d, real time\n", url, p.Seed)
	var rep bench.Report
	for _, name := range workloads {
		w, err := bench.Build(name, p)
		if err != nil {
			return err
		}
		res, err := t.Replay(ctx, w)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", name, err)
		}
		for len(res.PerBackend) < backends {
			res.PerBackend = append(res.PerBackend, 0)
		}
		tab := bench.NewTable(w, len(res.PerBackend), res)
		bench.WriteTable(stdout, tab)
		rep.Workloads = append(rep.Workloads, tab)
	}
	return writeReport(rep, jsonFile, plotFile, nil)
}

// writeReport prints every table to stdout (unless nil) and writes the
// --json and --plot files that were asked for.
func writeReport(rep bench.Report, jsonFile, plotFile string, stdout io.Writer) error {
	if stdout != nil {
		for _, t := range rep.Workloads {
			bench.WriteTable(stdout, t)
		}
	}
	if jsonFile != "" {
		f, err := os.Create(jsonFile)
		if err != nil {
			return fmt.Errorf("bench: --json: %w", err)
		}
		err = bench.WriteJSON(f, rep)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("bench: --json: %w", err)
		}
	}
	if plotFile != "" {
		if err := bench.Plot(plotFile, rep); err != nil {
			return fmt.Errorf("bench: --plot: %w", err)
		}
	}
	return nil
}

// traceWriter writes --trace's JSON lines. The file is opened at once,
// so that a path it cannot write is refused before any run, but emptied
// only when the first run's records come: a command refused for a bad
// flag leaves a trace already there as it was.
type traceWriter struct {
	f       *os.File
	w       *bufio.Writer
	enc     *json.Encoder
	seed    uint64
	started bool
	err     error
}

// traceLine is one line of --trace: the run, then its request's record.
type traceLine struct {
	Workload string `json:"workload"`
	Policy   string `json:"policy"`
	Replicas int    `json:"replicas"`
	Seed     uint64 `json:"seed"`
	bench.TraceRecord
}

func newTraceWriter(file string, seed uint64) (*traceWriter, error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: --trace: %w", err)
	}
	w := bufio.NewWriter(f)
	return &traceWriter{f: f, w: w, enc: json.NewEncoder(w), seed: seed}, nil
}

func (t *traceWriter) write(run bench.TraceRun) {
	if !t.started && t.err == nil {
		t.started = true
		t.err = t.f.Truncate(0)
	}
	for _, rec := range run.Records {
		if t.err != nil {
			return
		}
		t.err = t.enc.Encode(traceLine{Workload: run.Workload, Policy: run.Policy, Replicas: run.Replicas, Seed: t.seed, TraceRecord: rec})
	}
}

// close flushes and closes the file, setting *err to the first error if
// it is nil.
func (t *traceWriter) close(err *error) {
	e := t.err
	if ferr := t.w.Flush(); e == nil {
		e = ferr
	}
	if cerr := t.f.Close(); e == nil {
		e = cerr
	}
	if e != nil && *err == nil {
		*err = fmt.Errorf("bench: --trace: %w", e)
	}
}

// writeJSON writes v, indented, to file; "" writes nothing.
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

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
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

// cmdOverhead measures what llmlb adds to a request against a direct
// connection, Go's reverse proxy alone, HAProxy and nginx, in front of one
// fast emulated backend; with --go-proxy it is instead the go row's
// process.
func cmdOverhead(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("overhead", "llmlb overhead [--proxy direct,llmlb,go,haproxy,nginx] [--duration D] [--scale F] [--scenario S,...] [--json FILE] [--cpuprofile DIR] [--require] [--quiet] [--llmlb PATH]", stderr)
	proxies := fs.String("proxy", "direct,llmlb,go,haproxy,nginx", "comma-separated rows: direct, llmlb (this executable), go (Go's httputil.ReverseProxy alone, run by this executable), haproxy, nginx (from PATH or /usr/sbin)")
	duration := fs.Duration("duration", 5*time.Second, "how long each scenario runs against each proxy")
	scale := fs.Float64("scale", 1, "share of the clients of the concurrent scenarios (64 requests, 8 long prompts, 150 long chats, 256 streams)")
	require := fs.Bool("require", false, "fail when a proxy is not installed instead of skipping its row")
	jsonFile := fs.String("json", "", "also write the results as JSON to this file")
	quiet := fs.Bool("quiet", false, "no progress lines")
	self := fs.String("llmlb", "", "llmlb executable to measure (default: this one)")
	scenarios := fs.String("scenario", "", "comma-separated scenarios to run: latency, throughput, long-prompt, long-chat, streams (default: all)")
	profDir := fs.String("cpuprofile", "", "write llmlb's CPU profile of each scenario, from its admin pprof, to DIR/llmlb-<scenario>.pprof")
	goProxy := fs.String("go-proxy", "", "instead of measuring, serve as the go row's process: Go's httputil.ReverseProxy alone in front of this backend URL, until interrupted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *goProxy != "" {
		return overhead.ServeGoProxy(ctx, *goProxy, stdout)
	}
	if *duration <= 0 || *scale <= 0 {
		return fmt.Errorf("overhead: --duration and --scale must be positive")
	}
	if *self == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("overhead: %w", err)
		}
		*self = exe
	}
	o := overhead.Options{LLMLB: *self, Proxies: split(*proxies), Duration: *duration, Scale: *scale,
		Require: *require || getenv("LLMLB_REQUIRE_PROXIES") == "1", Scenarios: split(*scenarios), ProfileDir: *profDir}
	if *profDir != "" {
		if err := os.MkdirAll(*profDir, 0o755); err != nil {
			return fmt.Errorf("overhead: --cpuprofile: %w", err)
		}
	}
	if !*quiet {
		o.Progress = stderr
	}
	rep, err := overhead.Run(ctx, o)
	if err != nil {
		return err
	}
	overhead.Write(stdout, rep)
	if *jsonFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			return fmt.Errorf("overhead: --json: %w", err)
		}
	}
	return nil
}
