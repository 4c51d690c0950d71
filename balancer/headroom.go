package balancer

import (
	"math"
	"slices"
	"time"
)

// The llm-d-slo preset is llm-d's predicted-latency scheduling profile
// (llm-d/llm-d-router config/charts/routerlib/templates/_config.yaml at
// ebab6879, the default profile when router.latencyPredictor.enabled):
//
//	predicted-latency-producer → strict prefix-cache-affinity-filter (0.99)
//	→ slo-headroom-tier-filter → loose prefix-cache-affinity-filter (0.80)
//	→ latency-scorer → weighted-random-picker, with latency-slo-admitter
//
// llm-d predicts each endpoint's TTFT and TPOT with a model trained online
// in a sidecar; here the prediction is llmlb's own TTFT estimate
// ([Candidate.FirstToken], from [TTFTScorer]'s learned model), and no
// TPOT is predicted: every TPOT headroom is 0, as llm-d's producer sets it
// when it does not stream (prediction.go, "Neutralize TPOT"), so only the
// TTFT deadline ([Request.TTFTDeadline]) sorts the tiers. Headroom is the
// deadline left minus the prediction; with no deadline it is minus the
// prediction, always negative, as in llm-d (SLO 0).

// The profile's parameters (_config.yaml and each plugin's DefaultConfig
// at ebab6879).
const (
	strictAffinity   = 0.99 // strict-affinity-filter affinityThreshold
	looseAffinity    = 0.80 // loose-affinity-filter affinityThreshold
	sloTTFTPenalty   = 5.0  // both filters' maxTTFTPenaltyMs, seconds
	exploreNegative  = 0.01 // slo-headroom-tier-filter epsilonExploreNeg
	latencyWeightMax = 100  // latency-scorer wMax (minWeight 0)
	coldKV           = 0.02 // latency-slo-admitter: KV use below this is cold
)

// SLOAdmitter is llm-d's latency-slo-admitter (llm-d/llm-d-router
// pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo/plugin.go
// at ebab6879) as the llm-d-slo preset's scorer: a sheddable request
// (negative priority) with a deadline is refused when no candidate's
// prediction meets it, none is idle (no running requests in its last
// scrape) and none is cold (KV use under 2%, where predictions are not
// trusted); any other request is admitted. The refusal is the balancer's
// own deadline stage ([ErrDeadline]), which refuses a sheddable request
// none of whose candidates' estimates meets its deadline: the scorer
// leaves its estimates in the candidates only when it refuses, and clears
// them otherwise, so that the stage stands aside and [SLOHeadroomPicker]
// applies llm-d's filters on estimates of its own. Its scores, the
// fastest prediction over each one's, order the fallbacks.
type SLOAdmitter struct {
	est TTFTScorer
	now func() time.Time
}

var _ Scorer = (*SLOAdmitter)(nil)

// Score implements [Scorer].
func (s *SLOAdmitter) Score(p *PickInfo, out []float64) {
	s.est.Score(p, out)
	best := math.Inf(1)
	for i := range p.Cands {
		best = min(best, p.Cands[i].FirstToken())
	}
	for i := range p.Cands {
		out[i] = 1
		if t := p.Cands[i].FirstToken(); t > 0 {
			out[i] = best / t
		}
	}
	if s.refuses(p) {
		return // the deadline stage refuses it
	}
	for i := range p.Cands {
		c := &p.Cands[i]
		c.Prefill, c.QueueWait, c.LoRAPenalty, c.First = 0, 0, 0, 0
	}
}

// refuses reports whether llm-d's admitter refuses p's request, with the
// candidates' estimates filled in.
func (s *SLOAdmitter) refuses(p *PickInfo) bool {
	left, ok := p.Req.left(s.now())
	if !ok || p.Req.Priority >= 0 {
		return false
	}
	for i := range p.Cands {
		c := &p.Cands[i]
		m := &c.Backend.Metrics
		if c.FirstToken() < left.Seconds() || m.Running.V == 0 || m.KVUsage.V < coldKV {
			return false
		}
	}
	return true
}

// SLOHeadroomPicker is the rest of llm-d's predicted-latency profile after
// its producer, on the candidates' TTFT predictions, which it computes
// with [TTFTScorer]:
//
//   - the strict prefix-cache-affinity-filter (filter/prefixcacheaffinity
//     plugin.go): when some candidates hold at least 0.99 of the prompt's
//     blocks, only they stay, unless the fastest of them is predicted more
//     than 5 s slower than the fastest other;
//   - the slo-headroom-tier-filter (filter/sloheadroomtier/plugin.go): the
//     candidates whose predictions meet the deadline stay, and with
//     probability 0.01 only those that miss it, when there are both;
//   - the loose prefix-cache-affinity-filter, at 0.80;
//   - the latency-scorer (scorer/latency/plugin.go), strategy "least":
//     when some meet the deadline, those closest to it score highest (it
//     packs work onto the busiest servers that still meet it); when none
//     does, the idle ones (none of this balancer's requests in flight)
//     if any, and among them or the rest, those that miss it by least.
//     A weight is int((1 − n)×100) + 1 over 100, n the candidate's
//     |headroom| normalised over the set; equal headrooms weigh alike;
//   - the weighted-random-picker (picker/weightedrandom/picker.go): a
//     candidate with probability proportional to its weight.
type SLOHeadroomPicker struct {
	est  TTFTScorer
	now  func() time.Time
	rand func() uint64
}

