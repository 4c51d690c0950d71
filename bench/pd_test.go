package bench

import (
	"strings"
	"testing"

	"github.com/llmlb/llmlb/balancer"
)

// pdCluster is n h100-8b servers, the first prefill of role prefill and
// the rest decode, deciding as the named peer does.
func pdCluster(t *testing.T, n, prefill int, decision string) Cluster {
	t.Helper()
	o := Options{Backends: n, Prefill: prefill, Decisions: []string{decision}}
	specs, err := o.rowSpecs()
	if err != nil {
		t.Fatal(err)
	}
	bcfg := balancer.DefaultConfig()
	bcfg.PD = *specs[1].pd
	return Cluster{Presets: Presets(n, -1), Seed: 1, Roles: specs[1].roles, Balancer: &bcfg}
}

// TestPDSplitsAndReleases: on a fleet of one prefill and two decode
// servers that splits every request, every request takes a prefill leg on
// the prefill server and is answered by a decode server, which finds the
// prompt's KV cache there (the transfer filled it: it prefills at most the
// last partial block); and both legs' accounting is released.
func TestPDSplitsAndReleases(t *testing.T) {
	w, err := Build("long-prompt", Params{Scale: 0.03, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	c := pdCluster(t, 3, 1, "always")
	c.Trace = true
	res, bal, err := runWith(c, w)
	if err != nil {
		t.Fatal(err)
	}
	n := len(w.Requests)
	if len(res.TTFT) != n || res.Split != n || res.Failed+res.Refused != 0 {
		t.Fatalf("%d served, %d split, %d failed, %d refused of %d", len(res.TTFT), res.Split, res.Failed, res.Refused, n)
	}
	if res.PerBackend[0] != n || res.PerBackend[1]+res.PerBackend[2] != n {
		t.Errorf("legs per server %v, want %d prefill legs on the first and %d decodes on the others", res.PerBackend, n, n)
	}
	for _, tr := range res.Trace {
		if tr.Server == "" || tr.Server == "sim-00-h100-8b" {
			t.Errorf("request %d answered by %q, not a decode server", tr.Request, tr.Server)
		}
		if tr.CachedTokens < tr.PromptTokens-16 {
			t.Errorf("request %d: the decode server found %d of %d prompt tokens cached; the transfer should have brought all full blocks", tr.Request, tr.CachedTokens, tr.PromptTokens)
		}
	}
	if len(res.TPOT) == 0 {
		t.Error("no TPOT recorded")
	}
	for _, be := range bal.Snapshot().Backends {
		if in := be.Ledger.InFlight(); in != 0 {
			t.Errorf("%s still has %d in flight", be.ID, in)
		}
		if r, tok := be.Ledger.Pending(); r != 0 || tok != 0 {
			t.Errorf("%s still has %d requests, %d tokens pending", be.ID, r, tok)
		}
	}
}

// TestPDDecisionKeepsShortLocal: with vLLM router's threshold, a chat
// whose decode server holds its system prompt and lacks fewer than 256
// tokens is answered there alone, while documents split; llm-d's 16
// tokens split them all; an aggregated fleet splits none.
func TestPDDecisionKeepsShortLocal(t *testing.T) {
	w, err := Build("mixed", Params{Scale: 0.04, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	split := map[string]int{}
	for _, d := range []string{"llm-d", "vllm-router"} {
		res, err := Run(pdCluster(t, 4, 2, d), w)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.TTFT) != len(w.Requests) {
			t.Fatalf("%s: %d of %d served", d, len(res.TTFT), len(w.Requests))
		}
		split[d] = res.Split
	}
	agg, err := Run(Cluster{Presets: Presets(4, -1), Seed: 1}, w)
	if err != nil {
		t.Fatal(err)
	}
	docs := 0
	for _, q := range w.Requests {
		if q.Tokens() >= 6000 {
			docs++
		}
	}
	if agg.Split != 0 || split["vllm-router"] < docs || split["vllm-router"] >= split["llm-d"] || split["llm-d"] != len(w.Requests) {
		t.Errorf("split: aggregated %d, vllm-router %d, llm-d %d, of %d requests with %d documents", agg.Split, split["vllm-router"], split["llm-d"], len(w.Requests), docs)
	}
}

// TestPDExperimentRuns: the replay of vLLM's chunked-against-disaggregated
// benchmark measures both fleets at every published load, and prints a
// row for each with the direction of each ratio.
func TestPDExperimentRuns(t *testing.T) {
	e, ok := lookupPDExperiment("vllm-chunked-vs-disagg")
	if !ok {
		t.Fatal("vllm-chunked-vs-disagg not found")
	}
	rows, err := RunPDExperiment(t.Context(), e, Params{Scale: 0.3, Seed: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		for _, v := range []float64{r.OursAggTTFT, r.OursAggITL, r.OursDisaggTTFT, r.OursDisaggITL} {
			if !(v > 0) {
				t.Errorf("%g QPS: a mean of %v", r.QPS, v)
			}
		}
	}
	var b strings.Builder
	WritePDExperiment(&b, e, rows)
	if got := strings.Count(b.String(), "same") + strings.Count(b.String(), "OPPOSITE"); got != 2*len(e.Points) {
		t.Errorf("%d directions printed, want %d:\n%s", got, 2*len(e.Points), b.String())
	}
}
