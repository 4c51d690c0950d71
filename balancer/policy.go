package balancer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// policy is a preset: weighted scorers and a picker, and the prefix index
// it matches with.
type policy struct {
	name      string
	scorers   []weighted
	picker    Picker
	index     PrefixIndex // nil: no block matching
	sizeIndex bool        // size the index's LRUs from KV capacity
	tree      TextTree
	oracle    Oracle
}

type weighted struct {
	s Scorer
	w float64
}

func (p *policy) forget(slot int) {
	if p.index != nil {
		p.index.Forget(slot)
	}
	if p.tree != nil {
		p.tree.Forget(slot)
	}
}

// newPolicy maps a config name to its preset. Each preset's doc comment is
// on its constructor's types below.
func newPolicy(b *Balancer, cfg Config, d Deps) (*policy, error) {
	switch cfg.Policy {
	case "ttft", "":
		return &policy{name: "ttft", index: d.Index, sizeIndex: d.Index != nil,
			scorers: []weighted{{&TTFTScorer{cfg: cfg.TTFT}, 1}},
			picker:  &TiePicker{Tolerance: cfg.TTFT.TieTolerance}}, nil
	case "oracle":
		if d.Oracle == nil {
			return nil, fmt.Errorf("policy oracle: needs a simulator's oracle")
		}
		return &policy{name: "oracle", oracle: d.Oracle,
			scorers: []weighted{{&TTFTScorer{cfg: cfg.TTFT}, 1}},
			picker:  &TiePicker{Tolerance: cfg.TTFT.TieTolerance}}, nil
	case "round-robin":
		return &policy{name: cfg.Policy, picker: &RoundRobinPicker{pos: &b.rr}}, nil
	case "random":
		return &policy{name: cfg.Policy, picker: &RandomPicker{rand: d.Rand}}, nil
	case "least-request":
		return &policy{name: cfg.Policy, picker: LeastRequestPicker{}}, nil
	case "power-of-two":
		return &policy{name: cfg.Policy, picker: &PowerOfTwoPicker{rand: d.Rand}}, nil
	case "epp":
		return &policy{name: cfg.Policy, index: d.Index,
			scorers: []weighted{{QueueScorer{}, 2}, {KVScorer{}, 2}, {PrefixScorer{}, 3}},
			picker:  &MaxScorePicker{rand: d.Rand}}, nil
	case "consistent-hash":
		return &policy{name: cfg.Policy, picker: &RingPicker{cfg: cfg.ConsistentHash, ring: &b.ring}}, nil
	case "sglang-cache-aware":
		if d.Tree == nil {
			return nil, fmt.Errorf("policy sglang-cache-aware: needs a prefix tree")
		}
		return &policy{name: cfg.Policy, tree: d.Tree, picker: &SGLangPicker{cfg: cfg.SGLang, tree: d.Tree}}, nil
	}
	return nil, fmt.Errorf("unknown policy %q", cfg.Policy)
}

// reasonFor names why candidate i of a scored pick won.
func reasonFor(p *Pick, i int) string {
	c := &p.Cands[i]
	if c.LoRA == LoRARunning {
		for j := range p.Cands {
			if p.Cands[j].LoRA != LoRARunning {
				return "lora"
			}
		}
	}
	if c.MatchedBlocks > 0 {
		return "prefix-hit"
	}
	return "least-load"
}

// TTFTScorer is llmlb's own scorer: it estimates each candidate's time to
// first token in seconds and scores best/estimate, so the fastest scores
// 1. The estimate is
//
//	base + (ahead + uncached) / rate + queued × wait + kv + lora
//
// where ahead is the prefill tokens queued before this request (our own
// pending prompts plus the server's other queued requests at the mean
// prompt size), uncached is this prompt less the blocks the prefix index
// says the backend holds, rate, base and wait are learned per backend from
// measured times to first byte ([Ledger.Estimate]; config defaults until
// then), kv is a penalty rising from KVSoft to KVPenalty at a full cache
// plus KVPenalty again when the request would not fit, and lora is 0 for a
// loaded adapter, LoRALoadDelay for a free slot or unknown state,
// LoRASlotWait when requests already wait for it and twice that with no
// free slot.
type TTFTScorer struct{ cfg TTFTConfig }

var _ Scorer = (*TTFTScorer)(nil)

