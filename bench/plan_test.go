package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestPlanSearch: the search finds the fewest servers that meet, from any
// guess, and says 0 when even the most do not.
func TestPlanSearch(t *testing.T) {
	for _, need := range []int{1, 2, 3, 7, 8, 9, 31, 64, 65} {
		for _, guess := range []int{1, 2, 8, 20, 64} {
			calls := 0
			got, err := search(func(n int) (bool, error) { calls++; return n >= need, nil }, 1, guess, 64)
			want := need
			if need > 64 {
				want = 0
			}
			if err != nil || got != want {
				t.Errorf("need %d, guess %d: %d (%v), want %d", need, guess, got, err, want)
			}
			if calls > 14 {
				t.Errorf("need %d, guess %d: %d runs", need, guess, calls)
			}
		}
	}
	// No fewer than lo: lo itself meeting is the answer.
	if got, _ := search(func(n int) (bool, error) { return n >= 2, nil }, 5, 5, 64); got != 5 {
		t.Errorf("lo 5: %d", got)
	}
}

// TestPlanAnswersAreTheFewest: each answer of a small plan meets the target
// in a run of its own, one server fewer misses it, and more load never
// needs fewer servers.
func TestPlanAnswersAreTheFewest(t *testing.T) {
	o := PlanOptions{Workload: "shared-prefix", Policies: []string{DefaultPolicy, "round-robin"}, TTFTP90: 300 * time.Millisecond,
		Loads: []float64{1, 2}, Max: 16, Requests: 200, Seed: 1}
	p, err := RunPlan(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	w, err := Build("shared-prefix", Params{Rate: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	w.Requests = w.Requests[:200]
	for _, r := range p.Rows {
		if len(r.Servers) != 2 || r.Servers[0] > r.Servers[1] && r.Servers[1] != 0 {
			t.Errorf("%s: %v servers at x1 and x2", r.Policy, r.Servers)
			continue
		}
		n := r.Servers[1]
		if n == 0 {
			continue
		}
		if p90, _ := o.trial(r.Policy, w, n); p90 > 0.3 || p90 != r.TTFTP90[1] {
			t.Errorf("%s x2 on %d servers: TTFT p90 %v, the plan said %v", r.Policy, n, p90, r.TTFTP90[1])
		}
		if n > 1 {
			if p90, _ := o.trial(r.Policy, w, n-1); p90 <= 0.3 {
				t.Errorf("%s x2 on %d servers: TTFT p90 %v, within the target the plan said %d need", r.Policy, n-1, p90, n)
			}
		}
	}
	var out bytes.Buffer
	WritePlan(&out, p)
	if !strings.Contains(out.String(), "its first 200 of 3000 requests") || !strings.Contains(out.String(), "round-robin") {
		t.Errorf("plan table:\n%s", out.String())
	}
	if _, err := RunPlan(context.Background(), PlanOptions{Workload: "agentic", TTFTP90: time.Second}); err == nil || !strings.Contains(err.Error(), "turns wait") {
		t.Errorf("agentic: %v, want it refused", err)
	}
	if _, err := RunPlan(context.Background(), PlanOptions{Workload: "shared-prefix"}); err == nil {
		t.Error("a plan without a target ran")
	}
	if _, err := RunPlan(context.Background(), PlanOptions{Workload: "shared-prefix", TTFTP90: time.Second, Policies: []string{"nonesuch"}}); err == nil {
		t.Error("a plan of an unknown policy ran")
	}
}

// TestGiveUpStopsEarly: a run of too few servers stops once the requests
// late for the give-up TTFT are enough, and says so.
func TestGiveUpStopsEarly(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Cluster{Presets: []string{"h100-8b"}, Policy: DefaultPolicy, Seed: 1, GiveUp: GiveUp{TTFT: 100 * time.Millisecond, Late: 30}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if !res.GaveUp || len(res.TTFT) >= len(w.Requests)/2 {
		t.Errorf("one server, 300 requests: gave up %v after %d answered", res.GaveUp, len(res.TTFT))
	}
}
