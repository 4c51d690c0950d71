package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb/bench"
)

// cmdBench replays workloads through every policy on an emulated cluster in
// virtual time and prints one table per workload; with --target it replays
// them in real time over HTTP against a running balancer instead.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "llmlb bench [--workload W,...] [--policy P,...] [--backends N] [--rate X] [--seed S] [--json FILE] [--plot FILE.png] [--target URL [--model M] [--label L]]", stderr)
	workloads := fs.String("workload", strings.Join(bench.WorkloadNames(), ","), "comma-separated workloads")
	policies := fs.String("policy", strings.Join(bench.DefaultPolicies(), ","), "comma-separated policies; default is llmlb's default, oracle knows every cache")
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
	if err := fs.Parse(args); err != nil {
		return err
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
	}
	if !*quiet {
		opts.Progress = stderr
	}
	fmt.Fprintf(stdout, "llmlb bench: %d servers (%s), seed %d, virtual time\n", *backends, strings.Join(compact(bench.Presets(*backends, *slow)), " "), *seed)
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
	t := &bench.Target{URL: url, Model: model, Label: label}
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
// connection, HAProxy and nginx, in front of one fast emulated backend.
func cmdOverhead(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("overhead", "llmlb overhead [--proxy direct,llmlb,haproxy,nginx] [--duration D] [--scale F] [--json FILE]", stderr)
	proxies := fs.String("proxy", "direct,llmlb,haproxy,nginx", "comma-separated rows: direct, llmlb (this executable), haproxy, nginx (from PATH or /usr/sbin)")
	duration := fs.Duration("duration", 5*time.Second, "how long each scenario runs against each proxy")
	scale := fs.Float64("scale", 1, "share of the clients of the concurrent scenarios (64 requests, 8 long prompts, 256 streams)")
	require := fs.Bool("require", false, "fail when a proxy is not installed instead of skipping its row")
	jsonFile := fs.String("json", "", "also write the results as JSON to this file")
	quiet := fs.Bool("quiet", false, "no progress lines")
	self := fs.String("llmlb", "", "llmlb executable to measure (default: this one)")
	if err := fs.Parse(args); err != nil {
		return err
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
	o := bench.OverheadOptions{LLMLB: *self, Proxies: split(*proxies), Duration: *duration, Scale: *scale,
		Require: *require || getenv("LLMLB_REQUIRE_PROXIES") == "1"}
	if !*quiet {
		o.Progress = stderr
	}
	rep, err := bench.Overhead(ctx, o)
	if err != nil {
		return err
	}
	bench.WriteOverhead(stdout, rep)
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
