package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// Options choose what `llmlb bench` runs.
type Options struct {
	Workloads []string // default: every built-in workload
	Policies  []string // default: DefaultPolicies()
	// Backends is the number of emulated servers (default 8); the last
	// Slow of them run the a100-8b preset, the rest h100-8b. Slow < 0
	// means none; 0 means a quarter of them.
	Backends, Slow int
	Params         Params
	Engine         string
	// EngineModel is how the emulated servers schedule and cache
	// ([Cluster.EngineModel]); with llm-d-sim every server is alike and
	// Slow is not used. (default vllm-v1)
	EngineModel string
	// Clients, when positive, also runs each workload closed-loop with
	// that many clients ([Cluster.Clients]) and reports its output tokens
	// per second as the row's Saturated throughput.
	Clients int
	// Perturb changes the engines' costs behind the balancer's back
	// ([Cluster.Perturb]).
	Perturb Perturb
	// Replicas is how many independent balancers front the cluster
	// ([Cluster.Replicas]). (default 1)
	Replicas int
	// SharedLedger, when positive, is the interval at which the replicas
	// share their ledgers ([Cluster.SharedLedger]); zero: they do not.
	SharedLedger time.Duration
	// SLO, when set, judges every served request against its targets
	// ([Cluster.SLO]): the table's goodput and attainment.
	SLO SLO
	// KVEvents: the servers publish KV-cache events and the default reads
	// them ([Cluster.KVEvents]).
	KVEvents bool
	// Loads, when set, are the workloads to run, already built (the
	// sweep's rungs); Workloads and Params are then not used to build
	// them.
	Loads []*Workload
	// Progress, if set, gets a progress line as runs finish.
	Progress io.Writer
	// Trace, if set, gets each open-loop run's [TraceRecord]s, by request,
	// once every run is done, in workload then policy order.
	Trace func(TraceRun)
	// Prefill, when positive, compares disaggregated prefill/decode with
	// the same servers aggregated instead of comparing policies: the
	// first row runs every server as role both, and each of Decisions
	// (default: every one of balancer.PDDecisions) a row with the first
	// Prefill servers of role prefill and the rest of role decode, all
	// under the first of Policies (default: the default policy).
	Prefill   int
	Decisions []string
}

// rowSpec is one row of a table: the policy it runs and, in a P/D
// comparison, the servers' roles and the P/D decision.
type rowSpec struct {
	label, policy string
	roles         []balancer.Role
	pd            *balancer.PDConfig
}

// AggregatedRow labels a P/D comparison's row of servers all of role both.
const AggregatedRow = "aggregated"

// rowSpecs are o's rows: its policies, or its P/D comparison.
func (o Options) rowSpecs() ([]rowSpec, error) {
	if o.Prefill <= 0 {
		var out []rowSpec
		for _, p := range o.Policies {
			out = append(out, rowSpec{label: p, policy: p})
		}
		return out, nil
	}
	if o.Prefill >= o.Backends {
		return nil, fmt.Errorf("bench: --prefill %d leaves no decode server of %d", o.Prefill, o.Backends)
	}
	policy := DefaultPolicy
	if len(o.Policies) > 0 {
		policy = o.Policies[0]
	}
	roles := make([]balancer.Role, o.Backends)
	for i := range roles {
		roles[i] = balancer.RoleDecode
		if i < o.Prefill {
			roles[i] = balancer.RolePrefill
		}
	}
	out := []rowSpec{{label: AggregatedRow, policy: policy}}
	names := o.Decisions
	if len(names) == 0 {
		for _, d := range balancer.PDDecisions() {
			names = append(names, d.Name)
		}
	}
	for _, name := range names {
		i := slices.IndexFunc(balancer.PDDecisions(), func(d balancer.PDDecision) bool { return d.Name == name })
		if i < 0 {
			var have []string
			for _, d := range balancer.PDDecisions() {
				have = append(have, d.Name)
			}
			return nil, fmt.Errorf("bench: unknown P/D decision %q (have %v)", name, have)
		}
		cfg := balancer.PDDecisions()[i].Config
		out = append(out, rowSpec{label: fmt.Sprintf("pd %dP%dD %s", o.Prefill, o.Backends-o.Prefill, name), policy: policy, roles: roles, pd: &cfg})
	}
	return out, nil
}

