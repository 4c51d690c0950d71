package balancer

import (
	"math"
	"sync"
)

// SGLangPicker is the SGLang model gateway's cache_aware policy
// (smg-project/smg model_gateway/src/policies/cache_aware.rs at f8daa883;
// sglang PR #14650). Loads are the requests in flight from this balancer.
// The prompt text is matched against a character radix tree of what each
// backend was sent. When the best match covers more than CacheThreshold
// of the prompt, the request goes to the least loaded backend holding
// that match (ties at random), unless that backend is overloaded (load
// over BalanceRelThreshold times the mean and over the mean plus
// BalanceAbsThreshold), when it spills to the least loaded backend; a
// miss goes to the least loaded backend (ties: fewer requests served,
// then snapshot order). The prompt is then inserted under the chosen
// backend; each backend's share of the tree is bounded by MaxTreeBytes,
// least recently used leaves evicted first.
//
// Legacy is sglang-router as SGLang v0.4 shipped it (December 2024): when
// the load is imbalanced (max − min over BalanceAbsThreshold and max over
// BalanceRelThreshold × min) the least loaded backend; else the best match
// if it covers more than CacheThreshold; else the backend holding the
// least tree.
type SGLangPicker struct {
	cfg    SGLangConfig
	tree   TextTree
	rand   func() uint64
	legacy bool
	pool   sync.Pool // *[]int32
}

var _ Picker = (*SGLangPicker)(nil)

// Choose implements [Picker].
func (s *SGLangPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	least, lo, hi, sum := 0, int64(math.MaxInt64), int64(-1), int64(0)
	for i := range p.Cands {
		c := &p.Cands[i]
		l := c.InFlight
		if l < lo || (l == lo && c.Backend.Ledger.Total() < p.Cands[least].Backend.Ledger.Total()) {
			lo, least = l, i
		}
		hi = max(hi, l)
		sum += l
	}
	choice, why := least, ReasonLeastLoad
	text := p.Req.Prompt
	imbalanced := s.legacy && hi-lo > int64(s.cfg.BalanceAbsThreshold) && float64(hi) > s.cfg.BalanceRelThreshold*float64(lo)
	if !imbalanced && len(text) > 0 {
		bufp, _ := s.pool.Get().(*[]int32)
		if bufp == nil {
			bufp = new([]int32)
		}
		by := grow(*bufp, p.snap.slots)
		clear(by)
		s.tree.Match(text, by)
		bestLen := int32(0)
		for i := range p.Cands {
			if sl := p.Cands[i].Backend.slot; sl < len(by) {
				bestLen = max(bestLen, by[sl])
			}
		}
		hit := bestLen > 0 && float64(bestLen)/float64(len(text)) > s.cfg.CacheThreshold
		switch {
		case hit && s.legacy:
			for i := range p.Cands {
				if sl := p.Cands[i].Backend.slot; sl < len(by) && by[sl] == bestLen {
					choice, why = i, ReasonPrefixHit
					break
				}
			}
		case hit:
			choice, why = s.holder(p, by, bestLen), ReasonPrefixHit
			mean := float64(sum) / float64(len(p.Cands))
			if l := float64(p.Cands[choice].InFlight); l > mean*s.cfg.BalanceRelThreshold && l > mean+float64(s.cfg.BalanceAbsThreshold) {
				choice, why = least, ReasonLeastLoad
			}
		case s.legacy:
			smallest := 0
			for i := range p.Cands {
				if s.tree.Size(p.Cands[i].Backend.slot) < s.tree.Size(p.Cands[smallest].Backend.slot) {
					smallest = i
				}
			}
			choice, why = smallest, ReasonCacheSpace
		}
		*bufp = by
		s.pool.Put(bufp)
	}
	if !p.Dry && len(text) > 0 {
		s.tree.Insert(p.Cands[choice].Backend.slot, text)
	}
	return choice, why
}

// holder returns the least loaded candidate whose match is best, ties at
// random.
func (s *SGLangPicker) holder(p *PickInfo, by []int32, best int32) int {
	choice, ties := -1, uint64(0)
	for i := range p.Cands {
		sl := p.Cands[i].Backend.slot
		if sl >= len(by) || by[sl] != best {
			continue
		}
		switch {
		case choice < 0 || p.Cands[i].InFlight < p.Cands[choice].InFlight:
			choice, ties = i, 1
		case p.Cands[i].InFlight == p.Cands[choice].InFlight:
			ties++
			if s.rand()%ties == 0 {
				choice = i
			}
		}
	}
	return choice
}