// Score implements [Scorer].
func (s *TTFTScorer) Score(p *Pick, out []float64) {
	best := math.Inf(1)
	for i := range p.Cands {
		c := &p.Cands[i]
		s.estimate(p, c)
		best = min(best, c.TTFT)
	}
	for i := range p.Cands {
		if t := p.Cands[i].TTFT; t > 0 {
			out[i] = best / t
		} else {
			out[i] = 1
		}
	}
}

func (s *TTFTScorer) estimate(p *Pick, c *Candidate) {
	est := c.Backend.Ledger.est.load()
	inv := 1 / s.cfg.PrefillRate
	if est.Rate > 0 {
		inv = 1 / est.Rate
	}
	base := s.cfg.BaseLatency.Seconds()
	if est.Samples > 0 && est.Base > 0 {
		base = est.Base
	}
	foreign := max(0, c.Queued-float64(c.pending))
	mean := float64(p.Req.PromptTokens)
	if c.pending > 0 {
		mean = float64(c.PendingTokens) / float64(c.pending)
	}
	c.ahead = float64(c.PendingTokens) + foreign*mean
	c.queuedAhead = c.Queued
	c.Prefill = base + (c.ahead+float64(c.UncachedTokens))*inv
	c.QueueWait = c.Queued * est.QueueWait
	c.KVPenalty = 0
	if c.KVUsage.Known {
		pen := s.cfg.KVPenalty.Seconds()
		c.KVPenalty = pen * min(max((c.KVUsage.V-s.cfg.KVSoft)/(1-s.cfg.KVSoft), 0), 1)
		m := &c.Backend.Metrics
		if capTok := m.BlockSize.V * m.NumBlocks.V; m.BlockSize.Known && m.NumBlocks.Known && capTok > 0 {
			need := float64(c.UncachedTokens + max(p.Req.MaxTokens, s.cfg.DefaultMaxTokens))
			if (1-c.KVUsage.V)*capTok < need {
				c.KVPenalty += pen
			}
		}
	}
	d, w := s.cfg.LoRALoadDelay.Seconds(), s.cfg.LoRASlotWait.Seconds()
	switch c.LoRA {
	case LoRAFree, LoRAUnknown:
		c.LoRAPenalty = d
	case LoRAWaiting:
		c.LoRAPenalty = w
	case LoRAFull:
		c.LoRAPenalty = 2 * w
	default:
		c.LoRAPenalty = 0
	}
	out := p.Req.MaxTokens
	if out <= 0 {
		out = s.cfg.DefaultMaxTokens
	}
	// Queued requests join the batch soon; they slow its steps as much.
	c.DecodeSlowdown = s.cfg.DecodeCost.Seconds() * (c.Running + c.Queued) * float64(out)
	c.TTFT = c.Prefill + c.QueueWait + c.KVPenalty + c.LoRAPenalty + c.DecodeSlowdown
}

// TiePicker takes the highest score; candidates within Tolerance of it
// (score ≥ best/(1+Tolerance)) tie. A tie goes to the candidate holding
// the most of the prompt (the same first token time, less work for the
// fleet), then to the highest rendezvous hash of the prompt's first block
// and the backend ID. Replicas that do not share state thus send the same
// conversation to the same backend, and distinct prompts spread evenly.
type TiePicker struct{ Tolerance float64 }

var _ Picker = (*TiePicker)(nil)

// Choose implements [Picker].
func (t *TiePicker) Choose(p *Pick, total []float64) (int, string) {
	best := 0
	for i, v := range total {
		if v > total[best] {
			best = i
		}
	}
	floor := total[best] / (1 + t.Tolerance)
	pick, top, held := best, uint64(0), -1
	for i, v := range total {
		if v < floor {
			continue
		}
		m := p.Cands[i].MatchedTokens
		if h := mix(p.Key ^ p.Cands[i].Backend.idHash); m > held || (m == held && h >= top) {
			pick, top, held = i, h, m
		}
	}
	return pick, reasonFor(p, pick)
}

// mix is the splitmix64 finaliser: a cheap, well-spread 64-bit hash.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// RoundRobinPicker cycles through the candidates in snapshot order, as
// nginx's and HAProxy's default round-robin do (unweighted).
type RoundRobinPicker struct {
	pos interface{ Add(uint64) uint64 }
}

var _ Picker = (*RoundRobinPicker)(nil)

