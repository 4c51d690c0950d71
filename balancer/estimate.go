package balancer

import (
	"math"
	"sync"
	"sync/atomic"
)

// FirstTokenModel is a backend's learned model of a request's first
// token, which deadlines are judged by ([Candidate.FirstToken]). It is
// expected
//
//	Base + RunningWait×running
//	  + (own + AheadShare×ahead)/Rate
//	  + running×(OwnSlowdown×own + AheadSlowdown×ahead)/Rate
//	  + queued×(QueueWait + QueueSlowdown×own/Rate)
//	  + LoRALoad×(adapter to load)
//
// after the pick, where own is its uncached prompt tokens, ahead the
// prefill tokens the pick saw queued before it ([Candidate.AheadTokens]),
// running and queued the requests the pick saw there. Each term is one an
// engine may or may not have: a server that prefills requests one after
// another makes a request wait for the prefill ahead of it (AheadShare 1),
// one that prefills each on its own timer does not (AheadShare 0); a
// server whose steps grow with the batch slows a prefill by the requests
// running beside it (the slowdowns); an adapter loads in some time or at
// once. The terms are learned from the backend's answers rather than
// assumed (see docs/design/ttft.md#learned-terms).
type FirstTokenModel struct {
	Base          float64 `json:"base_seconds"`
	Rate          float64 `json:"prefill_tokens_per_second"`
	AheadShare    float64 `json:"ahead_share"`
	RunningWait   float64 `json:"running_wait_seconds"`
	OwnSlowdown   float64 `json:"own_slowdown"`
	AheadSlowdown float64 `json:"ahead_slowdown"`
	QueueWait     float64 `json:"queue_wait_seconds"`
	QueueSlowdown float64 `json:"queue_slowdown"`
	LoRALoad      float64 `json:"lora_load_seconds"`
	Samples       int64   `json:"samples"`
}

// learned reports whether e has enough samples and a prefill rate to
// stand for its backend; until then the cost's own first token is used.
func (e FirstTokenModel) learned() bool { return e.Samples >= minSamples && e.Rate > 0 }

// Learned reports whether e stands for its backend yet.
func (e FirstTokenModel) Learned() bool { return e.learned() }

// FirstTokenModel returns the backend's learned first-token model; zero
// fields are not learned yet.
func (l *Ledger) FirstTokenModel() FirstTokenModel { return l.first.load() }

// The terms of the estimate, in the order of the features of a sample
// ([firstByte.features]) and of the coefficients the estimator learns.
const (
	termBase = iota
	termOwn
	termAhead
	termQueued
	termRunning
	termOwnRunning
	termAheadRunning
	termOwnQueued
	termLoRA
	numTerms
)

// firstByte is what a pick saw of the backend that a first byte's time
// teaches the estimate with: the request's own uncached tokens, the
// prefill ahead of it, the requests queued and running there, and whether
// its adapter was to be loaded.
type firstByte struct {
	Own, Ahead, Queued, Running float64
	Load                        bool
}

// features returns the sample's value of each term.
func (f firstByte) features() [numTerms]float64 {
	load := 0.0
	if f.Load {
		load = 1
	}
	return [numTerms]float64{1, f.Own, f.Ahead, f.Queued, f.Running, f.Own * f.Running, f.Ahead * f.Running, f.Own * f.Queued, load}
}

// prior is the estimate assumed before a backend's answers say otherwise:
// a prefill queue in order (ahead counts as much as the request's own
// tokens), no slowdown with the batch, no queue wait, the config's base,
// rate and adapter load.
func prior(cfg *TTFTConfig) [numTerms]float64 {
	inv := 1 / cfg.PrefillRate
	var p [numTerms]float64
	p[termBase], p[termOwn], p[termAhead], p[termLoRA] = cfg.BaseLatency.Seconds(), inv, inv, cfg.LoRALoadDelay.Seconds()
	return p
}