// TraceRun is one traced run: its workload, policy and replicas, and a
// record a served request in the workload's order.
type TraceRun struct {
	Workload string
	Policy   string
	Replicas int
	Records  []TraceRecord
}

// DefaultPolicy is the row of llmlb's default policy in benchmark tables:
// whatever preset balancer.DefaultConfig names (ttft), under a name that
// stays the same when the default changes, so that tables of different
// versions compare the shipped default.
const DefaultPolicy = "default"

// AblatedPrefix starts a policy name that runs the default with some of
// its rules off: "default-no-" and a "+"-separated list of
// [balancer.RuleNames], so that one sweep compares each rule's
// absence with the full default on the same arrivals (issue 46).
const AblatedPrefix = DefaultPolicy + "-no-"

// ablated returns the rules policy turns off, and whether it names an
// ablation of the default at all.
func ablated(policy string) (balancer.Rules, bool, error) {
	names, ok := strings.CutPrefix(policy, AblatedPrefix)
	if !ok {
		return 0, false, nil
	}
	off, err := balancer.ParseRules(names)
	if err != nil {
		return 0, true, fmt.Errorf("bench: policy %q: %w", policy, err)
	}
	return off, true, nil
}

// DefaultPolicies are the rows of a benchmark table: llmlb's default, every
// other preset serve runs, and those only the simulator can run (llm-d's
// precise profile, fed by KV events, and llmlb's scorer fed the true
// caches, which measures the index's error).
func DefaultPolicies() []string {
	out := []string{DefaultPolicy}
	def := balancer.DefaultConfig().Policy
	for _, p := range balancer.Presets() {
		if p.Name != def && !p.BenchOnly {
			out = append(out, p.Name)
		}
	}
	return out
}

// Presets returns the engine preset of each of n servers, slow of them
// a100-8b at the end.
func Presets(n, slow int) []string {
	if slow == 0 {
		slow = n / 4
	}
	slow = max(0, min(slow, n))
	out := make([]string, n)
	for i := range out {
		out[i] = "h100-8b"
		if i >= n-slow {
			out[i] = "a100-8b"
		}
	}
	return out
}

// serverPresets returns the preset of each of n servers of engine model:
// [Presets] for vllm-v1, and for llm-d-sim, whose servers are alike, n ×
// "llm-d-sim".
func serverPresets(model string, n, slow int) []string {
	if model == LLMDSim {
		out := make([]string, n)
		for i := range out {
			out[i] = LLMDSim
		}
		return out
	}
	return Presets(n, slow)
}

