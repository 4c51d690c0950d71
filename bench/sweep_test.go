package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMergeSeedsTakesMedians: three seeds' sweeps merge into one whose
// rows hold each figure's median (a time no request had ignored) and
// each seed's own TTFT p90 and throughput; the summary counts the seeds
// at which the default is more than 3% worse.
func TestMergeSeedsTakesMedians(t *testing.T) {
	run := func(dp90, dtok, pp90, ptok float64) []Curve {
		return []Curve{{Name: "w", Tables: []Table{{Name: "w", Rate: 1, Results: []Row{
			{Policy: "default", TTFTP90: dp90, Throughput: dtok, Refused: int(dtok)},
			{Policy: "peer", TTFTP90: pp90, Throughput: ptok},
		}}}}}
	}
	merged := MergeSeeds([][]Curve{
		run(1.0, 100, 0.5, 100), // 2x worse
		run(0.4, 110, 0.5, 100), // better
		run(math.NaN(), 90, 0.6, 100),
	})
	d, p := merged[0].Tables[0].Results[0], merged[0].Tables[0].Results[1]
	if d.TTFTP90 != 0.7 || d.Throughput != 100 || d.Refused != 100 || p.TTFTP90 != 0.5 || p.Throughput != 100 {
		t.Errorf("medians: default %+v, peer %+v", d, p)
	}
	if len(d.TTFTP90s) != 3 || d.TTFTP90s[0] != 1 || !math.IsNaN(d.TTFTP90s[2]) || !slices.Equal(d.Throughputs, []float64{100, 110, 90}) {
		t.Errorf("by seed: %v %v", d.TTFTP90s, d.Throughputs)
	}
	// JSON: a time no request had is null, each field once.
	b, err := json.Marshal(Row{Policy: "x", TTFTP50: math.NaN(), TTFTP90: 1, TTFTP90s: []float64{1, math.NaN()}, Throughputs: []float64{2, 3}})
	if err != nil || !strings.Contains(string(b), `"ttft_p50":null`) || !strings.Contains(string(b), `"ttft_p90":1,`) ||
		!strings.Contains(string(b), `"ttft_p90_by_seed":[1,null]`) || strings.Count(string(b), `"ttft_p90"`) != 1 {
		t.Errorf("%s %v", b, err)
	}
	var out strings.Builder
	WriteSweep(&out, merged)
	for _, want := range []string{"summary over 3 seeds", "1.40", "0.80-2.00", "2 of 3"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("sweep lacks %q:\n%s", want, out.String())
		}
	}
	if one := [][]Curve{run(1, 1, 1, 1)}; len(MergeSeeds(one)) != 1 || MergeSeeds(one)[0].Tables[0].Results[0].TTFTP90s != nil {
		t.Error("one run is not returned as it is")
	}
}

// TestSummarizeTakesTheMeanTTFT: a row carries the mean time to first
// token beside its percentiles, in JSON too (null when no request had
// one), and a merged row its median over the seeds.
func TestSummarizeTakesTheMeanTTFT(t *testing.T) {
	r := Summarize(Result{Policy: "x", TTFT: []time.Duration{6 * time.Second, time.Second, 2 * time.Second}})
	if r.TTFTMean != 3 || r.TTFTP50 != 2 {
		t.Errorf("mean %g, p50 %g; want 3 and 2", r.TTFTMean, r.TTFTP50)
	}
	if b, err := json.Marshal(r); err != nil || !strings.Contains(string(b), `"ttft_mean":3,`) {
		t.Errorf("%s %v", b, err)
	}
	if b, err := json.Marshal(Summarize(Result{Policy: "none"})); err != nil || !strings.Contains(string(b), `"ttft_mean":null`) {
		t.Errorf("no request: %s %v", b, err)
	}
	m := MergeSeeds([][]Curve{
		{{Name: "w", Tables: []Table{{Results: []Row{{Policy: "x", TTFTMean: 1}}}}}},
		{{Name: "w", Tables: []Table{{Results: []Row{{Policy: "x", TTFTMean: 5}}}}}},
		{{Name: "w", Tables: []Table{{Results: []Row{{Policy: "x", TTFTMean: 2}}}}}},
	})
	if got := m[0].Tables[0].Results[0].TTFTMean; got != 2 {
		t.Errorf("merged mean %g, want the median 2", got)
	}
}