var _ Picker = (*SLOHeadroomPicker)(nil)

// Choose implements [Picker].
func (s *SLOHeadroomPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	n := len(p.Cands)
	s.est.Score(p, make([]float64, n))
	slo := 0.0
	if left, ok := p.Req.left(s.now()); ok {
		slo = left.Seconds()
	}
	headroom := make([]float64, n)
	keep := make([]int, n)
	for i := range p.Cands {
		headroom[i] = slo - p.Cands[i].FirstToken()
		keep[i] = i
	}
	keep = affinityFilter(p, keep, strictAffinity)
	keep = s.tierFilter(keep, headroom)
	keep = affinityFilter(p, keep, looseAffinity)
	w := latencyWeights(p, keep, headroom)
	i := s.weighted(keep, w)
	return i, reasonFor(p, i)
}

// affinityFilter is llm-d's prefix-cache-affinity-filter at threshold,
// with the latency predictor as its TTFT source.
func affinityFilter(p *PickInfo, keep []int, threshold float64) []int {
	if len(keep) <= 1 || p.PromptBlocks == 0 {
		return keep
	}
	var sticky, other []int
	bestSticky, bestOther := math.Inf(1), math.Inf(1)
	for _, i := range keep {
		t := p.Cands[i].FirstToken()
		if float64(p.Cands[i].MatchedBlocks)/float64(p.PromptBlocks) >= threshold {
			sticky, bestSticky = append(sticky, i), min(bestSticky, t)
		} else {
			other, bestOther = append(other, i), min(bestOther, t)
		}
	}
	if len(sticky) == 0 || len(other) > 0 && bestSticky-bestOther > sloTTFTPenalty {
		return keep
	}
	return sticky
}

// tierFilter is llm-d's slo-headroom-tier-filter: the candidates that meet
// the deadline (headroom ≥ 0), or with probability 0.01 those that miss
// it, when there are both; else all.
func (s *SLOHeadroomPicker) tierFilter(keep []int, headroom []float64) []int {
	if len(keep) <= 1 {
		return keep
	}
	var pos, neg []int
	for _, i := range keep {
		if headroom[i] >= 0 {
			pos = append(pos, i)
		} else {
			neg = append(neg, i)
		}
	}
	switch {
	case len(pos) > 0 && len(neg) > 0:
		if float64(s.rand()>>11)/(1<<53) < exploreNegative {
			return neg
		}
		return pos
	case len(pos) > 0:
		return pos
	}
	return neg
}

// latencyWeights are the latency-scorer's weights of keep, in its order.
func latencyWeights(p *PickInfo, keep []int, headroom []float64) []float64 {
	var pos, neg []int
	for _, i := range keep {
		if headroom[i] < 0 {
			neg = append(neg, i)
		} else {
			pos = append(pos, i)
		}
	}
	bucket := pos
	if len(pos) == 0 {
		// Every TPOT headroom is 0, so the deficit buckets hold only
		// "TTFT negative": idle first, then all.
		bucket = neg
		var idle []int
		for _, i := range neg {
			if p.Cands[i].InFlight == 0 {
				idle = append(idle, i)
			}
		}
		if len(idle) > 0 {
			bucket = idle
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, i := range bucket {
		h := math.Abs(headroom[i])
		lo, hi = min(lo, h), max(hi, h)
	}
	w := make([]float64, len(keep))
	for k, i := range keep {
		if !slices.Contains(bucket, i) {
			continue
		}
		norm := 0.5 // both dimensions of zero range weigh 0.5 each
		if hi-lo > 1e-9 {
			norm = (math.Abs(headroom[i]) - lo) / (hi - lo)
		}
		w[k] = float64(int((1-norm)*latencyWeightMax)+1) / latencyWeightMax
	}
	return w
}

// weighted is the weighted-random-picker: keep[k] with probability w[k]
// over their sum, or uniformly when every weight is 0.
func (s *SLOHeadroomPicker) weighted(keep []int, w []float64) int {
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	if sum <= 0 {
		return keep[s.rand()%uint64(len(keep))]
	}
	x := float64(s.rand()>>11) / (1 << 53) * sum
	for k, v := range w {
		if x < v {
			return keep[k]
		}
		x -= v
	}
	return keep[len(keep)-1]
}