// firstTokenLearner learns the model's coefficients by exponentially weighted
// least squares over first bytes, drawn toward the prior ([estimator.fit]):
// a term the samples do not vary (no request ever ran beside another)
// keeps its prior, and terms the samples vary together share what they
// explain rather than swinging apart. Readers load the published estimate; writers (first bytes) hold
// mu.
type firstTokenLearner struct {
	cur     atomic.Pointer[FirstTokenModel]
	samples atomic.Int64

	mu     sync.Mutex
	n      float64                     // guarded by mu; decayed sample count
	xx     [numTerms][numTerms]float64 // guarded by mu; decayed Σ x xᵀ
	xy     [numTerms]float64           // guarded by mu; decayed Σ x y
	coef   [numTerms]float64           // guarded by mu; the fit published
	learnt bool                        // guarded by mu; a fit was published
	ref    float64                     // guarded by mu; the first first byte's time, the weights' scale
}

// modelDecay weighs old samples: about the last 100 dominate.
const modelDecay = 0.99

// outlier is the relative distance from the fit past which a first byte
// weighs less: at twice it, half.
const outlier = 0.5

// priorSamples is how many samples' worth the prior weighs in each term.
const priorSamples = 0.005

func (e *firstTokenLearner) load() FirstTokenModel {
	var est FirstTokenModel
	if p := e.cur.Load(); p != nil {
		est = *p
	}
	est.Samples = e.samples.Load()
	return est
}

// observe folds in one first byte, which came ttft seconds after the pick,
// and publishes the new fit.
func (e *firstTokenLearner) observe(f firstByte, ttft float64, pr *[numTerms]float64) {
	x := f.features()
	for _, v := range x {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return
		}
	}
	if !(ttft > 0) || math.IsInf(ttft, 0) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// Each first byte weighs in inverse proportion to its time (scaled by
	// the first one's, so that weights stay near 1): the fit leans toward
	// relative error, as the estimate is judged (a deadline is a ratio to
	// it), without the shortest times alone setting it, as weighing by
	// the inverse square did (docs/design/ttft.md#learned-terms).
	w := 1.0
	if e.learnt {
		// A first byte far from the fit (a wait for a free slot, a
		// stall) weighs less, as in Huber's regression, so that the
		// fit follows the typical request rather than the tail.
		pred := 0.0
		for i := range numTerms {
			pred += e.coef[i] * x[i]
		}
		if r := math.Abs(ttft-pred) / pred; pred > 0 && r > outlier {
			w = outlier / r
		}
		if e.ref > 0 {
			w *= e.ref / ttft
		}
	}
	if e.ref == 0 {
		e.ref = ttft
	}
	e.samples.Add(1)
	e.n = e.n*modelDecay + w
	for i := range numTerms {
		e.xy[i] = e.xy[i]*modelDecay + w*x[i]*ttft
		for j := range numTerms {
			e.xx[i][j] = e.xx[i][j]*modelDecay + w*x[i]*x[j]
		}
	}
	c, ok := e.fit(pr)
	if !ok {
		return
	}
	e.coef, e.learnt = c, e.samples.Load() >= minSamples
	inv := c[termOwn]
	est := &FirstTokenModel{
		Base: c[termBase], Rate: 1 / inv, AheadShare: c[termAhead] / inv, RunningWait: c[termRunning],
		OwnSlowdown: c[termOwnRunning] / inv, AheadSlowdown: c[termAheadRunning] / inv,
		QueueWait: c[termQueued], QueueSlowdown: c[termOwnQueued] / inv, LoRALoad: c[termLoRA],
	}
	e.cur.Store(est)
}

// bounds returns each coefficient's range given the prior: none is
// negative (no term makes a first token sooner), the rate is within 10x of
// the config's (a rate further off is noise, a burst prefilled in one
// batch or a stalled sample, not a GPU), and the prefill ahead counts at
// most twice the request's own.
func bounds(pr *[numTerms]float64) (lo, hi [numTerms]float64) {
	for i := range numTerms {
		hi[i] = math.Inf(1)
	}
	lo[termOwn], hi[termOwn] = pr[termOwn]/10, pr[termOwn]*10
	hi[termAhead] = 2 * hi[termOwn]
	return lo, hi
}