// TestPairedRatioTellsAGapFromNoise: the summary's paired interval
// excludes 1 where the default is worse at every seed by a similar
// margin, holds 1 where the seeds split, and is left out with fewer than
// minPaired seeds; WriteSweep prints it once enough seeds are merged.
func TestPairedRatioTellsAGapFromNoise(t *testing.T) {
	var d, p, split []float64
	for k := range 12 {
		p = append(p, 1+float64(k)/10) // the seeds' own luck: up to 2x
		d = append(d, p[k]*(1.05+float64(k%3)/100))
		split = append(split, p[k]*(1+0.1*float64(1-2*(k%2))))
	}
	med, lo, hi, ok := pairedRatio(d, p)
	if !ok || med < 1.05 || med > 1.07 || lo <= 1 || hi > 1.08 || lo > med || hi < med {
		t.Errorf("worse at every seed: %.3f (%.3f-%.3f) %v, want about 1.06 and an interval above 1", med, lo, hi, ok)
	}
	if med, lo, hi, ok := pairedRatio(split, p); !ok || lo >= 1 || hi <= 1 {
		t.Errorf("seeds split: %.3f (%.3f-%.3f) %v, want an interval holding 1", med, lo, hi, ok)
	}
	withNaN := slices.Clone(d)
	withNaN[0] = math.NaN()
	if _, _, _, ok := pairedRatio(withNaN[:minPaired], p[:minPaired]); ok {
		t.Error("an interval from fewer than minPaired seeds")
	}
	a, b, c, _ := pairedRatio(d, p)
	if a != med || b != lo || c != hi {
		t.Error("the interval differs between two calls")
	}
	var runs [][]Curve
	for k := range d {
		runs = append(runs, []Curve{{Name: "w", Tables: []Table{{Name: "w", Rate: 1, Results: []Row{
			{Policy: "default", TTFTP90: d[k], Throughput: 100},
			{Policy: "peer", TTFTP90: p[k], Throughput: 100},
		}}}}})
	}
	var out strings.Builder
	WriteSweep(&out, MergeSeeds(runs))
	for _, want := range []string{"summary over 12 seeds", "paired TTFT p90 (95%)", fmt.Sprintf("%.3f (%.3f-%.3f)", med, lo, hi), "1.000 (1.000-1.000)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("sweep lacks %q:\n%s", want, out.String())
		}
	}
}

// A policy sustains the highest rate up to which it attains 90% at every
// rate; one that never does sustains none.
func TestAttainmentSustainedRate(t *testing.T) {
	table := func(rate float64, a, b float64) Table {
		return Table{Rate: rate, Results: []Row{{Policy: "a", SLO: true, Attainment: a}, {Policy: "b", SLO: true, Attainment: b}}}
	}
	c := Curve{Name: "w", Tables: []Table{table(0.5, 0.95, 0.5), table(1, 0.92, 0.95), table(2, 0.5, 0.95)}}
	var out strings.Builder
	writeAttainment(&out, c)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.HasSuffix(strings.TrimSpace(lines[2]), "x1") || !strings.HasSuffix(strings.TrimSpace(lines[3]), "-") {
		t.Errorf("sustained rates:\n%s\nwant a at x1 and b at none (it misses at x0.5)", out.String())
	}
}

// The seeds' median row keeps every figure a row has, TPOT and the P/D
// split among them (they were dropped), and the seeds' own TTFT p90s.
func TestMedianRowKeepsEveryFigure(t *testing.T) {
	rows := []Row{
		{TTFTP90: 1, TPOTP50: 0.01, TPOTP90: 0.02, Split: 10, Goodput: 5, Attainment: 0.9, SLO: true, EstimateError: 0.1, EstimateRatio: 1.1},
		{TTFTP90: 3, TPOTP50: 0.03, TPOTP90: 0.04, Split: 30, Goodput: 7, Attainment: 0.7, SLO: true, EstimateError: 0.3, EstimateRatio: 1.3},
		{TTFTP90: 2, TPOTP50: 0.02, TPOTP90: 0.03, Split: 20, Goodput: 6, Attainment: 0.8, SLO: true, EstimateError: 0.2, EstimateRatio: 1.2},
	}
	m := medianRow("p", rows)
	if m.TTFTP90 != 2 || m.TPOTP50 != 0.02 || m.TPOTP90 != 0.03 || m.Split != 20 || m.Goodput != 6 || m.Attainment != 0.8 || !m.SLO ||
		m.EstimateError != 0.2 || m.EstimateRatio != 1.2 || len(m.TTFTP90s) != 3 {
		t.Errorf("median row %+v", m)
	}
}
