package balancer

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// testPrior is the prior of a config with inverse rate inv and base base.
func testPrior(inv, base float64) *[numTerms]float64 {
	cfg := DefaultConfig().TTFT
	cfg.PrefillRate, cfg.BaseLatency = 1/inv, time.Duration(base*float64(time.Second))
	p := prior(&cfg)
	return &p
}

// near2 reports whether got is within tol (relative) of want.
func near2(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

func TestEstimateLearnsRateAndBase(t *testing.T) {
	var e firstTokenLearner
	// A backend doing 5000 tokens/s with 50ms fixed latency.
	for i := range 60 {
		work := float64(500 + 100*(i%20))
		e.observe(firstByte{Own: work}, 0.05+work/5000, testPrior(1e-4, 0.02))
	}
	got := e.load()
	if !near2(got.Rate, 5000, 0.02) || !near2(got.Base, 0.05, 0.1) {
		t.Errorf("learned rate %v base %v, want 5000 and 0.05", got.Rate, got.Base)
	}
	// Terms the samples never varied keep the prior's values.
	if !near2(got.AheadShare, 1, 1e-9) || got.OwnSlowdown != 0 || got.QueueWait != 0 {
		t.Errorf("unvaried terms: ahead share %v, own slowdown %v, queue wait %v; want the prior's 1, 0, 0",
			got.AheadShare, got.OwnSlowdown, got.QueueWait)
	}
}

// An engine that prefills in order, queueing requests behind a limit: the
// prefill ahead counts in full and each queued request waits 0.1 s.
func TestEstimateLearnsAQueue(t *testing.T) {
	var e firstTokenLearner
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		f := firstByte{Own: float64(200 + r.IntN(2000)), Ahead: float64(r.IntN(3) * r.IntN(3000)), Queued: float64(r.IntN(2) * r.IntN(5))}
		e.observe(f, 0.02+(f.Own+f.Ahead)/8000+0.1*f.Queued, testPrior(1e-4, 0.02))
	}
	got := e.load()
	if !near2(got.Rate, 8000, 0.03) || !near2(got.AheadShare, 1, 0.05) || !near2(got.QueueWait, 0.1, 0.05) {
		t.Errorf("learned rate %v, ahead share %v, queue wait %v; want 8000, 1, 0.1", got.Rate, got.AheadShare, got.QueueWait)
	}
}

// An engine after llm-d's simulator: each request prefills on its own
// timer, (5ms + 250µs a token) × (1 + running/63), so the prefill ahead
// costs nothing and every running request slows the prefill by 1/63.
func TestEstimateLearnsAnEngineWithoutAPrefillQueue(t *testing.T) {
	var e firstTokenLearner
	r := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		f := firstByte{Own: float64(100 + r.IntN(3000)), Ahead: float64(r.IntN(6000)), Running: float64(r.IntN(40))}
		e.observe(f, (0.005+f.Own*250e-6)*(1+f.Running/63), testPrior(1e-4, 0.02))
	}
	got := e.load()
	if !near2(got.Rate, 4000, 0.03) || got.AheadShare > 0.02 || !near2(got.OwnSlowdown, 1.0/63, 0.1) {
		t.Errorf("learned rate %v, ahead share %v, own slowdown %v; want 4000, 0, %.4f", got.Rate, got.AheadShare, got.OwnSlowdown, 1.0/63)
	}
	f := firstByte{Own: 1500, Ahead: 4000, Running: 20}
	want := (0.005 + 1500*250e-6) * (1 + 20.0/63)
	if p := predict(got, f); !near2(p, want, 0.05) {
		t.Errorf("predicted %v for %+v, want %v", p, f, want)
	}
}

// An adapter that loads at once: the prior's load delay is unlearned.
func TestEstimateLearnsTheAdapterLoad(t *testing.T) {
	var e firstTokenLearner
	for i := range 100 {
		f := firstByte{Own: float64(500 + 50*(i%30)), Load: i%4 == 0}
		e.observe(f, 0.01+f.Own/10000, testPrior(1e-4, 0.02))
	}
	if got := e.load(); got.LoRALoad > 0.002 {
		t.Errorf("learned adapter load %v, want about 0 (the prior's is 0.025)", got.LoRALoad)
	}
}

// Samples that are not numbers, negative or infinite are dropped, and
// whatever is observed, the estimate stays finite and in its bounds.
func TestEstimateStaysFinite(t *testing.T) {
	var e firstTokenLearner
	pr := testPrior(1e-4, 0.02)
	e.observe(firstByte{Own: math.NaN()}, 0.1, pr)
	e.observe(firstByte{Own: 100, Ahead: -5}, 0.1, pr)
	e.observe(firstByte{Own: 100}, math.Inf(1), pr)
	e.observe(firstByte{Own: 100}, 0, pr)
	if n := e.load().Samples; n != 0 {
		t.Fatalf("%d bad samples taken", n)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		f := firstByte{Own: float64(r.IntN(1 << r.IntN(20))), Ahead: float64(r.IntN(1 << r.IntN(20))), Queued: float64(r.IntN(50)),
			Running: float64(r.IntN(300)), Load: r.IntN(2) == 0}
		e.observe(f, r.ExpFloat64()*math.Pow(10, float64(r.IntN(8)-5)), pr)
		got := e.load()
		for _, v := range []float64{got.Base, got.Rate, got.AheadShare, got.RunningWait, got.OwnSlowdown, got.AheadSlowdown, got.QueueWait, got.LoRALoad} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("estimate %+v after %+v", got, f)
			}
		}
		if got.Rate < 1000-1e-6 || got.Rate > 100000+1e-6 {
			t.Fatalf("rate %v outside 10x of the prior's 10000", got.Rate)
		}
	}
}

// predict is the first token e expects for f, as [TTFTScorer] computes it.
func predict(e FirstTokenModel, f firstByte) float64 {
	inv := 1 / e.Rate
	return e.Base + e.RunningWait*f.Running + inv*(f.Own+e.AheadShare*f.Ahead) + inv*f.Running*(e.OwnSlowdown*f.Own+e.AheadSlowdown*f.Ahead) +
		e.QueueWait*f.Queued
}

// The fit is judged by relative error, as deadlines judge it: a few first
// bytes that waited seconds behind others' prefill (not in the terms) do
// not pull the estimate of the many short ones off by more than they
// themselves are off. Unweighted, the long ones' squares set the fit, and
// a 20 ms first token was estimated at twice that.
func TestEstimateFitsRelativeError(t *testing.T) {
	var e firstTokenLearner
	r := rand.New(rand.NewPCG(7, 8))
	pr := testPrior(1e-4, 0.02)
	for i := range 400 {
		f := firstByte{Own: float64(100 + r.IntN(400))}
		ttft := 0.01 + f.Own/20000
		if i%10 == 0 {
			f.Own = float64(2000 + r.IntN(2000))
			ttft = 2 + f.Own/20000 // waited behind work the terms do not see
		}
		e.observe(f, ttft, pr)
	}
	m := e.load()
	var errs []float64
	for own := 100.0; own < 500; own += 50 {
		want := 0.01 + own/20000
		errs = append(errs, math.Abs(predict(m, firstByte{Own: own})/want-1))
	}
	sort.Float64s(errs)
	if med := errs[len(errs)/2]; med > 0.5 {
		t.Errorf("short first tokens estimated %.0f%% off (median), want within 50%%: %+v", 100*med, m)
	}
}
