package balancer

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestSLOHeadroomTierFilter: llm-d's tier filter keeps the candidates
// that meet the deadline, those that miss it one pick in a hundred, and
// every candidate when all are in one tier.
func TestSLOHeadroomTierFilter(t *testing.T) {
	const explore, stay = 0, ^uint64(0) // a draw below 0.01, and one above
	for _, tc := range []struct {
		name     string
		headroom []float64
		draw     uint64
		want     []int
	}{
		{"meets are kept", []float64{0.1, -0.2, 0, -0.05}, stay, []int{0, 2}},
		{"one in a hundred explores the misses", []float64{0.1, -0.2, 0, -0.05}, explore, []int{1, 3}},
		{"all miss", []float64{-0.1, -0.2}, explore, []int{0, 1}},
		{"all meet", []float64{0.1, 0.2}, explore, []int{0, 1}},
		{"one candidate", []float64{-1}, stay, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &SLOHeadroomPicker{rand: func() uint64 { return tc.draw }}
			keep := make([]int, len(tc.headroom))
			for i := range keep {
				keep[i] = i
			}
			if got := s.tierFilter(keep, tc.headroom); !slices.Equal(got, tc.want) {
				t.Errorf("tierFilter(%v) = %v, want %v", tc.headroom, got, tc.want)
			}
		})
	}
}

// TestSLOLatencyWeights: llm-d's latency scorer, strategy least: among
// candidates that meet the deadline the one closest to it weighs most;
// when all miss, the idle ones alone, the least late first.
func TestSLOLatencyWeights(t *testing.T) {
	cands := []Candidate{{InFlight: 3}, {InFlight: 1}, {InFlight: 0}, {InFlight: 2}}
	p := &PickInfo{Cands: cands}
	keep := []int{0, 1, 2, 3}
	for _, tc := range []struct {
		name     string
		headroom []float64
		want     []float64
	}{
		{"closest to the deadline wins", []float64{0.9, 0.1, -0.5, 0.5}, []float64{0.01, 1.01, 0, 0.51}},
		{"idle first when all miss", []float64{-0.1, -0.2, -3, -0.4}, []float64{0, 0, 0.51, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := latencyWeights(p, keep, tc.headroom); !slices.Equal(got, tc.want) {
				t.Errorf("latencyWeights(%v) = %v, want %v", tc.headroom, got, tc.want)
			}
		})
	}
	busy := &PickInfo{Cands: []Candidate{{InFlight: 1}, {InFlight: 1}, {InFlight: 1}}}
	if got, want := latencyWeights(busy, []int{0, 1, 2}, []float64{-3, -1, -2}), []float64{0.01, 1.01, 0.51}; !slices.Equal(got, want) {
		t.Errorf("none idle: latencyWeights = %v, want %v", got, want)
	}
}

// TestSLOAffinityFilter: the prefix-cache affinity filters keep the
// candidates holding the threshold's share of the prompt, unless the
// fastest of them is predicted more than 5 s behind the fastest other.
func TestSLOAffinityFilter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		matched []int
		prefill []float64
		want    []int
	}{
		{"holders", []int{100, 80, 10}, []float64{1, 1, 0.1}, []int{0}},
		{"holders too slow", []int{100, 80, 10}, []float64{6, 6, 0.5}, []int{0, 1, 2}},
		{"none holds", []int{50, 0, 10}, []float64{1, 1, 1}, []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &PickInfo{PromptBlocks: 100}
			for i := range tc.matched {
				p.Cands = append(p.Cands, Candidate{MatchedBlocks: tc.matched[i], Prefill: tc.prefill[i]})
			}
			if got := affinityFilter(p, []int{0, 1, 2}, strictAffinity); !slices.Equal(got, tc.want) {
				t.Errorf("affinityFilter(%v) = %v, want %v", tc.matched, got, tc.want)
			}
		})
	}
	p := &PickInfo{PromptBlocks: 100, Cands: []Candidate{{MatchedBlocks: 100}, {MatchedBlocks: 80}, {MatchedBlocks: 10}}}
	if got, want := affinityFilter(p, []int{0, 1, 2}, looseAffinity), []int{0, 1}; !slices.Equal(got, want) {
		t.Errorf("loose affinityFilter = %v, want %v", got, want)
	}
}

// TestSLOPresetAdmitsAsLlmd: under llm-d-slo a sheddable request whose
// deadline no backend is predicted to meet is refused, as llm-d's latency
// SLO admitter refuses it, unless a backend is idle or cold; a request of
// priority 0, or one without a deadline, is always picked.
func TestSLOPresetAdmitsAsLlmd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		specs    []Spec
		priority int
		deadline time.Duration
		want     error
	}{
		{"sheddable, none meets", []Spec{ready("a", 4, 8, 0.5), ready("b", 4, 8, 0.5)}, -1, time.Microsecond, ErrDeadline},
		{"sheddable, one idle", []Spec{ready("a", 4, 8, 0.5), ready("b", 0, 0, 0.5)}, -1, time.Microsecond, nil},
		{"sheddable, one cold", []Spec{ready("a", 4, 8, 0.5), ready("b", 4, 8, 0.01)}, -1, time.Microsecond, nil},
		{"sheddable, met", []Spec{ready("a", 4, 8, 0.5), ready("b", 4, 8, 0.5)}, -1, time.Hour, nil},
		{"sheddable, no deadline", []Spec{ready("a", 4, 8, 0.5), ready("b", 4, 8, 0.5)}, -1, 0, nil},
		{"priority 0, none meets", []Spec{ready("a", 4, 8, 0.5), ready("b", 4, 8, 0.5)}, 0, time.Microsecond, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBal(t, "llm-d-slo")
			b.Update(tc.specs...)
			req := &Request{Model: "m", Prompt: []byte("a prompt of some length"), PromptTokens: 2000, Priority: tc.priority, TTFTDeadline: tc.deadline}
			d, err := b.Pick(req, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Pick = %v, want %v", err, tc.want)
			}
			if err == nil && d.TTFT <= 0 {
				t.Errorf("Pick's TTFT estimate = %v, want the prediction", d.TTFT)
			}
		})
	}
}

// TestSLOPresetPacksUnderTheDeadline: llm-d-slo sends a request to the
// backend predicted to meet its deadline by least (1.12 s against 0.12 s
// and 20.12 s: it packs work onto busy servers while they meet it), to
// the only one that meets a tighter deadline, both but for the tier
// filter's exploration, one pick in a hundred.
func TestSLOPresetPacksUnderTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		deadline time.Duration
		want     string
	}{
		{2 * time.Second, "busy"},
		{500 * time.Millisecond, "idle"},
	} {
		b := newBal(t, "llm-d-slo")
		b.Update(ready("busy", 10, 4, 0.3), ready("idle", 0, 0, 0.1), ready("slow", 200, 8, 0.5))
		got := 0
		const n = 200
		for i := range n {
			req := &Request{Model: "m", PromptTokens: 1000, TTFTDeadline: tc.deadline, Prompt: []byte{byte(i), byte(i >> 8), 'x'}}
			d, err := b.Pick(req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.Candidates[0].ID == tc.want {
				got++
			}
		}
		if got < n*95/100 {
			t.Errorf("deadline %v: %d of %d picks went to %s, want all but about 1%%", tc.deadline, got, n, tc.want)
		}
	}
}
