package bench

import (
	"slices"
	"testing"

	"github.com/llmlb/llmlb/balancer"
)

// TestAblatedPoliciesRun runs every default-no-RULE policy on two small
// workloads beside the default, with two replicas that share no state
// (the placement rules agreement needs act only there), and checks that
// the rules those workloads exercise change where requests go when
// turned off. The
// rest (the miss cost's arrivals term, the KV penalty and the saturation
// knobs) act only under loads too long for a unit test; they must still
// build and run.
func TestAblatedPoliciesRun(t *testing.T) {
	exercised := []string{"copy-margin", "backlog-copy", "cold-place", "conversations", "cold-room", "class-time",
		"warm-tie", "miss", "miss-queued", "decode", "keep-holders"}
	var loads []*Workload
	for _, name := range []string{"shared-prefix", "multi-turn"} {
		w, err := Build(name, Params{Scale: 0.1, Rate: 4, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		loads = append(loads, w)
	}
	servers := func(policy string, w *Workload) []string {
		res, err := Run(Cluster{Presets: Presets(4, 1), Policy: policy, Seed: 1, Trace: true, Replicas: 2}, w)
		if err != nil {
			t.Fatalf("Run(%s, %s): %v", policy, w.Name, err)
		}
		out := make([]string, len(w.Requests))
		for _, r := range res.Trace {
			out[r.Request] = r.Server
		}
		return out
	}
	var def [][]string
	for _, w := range loads {
		def = append(def, servers(DefaultPolicy, w))
	}
	for _, name := range balancer.RuleNames() {
		if _, err := balancer.ParseRules(name); err != nil {
			t.Fatalf("ParseRules(%q): %v", name, err)
		}
		moved := 0
		for i, w := range loads {
			got := servers(AblatedPrefix+name, w)
			for r := range got {
				if got[r] != def[i][r] {
					moved++
				}
			}
		}
		t.Logf("%s off: %d requests routed elsewhere", name, moved)
		if moved == 0 && slices.Contains(exercised, name) {
			t.Errorf("%s%s routed every request as the default does; want the rule to matter", AblatedPrefix, name)
		}
	}
	for _, bad := range []string{"default-no-", "default-no-nope", "default-no-miss+nope"} {
		if _, ok, err := ablated(bad); !ok || err == nil {
			t.Errorf("ablated(%q) = _, %v, %v; want an error", bad, ok, err)
		}
	}
	if off, ok, err := ablated("default-no-miss+decode"); !ok || err != nil || off == 0 {
		t.Errorf("ablated(default-no-miss+decode) = %v, %v, %v; want two rules", off, ok, err)
	}
}