// Choose implements [Picker].
func (r *RoundRobinPicker) Choose(p *Pick, _ []float64) (int, string) {
	var n uint64
	if p.Dry {
		n = r.pos.Add(0)
	} else {
		n = r.pos.Add(1) - 1
	}
	return int(n % uint64(len(p.Cands))), "round-robin"
}

// RandomPicker picks uniformly at random, as sglang-router's random policy.
type RandomPicker struct{ rand func() uint64 }

var _ Picker = (*RandomPicker)(nil)

// Choose implements [Picker].
func (r *RandomPicker) Choose(p *Pick, _ []float64) (int, string) {
	return int(r.rand() % uint64(len(p.Cands))), "random"
}

// LeastRequestPicker picks the candidate with the fewest requests in flight
// from this balancer, as nginx's least_conn does; ties go to the one that
// has served fewer requests in total, then to snapshot (ID) order.
type LeastRequestPicker struct{}

var _ Picker = LeastRequestPicker{}

// Choose implements [Picker].
func (LeastRequestPicker) Choose(p *Pick, _ []float64) (int, string) {
	best := 0
	for i := 1; i < len(p.Cands); i++ {
		a, b := &p.Cands[i], &p.Cands[best]
		if a.InFlight < b.InFlight || (a.InFlight == b.InFlight && a.Backend.Ledger.Total() < b.Backend.Ledger.Total()) {
			best = i
		}
	}
	return best, "least-load"
}

// PowerOfTwoPicker samples two distinct candidates at random and takes the
// one with fewer requests in flight (Mitzenmacher, "The Power of Two
// Choices in Randomized Load Balancing", 2001; grpc-go's leastrequest with
// choiceCount 2; sglang-router's power_of_two). Ties go to the first drawn.
type PowerOfTwoPicker struct{ rand func() uint64 }

var _ Picker = (*PowerOfTwoPicker)(nil)

// Choose implements [Picker].
func (r *PowerOfTwoPicker) Choose(p *Pick, _ []float64) (int, string) {
	n := uint64(len(p.Cands))
	if n == 1 {
		return 0, "least-load"
	}
	a := int(r.rand() % n)
	b := int(r.rand() % (n - 1))
	if b >= a {
		b++
	}
	if p.Cands[b].InFlight < p.Cands[a].InFlight {
		return b, "least-load"
	}
	return a, "least-load"
}

// QueueScorer is the Inference Extension endpoint picker's queue scorer:
// (maxQ - q)/(maxQ - minQ) over the candidates' scraped waiting requests,
// 1 for all when they are equal. It reads the last scrape as is (the EPP
// does no in-flight correction); unknown counts as 0.
type QueueScorer struct{}

var _ Scorer = QueueScorer{}

