package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/bench"
)

// cmdPlan finds the fewest servers of a class that serve a trace within a
// TTFT target, per policy, at its load and above, in virtual time.
func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", "llmlb plan (--trace FILE,... | --workload W) --ttft-p90 D [--preset P] [--engine-model M] [--policy P,...] [--loads F,...] [--max N] [--requests N] [--seed S] [--json FILE] [--quiet]", stderr)
	var o bench.PlanOptions
	trace := fs.String("trace", "", "the trace to plan for, read as one from comma-separated files: a capture (capture: in llmlb's config) and its rotated files, or any trace in the Mooncake format")
	workload := fs.String("workload", "", "instead of --trace, one of the bench's workloads (at its default rate)")
	fs.DurationVar(&o.TTFTP90, "ttft-p90", 0, "the target: 90% of the requests answered to their first token within this, a request not served missing it (e.g. 500ms)")
	fs.StringVar(&o.Preset, "preset", "h100-8b", "the servers' class, an engine model preset (h100-8b, a100-8b, ...; with --engine-model llm-d-sim, llm-d-sim's)")
	fs.StringVar(&o.EngineModel, "engine-model", bench.VLLMV1, "how the emulated servers schedule and cache: vllm-v1 or llm-d-sim")
	policies := fs.String("policy", "", "comma-separated policies, one row each (default: "+strings.Join(bench.PlanPolicies(), ",")+")")
	loads := fs.String("loads", "1,1.5,2", "comma-separated factors of the trace's arrival rate, one column each, rising")
	fs.IntVar(&o.Max, "max", 64, "the most servers tried")
	fs.IntVar(&o.Requests, "requests", 1000, "replay the trace's first N requests only (0: all): the load is the trace's, over a shorter span, so that a long trace plans in seconds")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed for a built-in workload, scrape jitter and random policies")
	jsonFile := fs.String("json", "", "also write the plan as JSON to this file")
	quiet := fs.Bool("quiet", false, "no line per run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case (*trace == "") == (*workload == ""):
		return fmt.Errorf("plan: give --trace FILE or --workload W")
	case *trace != "":
		o.Workload = bench.TraceWorkload(split(*trace)...)
	default:
		o.Workload = *workload
	}
	o.Policies = split(*policies)
	for _, f := range split(*loads) {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || x <= 0 {
			return fmt.Errorf("plan: --loads: %q is not a positive factor", f)
		}
		o.Loads = append(o.Loads, x)
	}
	if o.Max < 1 || o.Requests < 0 {
		return fmt.Errorf("plan: --max %d must be at least 1 and --requests %d not negative", o.Max, o.Requests)
	}
	if !*quiet {
		o.Progress = stderr
	}
	start := time.Now()
	p, err := bench.RunPlan(ctx, o)
	if err != nil {
		return err
	}
	bench.WritePlan(stdout, p)
	if !*quiet {
		fmt.Fprintf(stderr, "plan: %s\n", time.Since(start).Round(100*time.Millisecond))
	}
	return bench.WriteJSONFile(*jsonFile, p)
}