// fit solves the regularised normal equations, fixing a coefficient that
// leaves its bounds at the bound and solving for the others again (an
// active set), and reports whether the system could be solved.
//
// The prior weighs [priorSamples] samples in every term, in the term's
// own scale (its root mean square over the samples), so that its weight
// does not depend on the term's units. The prefill ahead is drawn toward
// the request's own rate rather than toward the prior's: until the samples
// say otherwise, a token ahead costs what one of the request's own does.
func (e *firstTokenLearner) fit(pr *[numTerms]float64) (c [numTerms]float64, ok bool) {
	lo, hi := bounds(pr)
	var scale [numTerms]float64
	for i := range numTerms {
		scale[i] = 1
		if ms := e.xx[i][i] / e.n; ms > 0 {
			scale[i] = math.Sqrt(ms)
		}
	}
	a, b := e.xx, e.xy
	for i := range numTerms {
		w := priorSamples * scale[i] * scale[i]
		if i == termAhead {
			a[termAhead][termAhead] += w
			a[termOwn][termOwn] += w
			a[termAhead][termOwn] -= w
			a[termOwn][termAhead] -= w
			continue
		}
		a[i][i] += w
		b[i] += w * pr[i]
	}
	var fixed [numTerms]bool
	for range numTerms {
		var m [numTerms][numTerms]float64
		var r [numTerms]float64
		for i := range numTerms {
			if fixed[i] {
				m[i][i], r[i] = 1, c[i]*scale[i]
				continue
			}
			r[i] = b[i]
			for j := range numTerms {
				if fixed[j] {
					r[i] -= a[i][j] * c[j]
				} else {
					m[i][j] = a[i][j] / (scale[i] * scale[j])
				}
			}
			r[i] /= scale[i]
		}
		z, solved := cholesky(&m, &r)
		if !solved {
			return c, false
		}
		worst, by := -1, 0.0
		for i := range numTerms {
			if fixed[i] {
				continue
			}
			c[i] = z[i] / scale[i]
			if d := max(lo[i]-c[i], c[i]-hi[i]) * scale[i]; d > by {
				worst, by = i, d
			}
		}
		if worst < 0 {
			return c, true
		}
		c[worst] = min(max(c[worst], lo[worst]), hi[worst])
		fixed[worst] = true
	}
	for i := range numTerms {
		c[i] = min(max(c[i], lo[i]), hi[i])
	}
	return c, true
}

// cholesky solves a z = b for a symmetric positive definite a, reporting
// false when a is not.
func cholesky(a *[numTerms][numTerms]float64, b *[numTerms]float64) (z [numTerms]float64, ok bool) {
	var l [numTerms][numTerms]float64
	for i := range numTerms {
		for j := 0; j <= i; j++ {
			s := a[i][j]
			for k := range j {
				s -= l[i][k] * l[j][k]
			}
			if i == j {
				if !(s > 0) {
					return z, false
				}
				l[i][i] = math.Sqrt(s)
			} else {
				l[i][j] = s / l[j][j]
			}
		}
	}
	var y [numTerms]float64
	for i := range numTerms {
		s := b[i]
		for k := range i {
			s -= l[i][k] * y[k]
		}
		y[i] = s / l[i][i]
	}
	for i := numTerms - 1; i >= 0; i-- {
		s := y[i]
		for k := i + 1; k < numTerms; k++ {
			s -= l[k][i] * z[k]
		}
		z[i] = s / l[i][i]
	}
	return z, true
}

// predict is the first token m expects for c. A wait for an adapter slot
// is not learned ([Work.SlotWait]); it counts as the cost counts it.
func (m FirstTokenModel) predict(c *Candidate) float64 {
	inv, unc, r, q := 1/m.Rate, float64(c.UncachedTokens), c.Running, c.Queued
	t := m.Base + m.RunningWait*r + m.QueueWait*q +
		inv*(unc*(1+m.OwnSlowdown*r+m.QueueSlowdown*q)+c.AheadTokens*(m.AheadShare+m.AheadSlowdown*r))
	switch c.LoRA {
	case LoRAFree, LoRAUnknown:
		t += m.LoRALoad
	case LoRAWaiting, LoRAFull:
		t += c.LoRAPenalty
	}
	return t
}
