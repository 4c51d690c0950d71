package balancer

import (
	"math"
	"slices"
	"sync"
)

// QueueScorer is the Inference Extension endpoint picker's queue scorer:
// (maxQ - q)/(maxQ - minQ) over the candidates' scraped waiting requests,
// 1 for all when they are equal. It reads the last scrape as is (the EPP
// does no in-flight correction); unknown counts as 0.
type QueueScorer struct{}

var _ Scorer = QueueScorer{}

// Score implements [Scorer].
func (QueueScorer) Score(p *PickInfo, out []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range p.Cands {
		q := p.Cands[i].Backend.Metrics.Queued.V
		lo, hi = min(lo, q), max(hi, q)
	}
	for i := range p.Cands {
		if hi == lo {
			out[i] = 1
		} else {
			out[i] = (hi - p.Cands[i].Backend.Metrics.Queued.V) / (hi - lo)
		}
	}
}

// KVScorer is the endpoint picker's KV-cache utilisation scorer: 1 - kv,
// from the last scrape; unknown counts as empty.
type KVScorer struct{}

var _ Scorer = KVScorer{}

// Score implements [Scorer].
func (KVScorer) Score(p *PickInfo, out []float64) {
	for i := range p.Cands {
		out[i] = 1 - p.Cands[i].Backend.Metrics.KVUsage.V
	}
}

// PrefixScorer is the endpoint picker's prefix-cache scorer: matched
// blocks over the prompt's blocks, as the preset's match counts them: its
// [IndexSpec] (the endpoint picker's is [eppIndex]), or with
// [Preset.TrueCache] a token a block. 0 when the prompt fills no block.
type PrefixScorer struct{}

var _ Scorer = PrefixScorer{}

// Score implements [Scorer].
func (PrefixScorer) Score(p *PickInfo, out []float64) {
	for i := range p.Cands {
		if p.PromptBlocks > 0 {
			out[i] = float64(p.Cands[i].MatchedBlocks) / float64(p.PromptBlocks)
		}
	}
}

// MaxScorePicker is the endpoint picker's max-score picker: the highest
// weighted total, ties broken uniformly at random.
type MaxScorePicker struct{ rand func() uint64 }

var _ Picker = (*MaxScorePicker)(nil)

// Choose implements [Picker].
func (m *MaxScorePicker) Choose(p *PickInfo, total []float64) (int, Reason) {
	best, ties := 0, 0
	for i, v := range total {
		switch {
		case v > total[best]+1e-12:
			best, ties = i, 1
		case math.Abs(v-total[best]) <= 1e-12:
			ties++
			// Reservoir sampling keeps each tie equally likely.
			if m.rand()%uint64(ties) == 0 {
				best = i
			}
		}
	}
	return best, reasonFor(p, best)
}

// NoHitLRUScorer is llm-d's no-hit-lru-scorer (llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/scorer/nohitlru/no_hit_lru.go at
// ebab6879). For a cold request (no candidate holds any block of its
// prompt) it ranks the candidates that never took a cold request first,
// in snapshot order, then the others by how long ago they last took one,
// longest first, and scores rank r of N as max(0, 1 − r/(N−1)), so that
// new prefixes spread over the servers instead of following the load
// scores alone. A warm request scores 0.5 everywhere, which leaves the
// order to the other scorers.
type NoHitLRUScorer struct {
	mu    sync.Mutex
	order []uint64 // guarded by mu; backends by idHash in the order they took cold requests, least recent first
}

var (
	_ Scorer    = (*NoHitLRUScorer)(nil)
	_ committer = (*NoHitLRUScorer)(nil)
)

// cold reports whether no candidate holds any block of the pick's prompt.
func cold(p *PickInfo) bool {
	for i := range p.Cands {
		if p.Cands[i].MatchedBlocks > 0 {
			return false
		}
	}
	return true
}

