package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"

	"github.com/llmlb/llmlb/balancer"
)

// PDExperiment is a published comparison of disaggregated prefill/decode
// with the same GPUs aggregated, replayed on the emulated cluster: mean
// TTFT and mean inter-token latency at each load, published and ours.
type PDExperiment struct {
	Name, Source string
	Servers      []string // engine preset of each server; the first prefills when disaggregated
	Policy       string   // the aggregated fleet's policy, as the source spread requests
	Points       []PDPublished
	build        func(p Params, qps float64, rng *rand.Rand) *Workload
}

// PDPublished is one load's published means, in milliseconds.
type PDPublished struct {
	QPS                   float64
	AggTTFT, AggITL       float64
	DisaggTTFT, DisaggITL float64
}

// PDExperimentRow is one load, published and ours (milliseconds).
type PDExperimentRow struct {
	PDPublished
	OursAggTTFT    float64 `json:"ours_agg_ttft_ms"`
	OursAggITL     float64 `json:"ours_agg_itl_ms"`
	OursDisaggTTFT float64 `json:"ours_disagg_ttft_ms"`
	OursDisaggITL  float64 `json:"ours_disagg_itl_ms"`
}

// PDExperiments lists the published P/D comparisons `llmlb bench
// --scenario` replays.
func PDExperiments() []PDExperiment {
	return []PDExperiment{{
		Name: "vllm-chunked-vs-disagg",
		Source: "vllm-project/vllm benchmarks/disagg_benchmarks/results/chunk_vs_disagg.yaml @ 5ac5249d, the rows of output_len 12 " +
			"(Llama-3.1-8B, 1,024-token sonnet prompts with a 50-token shared prefix, 100 requests at each QPS, as " +
			"benchmarks/disagg_benchmarks/disagg_performance_benchmark.sh @ fc10a049 runs them; GPUs not stated): two chunked-prefill " +
			"servers behind a round-robin proxy against one prefill and one decode server",
		Servers: repeat("h100-8b", 2),
		Policy:  "round-robin",
		Points: []PDPublished{
			{2, 197.25, 35.31, 152.88, 21.32},
			{4, 229.26, 41.50, 199.60, 22.99},
			{8, 379.73, 63.58, 508.87, 29.12},
			{16, 4792.68, 438.79, 10359.52, 38.97},
		},
		build: vllmSonnet,
	}}
}

// lookupPDExperiment returns the named P/D experiment.
func lookupPDExperiment(name string) (PDExperiment, bool) {
	for _, e := range PDExperiments() {
		if e.Name == name {
			return e, true
		}
	}
	return PDExperiment{}, false
}

// vllmSonnet is benchmark_serving's sonnet dataset as vLLM's disagg
// benchmark asks for it: 100 prompts of 1,024 tokens whose first 50 are
// the same, 12 output tokens, Poisson arrivals at qps (its default
// burstiness). Scale multiplies the prompts.
func vllmSonnet(p Params, qps float64, rng *rand.Rand) *Workload {
	n := max(1, int(100*p.Scale))
	w := &Workload{Rate: 1}
	for i, t := range poisson(rng, n, qps) {
		w.Requests = append(w.Requests, Request{At: t, MaxTokens: 12,
			Parts: []Part{{ID: 23 << 32, Tokens: 50}, {ID: 24<<32 + uint64(i), Tokens: 974}}})
	}
	return w
}

// RunPDExperiment replays e at each published load, aggregated and
// disaggregated (every request split, as the source's proxy does).
func RunPDExperiment(ctx context.Context, e PDExperiment, p Params, progress io.Writer) ([]PDExperimentRow, error) {
	if p.Scale <= 0 {
		p.Scale = 1
	}
	roles := make([]balancer.Role, len(e.Servers))
	for i := range roles {
		roles[i] = balancer.RoleDecode
	}
	roles[0] = balancer.RolePrefill
	bcfg := balancer.DefaultConfig()
	bcfg.PD = balancer.PDConfig{} // always
	out := make([]PDExperimentRow, len(e.Points))
	for i, pt := range e.Points {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		w := e.build(p, pt.QPS, rand.New(rand.NewPCG(p.Seed, 0x5eed)))
		w.Name = e.Name
		sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].At < w.Requests[j].At })
		agg, err := Run(Cluster{Presets: e.Servers, Policy: e.Policy, Seed: p.Seed}, w)
		if err != nil {
			return out, err
		}
		dis, err := Run(Cluster{Presets: e.Servers, Policy: e.Policy, Seed: p.Seed, Roles: roles, Balancer: &bcfg}, w)
		if err != nil {
			return out, err
		}
		out[i] = PDExperimentRow{PDPublished: pt,
			OursAggTTFT: 1000 * mean(agg.TTFT), OursAggITL: 1000 * mean(agg.TPOT),
			OursDisaggTTFT: 1000 * mean(dis.TTFT), OursDisaggITL: 1000 * mean(dis.TPOT)}
		if progress != nil {
			fmt.Fprintf(progress, "scenario %s: %g QPS done\n", e.Name, pt.QPS)
		}
	}
	return out, nil
}

// WritePDExperiment prints each load's published and measured means and
// their ratios, aggregated over disaggregated, and whether each ratio
// falls on the same side of 1 as the published one.
func WritePDExperiment(w io.Writer, e PDExperiment, rows []PDExperimentRow) {
	fmt.Fprintf(w, "\n%s: %d servers (%s), aggregated by %s against 1 prefill + %d decode\nsource: %s\n",
		e.Name, len(e.Servers), e.Servers[0], e.Policy, len(e.Servers)-1, e.Source)
	ms := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	ratio := func(a, b float64) string { return fmt.Sprintf("%.2f", a/b) }
	side := func(pub, ours float64) string {
		if (pub > 1) == (ours > 1) {
			return "same"
		}
		return "OPPOSITE"
	}
	t := [][]string{{"qps", "ttft ms agg/disagg published", "ratio", "ours", "ratio", "direction", "itl ms agg/disagg published", "ratio", "ours", "ratio", "direction"}}
	for _, r := range rows {
		t = append(t, []string{fmt.Sprint(r.QPS),
			ms(r.AggTTFT) + "/" + ms(r.DisaggTTFT), ratio(r.AggTTFT, r.DisaggTTFT),
			ms(r.OursAggTTFT) + "/" + ms(r.OursDisaggTTFT), ratio(r.OursAggTTFT, r.OursDisaggTTFT),
			side(r.AggTTFT/r.DisaggTTFT, r.OursAggTTFT/r.OursDisaggTTFT),
			ms(r.AggITL) + "/" + ms(r.DisaggITL), ratio(r.AggITL, r.DisaggITL),
			ms(r.OursAggITL) + "/" + ms(r.OursDisaggITL), ratio(r.OursAggITL, r.OursDisaggITL),
			side(r.AggITL/r.DisaggITL, r.OursAggITL/r.OursDisaggITL)})
	}
	writeAligned(w, t)
}

// pdExperimentNames lists the P/D experiments' names, for errors.
func pdExperimentNames() []string {
	var out []string
	for _, e := range PDExperiments() {
		out = append(out, e.Name)
	}
	return out
}
