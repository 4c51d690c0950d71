package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/llmlb/llmlb/bench"
)

// cmdBench replays workloads through every policy on an emulated cluster in
// virtual time and prints one table per workload.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "llmlb bench [--workload W,...] [--policy P,...] [--backends N] [--rate X] [--seed S] [--json FILE] [--plot FILE.png]", stderr)
	workloads := fs.String("workload", strings.Join(bench.WorkloadNames(), ","), "comma-separated workloads")
	policies := fs.String("policy", strings.Join(bench.DefaultPolicies(), ","), "comma-separated policies; default is llmlb's default, oracle knows every cache")
	backends := fs.Int("backends", 8, "emulated servers")
	slow := fs.Int("slow", 0, "of those, servers on the slower a100-8b preset (0: a quarter, -1: none)")
	rate := fs.Float64("rate", 0, "arrival-rate factor (0: each workload's default)")
	scale := fs.Float64("scale", 1, "share of each workload to run (requests, groups or trace lines)")
	seed := fs.Uint64("seed", 1, "seed for workloads, scrape jitter and random policies")
	engine := fs.String("engine", "vllm", "metrics flavour the emulated servers render and llmlb scrapes")
	jsonFile := fs.String("json", "", "also write the results as JSON to this file")
	plotFile := fs.String("plot", "", "also draw TTFT distributions per policy to this PNG file")
	quiet := fs.Bool("quiet", false, "no progress line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *backends < 1 {
		return fmt.Errorf("bench: --backends must be at least 1")
	}
	opts := bench.Options{
		Workloads: split(*workloads),
		Policies:  split(*policies),
		Backends:  *backends,
		Slow:      *slow,
		Params:    bench.Params{Rate: *rate, Scale: *scale, Seed: *seed},
		Engine:    *engine,
	}
	if !*quiet {
		opts.Progress = stderr
	}
	fmt.Fprintf(stdout, "llmlb bench: %d servers (%s), seed %d, virtual time\n", *backends, strings.Join(compact(bench.Presets(*backends, *slow)), " "), *seed)
	rep, err := bench.Bench(ctx, opts)
	if err != nil {
		return err
	}
	for _, t := range rep.Workloads {
		bench.WriteTable(stdout, t)
	}
	if *jsonFile != "" {
		f, err := os.Create(*jsonFile)
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
	if *plotFile != "" {
		if err := bench.Plot(*plotFile, rep); err != nil {
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