// Score implements [Scorer].
func (s *NoHitLRUScorer) Score(p *PickInfo, out []float64) {
	if !cold(p) {
		for i := range out {
			out[i] = 0.5
		}
		return
	}
	n := len(p.Cands)
	if n == 1 {
		out[0] = 1
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	never := 0
	for i := range p.Cands {
		if !slices.Contains(s.order, p.Cands[i].Backend.idHash) {
			out[i] = 1 - float64(never)/float64(n-1)
			never++
		}
	}
	for i := range p.Cands {
		if pos := slices.Index(s.order, p.Cands[i].Backend.idHash); pos >= 0 {
			out[i] = max(0, 1-float64(never+pos)/float64(n-1))
		}
	}
}

// Commit implements [committer]: a cold request makes its backend the
// most recently used.
func (s *NoHitLRUScorer) Commit(p *PickInfo, chosen int) {
	if !cold(p) {
		return
	}
	id := p.Cands[chosen].Backend.idHash
	s.mu.Lock()
	defer s.mu.Unlock()
	s.order = append(slices.DeleteFunc(s.order, func(x uint64) bool { return x == id }), id)
	if len(s.order) > 1024 { // llm-d's LRU size: gone backends age out
		s.order = slices.Delete(s.order, 0, len(s.order)-1024)
	}
}

// tokenLoadThreshold is the token-load scorer's queueThresholdTokens
// default: 128 requests of 32K tokens.
const tokenLoadThreshold = 4194304

// TokenLoadScorer is llm-d's token-load-scorer (llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go at
// ebab6879): 1 − min(1, tokens/4,194,304), where tokens are the backend's
// in-flight load as the in-flight-load producer keeps it, the uncached
// prompt tokens of the requests this balancer sent there that have no
// first byte yet ([Candidate.PendingTokens]; the producer releases them
// at the first streamed chunk), plus this request's uncached tokens there.
type TokenLoadScorer struct{}

var _ Scorer = TokenLoadScorer{}

// Score implements [Scorer].
func (TokenLoadScorer) Score(p *PickInfo, out []float64) {
	for i := range p.Cands {
		c := &p.Cands[i]
		out[i] = 1 - min(1, float64(c.PendingTokens+int64(c.UncachedTokens))/tokenLoadThreshold)
	}
}

// PrefixAffinityPicker is llm-d's prefix-cache-affinity-filter with its
// defaults, then the max-score picker (llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go
// at ebab6879). A candidate is sticky when it holds at least 0.8 of the
// prompt's blocks; when one is, the pick is among the sticky ones, unless
// the best sticky one's estimated time to first token exceeds the best
// other one's by more than 18 s, when stickiness breaks and every
// candidate stays. A backend's estimate is its in-flight uncached prompt
// tokens ([Candidate.PendingTokens], this request not counted) at 15,928
// tokens/s, the filter's peakPrefillThroughput: the gate opens at a lead
// of about 286,700 tokens. Ties go at random.
type PrefixAffinityPicker struct{ rand func() uint64 }

var _ Picker = (*PrefixAffinityPicker)(nil)

// The prefix-cache-affinity filter's defaults (plugin.go DefaultConfig).
const (
	affinityThreshold     = 0.8
	maxTTFTPenalty        = 18.0  // seconds
	peakPrefillThroughput = 15928 // tokens/s
)

// sticky reports whether candidate i holds at least affinityThreshold of
// the prompt's blocks.
func sticky(p *PickInfo, i int) bool {
	return p.PromptBlocks > 0 && float64(p.Cands[i].MatchedBlocks)/float64(p.PromptBlocks) >= affinityThreshold
}

// Choose implements [Picker].
func (a *PrefixAffinityPicker) Choose(p *PickInfo, total []float64) (int, Reason) {
	n, bestSticky, bestOther := 0, math.Inf(1), math.Inf(1)
	for i := range p.Cands {
		ttft := float64(p.Cands[i].PendingTokens) / peakPrefillThroughput
		if sticky(p, i) {
			n++
			bestSticky = min(bestSticky, ttft)
		} else {
			bestOther = min(bestOther, ttft)
		}
	}
	keep := n > 0 && (n == len(p.Cands) || bestSticky-bestOther <= maxTTFTPenalty)
	best, ties := -1, 0
	for i, v := range total {
		if keep && !sticky(p, i) {
			continue
		}
		switch {
		case best < 0 || v > total[best]+1e-12:
			best, ties = i, 1
		case math.Abs(v-total[best]) <= 1e-12:
			ties++
			if a.rand()%uint64(ties) == 0 {
				best = i
			}
		}
	}
	return best, reasonFor(p, best)
}