// Score implements [Scorer].
func (QueueScorer) Score(p *Pick, out []float64) {
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
func (KVScorer) Score(p *Pick, out []float64) {
	for i := range p.Cands {
		out[i] = 1 - p.Cands[i].Backend.Metrics.KVUsage.V
	}
}

// PrefixScorer is the endpoint picker's prefix-cache scorer: matched
// blocks over the prompt's blocks (the EPP's defaults are 64-byte blocks,
// at most 256 per prompt, 31,250 LRU entries per server; main builds the
// epp preset's index so). 0 when the prompt fills no block.
type PrefixScorer struct{}

var _ Scorer = PrefixScorer{}

// Score implements [Scorer].
func (PrefixScorer) Score(p *Pick, out []float64) {
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
func (m *MaxScorePicker) Choose(p *Pick, total []float64) (int, string) {
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

// RingPicker is consistent hashing with bounded loads (Mirrokni, Thorup and
// Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018; HAProxy's
// hash-type consistent with hash-balance-factor 125): the first
// PrefixBytes of the canonical prompt are hashed onto a ring with
// VirtualNodes points per backend; the request goes to the first backend
// clockwise whose in-flight requests are below LoadFactor times the
// average (counting this one), rounded up.
type RingPicker struct {
	cfg  ConsistentHashConfig
	ring interface {
		Load() *ring
		Store(*ring)
	}
	mu sync.Mutex // serialises ring builds
}

var _ Picker = (*RingPicker)(nil)

// ring is the points of every backend of one snapshot generation.
type ring struct {
	gen    uint64
	points []ringPoint
}

type ringPoint struct {
	hash uint64
	id   uint64 // backend idHash
}

func (r *RingPicker) ringFor(snap *Snapshot) *ring {
	if rg := r.ring.Load(); rg != nil && rg.gen == snap.gen {
		return rg
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rg := r.ring.Load(); rg != nil && rg.gen == snap.gen {
		return rg
	}
	rg := &ring{gen: snap.gen, points: make([]ringPoint, 0, len(snap.Backends)*r.cfg.VirtualNodes)}
	for _, be := range snap.Backends {
		for v := range r.cfg.VirtualNodes {
			rg.points = append(rg.points, ringPoint{hash: mix(be.idHash + uint64(v)*0x9e3779b97f4a7c15), id: be.idHash})
		}
	}
	slices.SortFunc(rg.points, func(a, b ringPoint) int { return cmp.Compare(a.hash, b.hash) })
	r.ring.Store(rg)
	return rg
}

// Choose implements [Picker].
func (r *RingPicker) Choose(p *Pick, _ []float64) (int, string) {
	prompt := p.Req.Prompt
	if len(prompt) > r.cfg.PrefixBytes {
		prompt = prompt[:r.cfg.PrefixBytes]
	}
	h := xxhash.Sum64(prompt) ^ p.Req.Seed
	var inFlight int64
	for i := range p.Cands {
		inFlight += p.Cands[i].InFlight
	}
	bound := int64(math.Ceil(r.cfg.LoadFactor * float64(inFlight+1) / float64(len(p.Cands))))
	rg := r.ringFor(p.snap)
	start, _ := slices.BinarySearchFunc(rg.points, h, func(pt ringPoint, h uint64) int { return cmp.Compare(pt.hash, h) })
	for k := range rg.points {
		pt := rg.points[(start+k)%len(rg.points)]
		for i := range p.Cands {
			if p.Cands[i].Backend.idHash == pt.id && p.Cands[i].InFlight < bound {
				return i, "consistent-hash"
			}
		}
	}
	return 0, "consistent-hash"
}

// SGLangPicker is sglang-router's cache_aware policy. Loads are the
// requests in flight from this balancer. When the load is imbalanced (max -
// min > BalanceAbsThreshold and max > BalanceRelThreshold × min) it takes
// the least loaded backend. Otherwise it matches the prompt text against a
// character radix tree of what each backend was sent: if the best match
// covers more than CacheThreshold of the prompt, that backend; else the
// backend holding the least tree (the most cache room), as sglang-router
// does. Either way the prompt is inserted under the chosen backend, and
// each backend's share of the tree is bounded by MaxTreeBytes, least
// recently used leaves evicted first.
type SGLangPicker struct {
	cfg  SGLangConfig
	tree TextTree
	pool sync.Pool // *[]int32
}

var _ Picker = (*SGLangPicker)(nil)

// Choose implements [Picker].
func (s *SGLangPicker) Choose(p *Pick, _ []float64) (int, string) {
	lo, hi, least := int64(math.MaxInt64), int64(-1), 0
	for i := range p.Cands {
		l := p.Cands[i].InFlight
		if l < lo {
			lo, least = l, i
		}
		hi = max(hi, l)
	}
	choice, why := least, "least-load"
	text := p.Req.Prompt
	if !(hi-lo > int64(s.cfg.BalanceAbsThreshold) && float64(hi) > s.cfg.BalanceRelThreshold*float64(lo)) && len(text) > 0 {
		bufp, _ := s.pool.Get().(*[]int32)
		if bufp == nil {
			bufp = new([]int32)
		}
		by := grow(*bufp, p.snap.slots)
		clear(by)
		s.tree.Match(text, by)
		best, bestLen := -1, int32(0)
		for i := range p.Cands {
			if sl := p.Cands[i].Backend.slot; sl < len(by) && by[sl] > bestLen {
				best, bestLen = i, by[sl]
			}
		}
		*bufp = by
		s.pool.Put(bufp)
		if best >= 0 && float64(bestLen)/float64(len(text)) > s.cfg.CacheThreshold {
			choice, why = best, "prefix-hit"
		} else {
			smallest := 0
			for i := range p.Cands {
				if s.tree.Size(p.Cands[i].Backend.slot) < s.tree.Size(p.Cands[smallest].Backend.slot) {
					smallest = i
				}
			}
			choice, why = smallest, "cache-space"
		}
	}
	if !p.Dry && len(text) > 0 {
		s.tree.Insert(p.Cands[choice].Backend.slot, text)
	}
	return choice, why
}