// Bench runs every workload through every policy, one run at a time per
// CPU, and returns one table per workload, rows in policy order.
func Bench(ctx context.Context, o Options) (Report, error) {
	if o.Params.Traces == nil {
		o.Params.Traces = new(Traces)
	}
	if len(o.Workloads) == 0 && o.Prefill <= 0 {
		o.Workloads = WorkloadNames()
	}
	if len(o.Policies) == 0 && o.Prefill <= 0 {
		o.Policies = DefaultPolicies()
	}
	if len(o.Workloads) == 0 && o.Prefill > 0 {
		o.Workloads = PDWorkloadNames()
	}
	if o.Backends <= 0 {
		o.Backends = 8
	}
	if err := checkEngineModel(o.EngineModel); err != nil {
		return Report{}, err
	}
	for _, p := range o.Policies {
		if err := checkPolicy(p); err != nil {
			return Report{}, err
		}
	}
	specs, err := o.rowSpecs()
	if err != nil {
		return Report{}, err
	}
	presets := serverPresets(o.EngineModel, o.Backends, o.Slow)
	var rep Report
	type job struct {
		w, p   int
		closed bool
	}
	loads := o.Loads
	if loads == nil {
		for _, name := range o.Workloads {
			w, err := Build(name, o.Params)
			if err != nil {
				return Report{}, err
			}
			loads = append(loads, w)
		}
	}
	for _, w := range loads {
		t := Table{Name: w.Name, Backends: o.Backends, Requests: len(w.Requests), Rate: w.Rate, Clients: max(0, o.Clients),
			Results: make([]Row, len(specs)), ttfts: make([][]time.Duration, len(specs)), PD: o.Prefill > 0}
		rep.Workloads = append(rep.Workloads, t)
	}
	traces := make([][]TraceRun, len(loads)) // by workload, then policy
	for i := range traces {
		traces[i] = make([]TraceRun, len(specs))
	}
	jobs := make(chan job)
	var mu sync.Mutex
	var firstErr error
	passes := 1
	if o.Clients > 0 {
		passes = 2
	}
	done, total := 0, passes*len(loads)*len(specs)
	start := time.Now()
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for j := range jobs {
				spec := specs[j.p]
				c := Cluster{Presets: presets, EngineModel: o.EngineModel, Engine: o.Engine, Policy: spec.policy, Seed: o.Params.Seed, Replicas: o.Replicas, Perturb: o.Perturb, KVEvents: o.KVEvents,
					Roles: spec.roles, SharedLedger: o.SharedLedger, SLO: o.SLO}
				if spec.pd != nil {
					bcfg := balancer.DefaultConfig()
					bcfg.PD = *spec.pd
					c.Balancer = &bcfg
				}
				if j.closed {
					c.Clients = o.Clients
				}
				c.Trace = o.Trace != nil && !j.closed
				res, err := Run(c, loads[j.w])
				res.Policy = spec.label
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("bench: %s with %s: %w", loads[j.w].Name, spec.label, err)
				}
				row := &rep.Workloads[j.w].Results[j.p]
				if j.closed {
					row.Saturated = Summarize(res).Throughput
				} else {
					sat := row.Saturated // the closed-loop run may have ended first
					*row = Summarize(res)
					row.Saturated = sat
					slices.Sort(res.TTFT)
					rep.Workloads[j.w].ttfts[j.p] = res.TTFT
				}
				if c.Trace && err == nil {
					slices.SortFunc(res.Trace, func(a, b TraceRecord) int { return a.Request - b.Request })
					traces[j.w][j.p] = TraceRun{Workload: loads[j.w].Name, Policy: spec.label, Replicas: max(1, o.Replicas), Records: res.Trace}
				}
				done++
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "\rbench: %d/%d runs (%s, %s) %s   ", done, total, loads[j.w].Name, spec.label, time.Since(start).Round(time.Second))
				}
				mu.Unlock()
			}
		})
	}
	// The longest runs first, so that the last to finish is a short one:
	// a run's cost grows with its prompt tokens and its arrival rate.
	order := make([]int, len(loads))
	cost := make([]float64, len(loads))
	for i, w := range loads {
		order[i] = i
		for r := range w.Requests {
			cost[i] += float64(w.Requests[r].Tokens())
		}
		if !math.IsInf(w.Rate, 0) {
			cost[i] *= w.Rate
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return cost[order[a]] > cost[order[b]] })
feed:
	for pass := range passes {
		for _, wi := range order {
			for pi := range specs {
				select {
				case jobs <- job{wi, pi, pass == 1}:
				case <-ctx.Done():
					break feed
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	if o.Progress != nil {
		fmt.Fprintln(o.Progress)
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if o.Trace != nil && firstErr == nil {
		for _, runs := range traces {
			for _, run := range runs {
				o.Trace(run)
			}
		}
	}
	return rep, firstErr
}
