package main

import (
	"context"
	"io"
	"strings"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/bench"
)

// cmdBench replays workloads through every policy on an emulated cluster in
// virtual time and prints one table per workload; with --target it replays
// them in real time over HTTP against a running balancer instead.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "llmlb bench [--workload W,...] [--policy P,...] [--backends N] [--slow N] [--rate X] [--scale F] [--seed S] [--clients N] [--engine E] [--engine-model M] [--kv-events] [--perturb S] [--sweep [--rates F,...] [--seeds N]] [--replicas R [--shared-ledger D] [--rates F,...]] [--prefill N [--decisions D,...]] [--scenario NAME] [--trace FILE,... [--calibrate]] [--json FILE] [--plot FILE.png] [--record FILE] [--quiet] [--target URL [--model M] [--label L]]", stderr)
	var c bench.Command
	workloads := fs.String("workload", "", "comma-separated workloads (default: "+strings.Join(bench.WorkloadNames(), ",")+"; with --prefill: "+strings.Join(bench.PDWorkloadNames(), ",")+"; only when named: "+strings.Join(bench.OtherWorkloadNames(), ",")+")")
	policies := fs.String("policy", "", "comma-separated policies (default: "+strings.Join(bench.DefaultPolicies(), ",")+"; with --prefill: default); default is llmlb's default; ttft-true-cache and llm-d-precise know every cache; default-no-RULE[+RULE...] is the default with those rules off, for an ablation (RULE: "+strings.Join(balancer.RuleNames(), ", ")+")")
	fs.IntVar(&c.Backends, "backends", 0, "emulated servers (0: 8); with --target, the backends behind it (for imbalance; 0: those that answered)")
	fs.IntVar(&c.Slow, "slow", 0, "of those, servers on the slower a100-8b preset (0: a quarter, -1: none)")
	fs.Float64Var(&c.Params.Rate, "rate", 0, "arrival-rate factor (0: each workload's default)")
	fs.Float64Var(&c.Params.Scale, "scale", 1, "share of each workload to run (requests, groups or trace lines)")
	fs.Uint64Var(&c.Params.Seed, "seed", 1, "seed for workloads, scrape jitter and random policies")
	fs.IntVar(&c.Clients, "clients", -1, "also run each workload closed-loop with this many clients and report its output tokens/s as saturated tok/s; -1: 32 a server, 0: skip it")
	fs.StringVar(&c.Engine, "engine", "vllm", "metrics flavour the emulated servers render and llmlb scrapes")
	fs.StringVar(&c.EngineModel, "engine-model", bench.VLLMV1, "how the emulated servers schedule and cache: vllm-v1 (vLLM V1's batching, on the h100-8b and a100-8b presets) or llm-d-sim (llm-d's inference simulator: each request prefilled on its own at 5ms + 250µs a token, 2-4ms a decoded token, 2,048 KV blocks, refusing what does not fit; --slow does not apply); not with --scenario or --target")
	fs.StringVar(&c.JSONFile, "json", "", "also write the results as JSON to this file")
	fs.StringVar(&c.PlotFile, "plot", "", "also draw TTFT distributions per policy to this PNG file")
	quiet := fs.Bool("quiet", false, "no progress line")
	fs.StringVar(&c.Target, "target", "", "replay over HTTP, in real time, against the balancer (or server) at this base URL instead of emulating a cluster; the lora workload needs adapters lora-00..lora-15 there")
	fs.StringVar(&c.Model, "model", "", "with --target: the base model to ask for (default: the first base model of the target's /v1/models)")
	fs.StringVar(&c.Label, "label", "target", "with --target: the name of the result's row")
	fs.BoolVar(&c.Sweep, "sweep", false, "run each workload at a ladder of arrival rates (x0.25 to x4 its default, x2 for the Mooncake traces) and print TTFT p90 and output tok/s per policy at each, the default's worst ratio to each peer, and with --plot one PNG per workload")
	fs.StringVar(&c.Rates, "rates", "", "with --sweep: comma-separated arrival-rate factors instead of the default ladder; with --replicas above 1: the replica table at each of these factors of each workload's default rate instead of at --rate")
	fs.IntVar(&c.Seeds, "seeds", 1, "with --sweep: run every point at N seeds (--seed, --seed+1, ...) and print the medians, the seeds' own ratios where the default's worst is, and at how many seeds it is more than 3% worse than each policy")
	fs.IntVar(&c.Replicas, "replicas", 1, "independent balancers in front of the cluster, each arrival to one at random; above 1 also prints the table against one replica")
	fs.DurationVar(&c.SLO.TTFT, "slo-ttft", 0, "judge each served request against a deadline to its first token, from its arrival: the tables add goodput (requests meeting every target per second) and the share of requests sent that met them (0: no target)")
	fs.DurationVar(&c.SLO.TPOT, "slo-tpot", 0, "and against a time per output token after the first, on average (0: no target)")
	fs.DurationVar(&c.SharedLedger, "shared-ledger", 0, "with --replicas: the replicas share their ledgers as through Redis, each one's picks counting the others' in-flight work as published every this interval of virtual time (100ms is the product's default publish interval; 0: off); the replica table adds a column of R replicas sharing, and --sweep runs its replicas sharing")
	fs.BoolVar(&c.KVEvents, "kv-events", false, "the emulated servers publish their KV-cache events, as vLLM does with --kv-events-config, and llmlb's default reads them (each request tokenized first, at a cost); the peers run as without")
	fs.StringVar(&c.Perturb, "perturb", "", "scale the emulated engines' costs without telling the balancer: prefill=F (prefill per token and attention), request=F (per-request intake; with llm-d-sim, the prefill overhead), decode=F (every step's own, per-sequence and per-context-token costs; with llm-d-sim, the time between tokens), tokens=F (the prompt tokens the balancer is told, as another tokenizer counts them), tokenizer=B (the engines count and cache B bytes of prompt a token, 1-16, where the balancer assumes 4 until it learns B from usage), comma-separated")
	fs.StringVar(&c.RecordFile, "record", "", "also write one JSON line per served request of each emulated run to this file: its server and reason, what every server's cache held of its prompt and the prefill work truly queued at the pick, and its time to first token (not with --sweep, --scenario or --target)")
	fs.BoolVar(&c.Calibrate, "calibrate", false, "with --trace: fit the emulated engine's prefill, per-request and decode costs to the capture's observed TTFTs and TPOTs, each request on the server standing for the backend that answered it (--backends 0: as many servers as the capture names, all h100-8b unless --slow N), and print the fitted rates and the TTFT percentiles of the capture, the preset and the fit")
	traceFiles := fs.String("trace", "", "also replay this trace, read as one from comma-separated files: a capture (capture: in llmlb's config) and its rotated files, or any trace in the Mooncake format; at its own rate (--rate 1) its table adds the row the capture recorded live")
	fs.IntVar(&c.Prefill, "prefill", 0, "compare disaggregated prefill/decode with the same servers aggregated: the first N servers of role prefill, the rest decode, one row per P/D decision, under the first --policy")
	decisions := fs.String("decisions", "", "with --prefill: comma-separated P/D decisions (always, llm-d, vllm-router, dynamo; default: all)")
	fs.StringVar(&c.Scenario, "scenario", "", "replay a published experiment and print its published figures beside ours: llm-d-kv-cache-wins, sglang-v04-shared-prefix or vllm-chunked-vs-disagg")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.Workloads, c.Policies, c.Decisions, c.TraceFiles = split(*workloads), split(*policies), split(*decisions), split(*traceFiles)
	if !*quiet {
		c.Progress = stderr
	}
	return c.Run(ctx, stdout)
}

// split returns the non-empty fields of the comma-separated list s.
func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
