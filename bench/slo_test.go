package bench

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestSLOMixedShape: slo-mixed is three interactive chats in four, each
// with its own targets, on eight shared system prompts, and one sheddable
// batch document without targets, at Poisson arrivals of 30 a second; it
// runs only when named.
func TestSLOMixedShape(t *testing.T) {
	w, err := Build("slo-mixed", Params{Scale: 0.5, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(WorkloadNames(), w.Name) || !slices.Contains(otherWorkloadNames, w.Name) {
		t.Errorf("slo-mixed runs by default, or is not listed as a workload run when named")
	}
	if !w.OwnTargets() {
		t.Error("slo-mixed's requests carry no targets of their own")
	}
	interactive, systems := 0, map[uint64]bool{}
	for i, q := range w.Requests {
		switch q.Priority {
		case 0:
			interactive++
			systems[q.Parts[0].ID] = true
			if q.SLO != (SLO{TTFT: 250 * time.Millisecond, TPOT: 50 * time.Millisecond}) || q.Parts[0].Tokens != 1000 ||
				q.Tokens() < 1100 || q.Tokens() > 1600 || q.MaxTokens < 50 || q.MaxTokens > 300 {
				t.Fatalf("request %d, interactive: %+v", i, q)
			}
		case -1:
			if q.SLO.set() || len(q.Parts) != 1 || q.Tokens() < 4000 || q.Tokens() > 8000 || q.MaxTokens < 200 || q.MaxTokens > 600 {
				t.Fatalf("request %d, batch: %+v", i, q)
			}
		default:
			t.Fatalf("request %d has priority %d", i, q.Priority)
		}
	}
	n := len(w.Requests)
	if share := float64(interactive) / float64(n); math.Abs(share-0.75) > 0.04 {
		t.Errorf("%.2f of the requests are interactive, want 0.75", share)
	}
	if len(systems) != 8 {
		t.Errorf("the interactive requests share %d system prompts, want 8", len(systems))
	}
	if perSecond := float64(n) / w.Requests[n-1].At.Seconds(); math.Abs(perSecond-30) > 3 {
		t.Errorf("%.1f arrivals a second, want 30", perSecond)
	}
}

// TestOwnTargetsJudgeEachRequest: in a workload whose requests carry
// their own targets each is judged by its own, a request without any
// meets them if served, and the run's targets are not used.
func TestOwnTargetsJudgeEachRequest(t *testing.T) {
	w := &Workload{Name: "own", Rate: 1}
	for i, slo := range []SLO{{TTFT: time.Hour, TPOT: time.Hour}, {TTFT: time.Nanosecond}, {}, {}} {
		w.Requests = append(w.Requests, Request{At: time.Duration(i) * time.Second, Parts: []Part{{ID: 90<<32 + uint64(i), Tokens: 500}}, MaxTokens: 20, SLO: slo})
	}
	res, err := Run(Cluster{Presets: Presets(2, -1), Seed: 1, SLO: SLO{TTFT: time.Nanosecond}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Met != 3 || res.Targeted != 2 || res.TargetedMet != 1 {
		t.Errorf("met %d, %d of %d with targets; want 3 met, 1 of the 2 with targets", res.Met, res.TargetedMet, res.Targeted)
	}
	row := Summarize(res)
	if !row.SLO || !row.OwnTargets || row.Attainment != 0.75 || row.InteractiveAttainment != 0.5 {
		t.Errorf("row: slo %v, own %v, attained %v, interactive %v; want true, true, 0.75, 0.5", row.SLO, row.OwnTargets, row.Attainment, row.InteractiveAttainment)
	}
}

// TestDefaultActsOnRequestTargets: the bench hands each request's
// priority and TTFT deadline to the balancer as the proxy does, so the
// default refuses a sheddable request whose deadline no server can meet
// and serves one of priority 0 whatever its deadline; told neither, or
// under a peer with no SLO behaviour, it serves both.
func TestDefaultActsOnRequestTargets(t *testing.T) {
	w := &Workload{Name: "deadlines", Rate: 1}
	for i := range 20 {
		q := Request{At: time.Duration(i) * 100 * time.Millisecond, Parts: []Part{{ID: 91<<32 + uint64(i), Tokens: 2000}}, MaxTokens: 20,
			SLO: SLO{TTFT: time.Microsecond}}
		if i%2 == 0 {
			q.Priority = -1
		}
		w.Requests = append(w.Requests, q)
	}
	for _, tc := range []struct {
		name        string
		c           Cluster
		wantRefused int
	}{
		{"default", Cluster{}, 10},
		{"default told nothing", Cluster{HideTargets: true}, 0},
		{"round-robin", Cluster{Policy: "round-robin"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			c.Presets, c.Seed = Presets(2, -1), 1
			res, err := Run(c, w)
			if err != nil {
				t.Fatal(err)
			}
			if res.Refused != tc.wantRefused || len(res.TTFT) != 20-tc.wantRefused || res.Met != 0 {
				t.Errorf("refused %d, served %d, met %d; want %d refused, the rest served, none met", res.Refused, len(res.TTFT), res.Met, tc.wantRefused)
			}
		})
	}
}

// TestSLOMixedDeadlinesSteerTheDefault: on slo-mixed under load, the
// default told the interactive requests' deadlines sends some of them to
// the server that misses by least (reason deadline), and told none, never.
func TestSLOMixedDeadlinesSteerTheDefault(t *testing.T) {
	w, err := Build("slo-mixed", Params{Scale: 0.1, Seed: 1, Rate: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, hide := range []bool{false, true} {
		res, err := Run(Cluster{Presets: Presets(4, 0), Seed: 1, HideTargets: hide, Trace: true}, w)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range res.Trace {
			if r.Reason == "deadline" {
				n++
			}
		}
		if (n > 0) == hide {
			t.Errorf("targets hidden %v: %d picks by deadline", hide, n)
		}
	}
}
