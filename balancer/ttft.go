package balancer

import "math"

// TTFTScorer is llmlb's own scorer. It scores each candidate by what
// sending the request there costs everyone, in seconds of waiting, and
// scores best/cost, so the cheapest scores 1:
//
//	cost = ttft + miss
//	ttft = base + (ahead + uncached)/rate + queued×wait + kv + lora + slowdown
//	miss = MissWeight/rate × (step×queued + uncached×ρ/(1−ρ))
//	step = min(uncached, StepTokens)
//
// ttft is the request's own time to first token:
//
//   - ahead is the prefill tokens queued before it: our own pending prompts
//     ([Ledger.aheadTokens]), plus the server's other queued requests, each
//     guessed to be the size of ours there ([Ledger.queuedSize]), plus, with
//     KV events, the share of the prefills in progress that are not ours
//     ([Balancer.othersPrefilling]).
//   - uncached is the prompt less the blocks the prefix index says the
//     backend holds.
//   - rate, base and wait are learned per backend from measured times to
//     first byte ([Ledger.Estimate]), leaving out those that may include a
//     wait for a LoRA slot ([Work.SlotWait]), which say nothing of prefill
//     (see docs/design/ttft.md#slot-waits). A backend with too few samples
//     borrows the mean of the candidates of its hardware class that have
//     enough, else of its engine's ([priors]), and the config's values only
//     while none has.
//   - kv is a penalty rising from 0 at KVSoft to KVPenalty at a full cache,
//     plus KVPenalty again when the request would not fit.
//   - lora is 0 for a loaded adapter; LoRALoadDelay for a free slot or an
//     unknown state, and for a free slot when another candidate runs the
//     adapter, plus LoRASlotWait times the share of servers whose slots are
//     full ([slotsTaken]); LoRASlotWait when requests already wait for it;
//     twice that with no free slot.
//   - slowdown is what the request's decode loses to the backend's batch
//     (DecodeCost).
//
// miss is the part the request's own estimate leaves out: prefilling its
// uncached tokens occupies the GPU for uncached/rate seconds, and requests
// that share the GPU meanwhile wait for it too:
//
//   - Those queued there now wait for at most one step of it: the
//     scheduler serves its queue in order, so they are ahead of the new
//     request, and a chunked prefill takes at most StepTokens of each step
//     they share. Each is charged step tokens (see
//     docs/design/ttft.md#one-step).
//   - Those arriving while it runs wait for all of it. The estimate takes
//     ρ/(1−ρ) of them, the mean number of requests an M/M/1 server at
//     utilisation ρ holds, with ρ the backend's KV-cache use (capped at
//     0.95), the resource an inference server saturates first.
//
// At idle miss is 0 and the rule is the fastest first token; as the fleet
// fills, a miss costs more than a holder's queue and requests stay where
// their prefix is, so that the fleet's prefill work, and with it its
// throughput, is not spent recomputing prompts it already holds. A
// holder's own queue still counts in full, so a burst spreads once the
// holder's wait passes what copying the prefix elsewhere costs.
//
// Score writes the estimate's parts into each [Candidate]; [TTFTPicker],
// which embeds the scorer, places the request by them.
type TTFTScorer struct{ cfg TTFTConfig }

var _ Scorer = (*TTFTScorer)(nil)

// minSamples is how many first bytes a backend's learned estimate needs
// before it replaces the fleet's.
const minSamples = 5

// maxUtilisation caps ρ in the miss cost: a full cache counts as 19
// requests arriving behind the prefill, not infinitely many.
const maxUtilisation = 0.95

// Score implements [Scorer].
func (s *TTFTScorer) Score(p *PickInfo, out []float64) {
	var pr priors
	pr.learn(p)
	k := s.consts(p)
	best := math.Inf(1)
	for i := range p.Cands {
		c := &p.Cands[i]
		est := c.Backend.Ledger.est.load()
		inv, base := 1/est.Rate, est.Base
		if !est.learned() {
			inv, base = pr.of(p, i, &s.cfg)
		}
		s.estimate(p, c, est, inv, base, &k)
		best = min(best, c.Cost)
	}
	for i := range p.Cands {
		if t := p.Cands[i].Cost; t > 0 {
			out[i] = best / t
		} else {
			out[i] = 1
		}
	}
}

// priors is the first-token model a backend without enough samples of its
// own borrows: the mean of the learned ones of its hardware class (one
// engine and KV size, as [TTFTPicker.place] tells them apart), else of its
// engine's (a fresh A100 beside measured H100s running the same engine is
// not taken for one; nor is a fresh H100 for the mean of both), else the
// config's. Candidates past the first [maxClasses] classes borrow their
// engine's mean over those classes.
type priors struct {
	hw   hwClasses // sum: the learned inverse rates; n: how many
	base [maxClasses]float64
	none bool // no candidate is learned, or every one is: nothing to borrow
}

// learn sums the candidates' learned estimates by class. When no
// candidate is learned, or every one is, there is nothing to borrow and
// the candidates are not classified: a fleet at start-up takes the
// config's values, a measured one its own.
func (pr *priors) learn(p *PickInfo) {
	learned, fresh := false, false
	for i := range p.Cands {
		if p.Cands[i].Backend.Ledger.est.load().learned() {
			learned = true
		} else {
			fresh = true
		}
	}
	if pr.none = !learned || !fresh; pr.none {
		return
	}
	pr.hw.classify(p.Cands)
	for i := range p.Cands {
		c := &p.Cands[i]
		k := pr.hw.at(p.Cands, i)
		if k < 0 {
			continue
		}
		if est := c.Backend.Ledger.est.load(); est.learned() {
			pr.hw.sum[k] += 1 / est.Rate
			pr.base[k] += est.Base
			pr.hw.n[k]++
		}
	}
}

// of returns the inverse rate and base candidate i borrows.
func (pr *priors) of(p *PickInfo, i int, cfg *TTFTConfig) (inv, base float64) {
	if pr.none {
		return 1 / cfg.PrefillRate, cfg.BaseLatency.Seconds()
	}
	c := &p.Cands[i]
	if k := pr.hw.at(p.Cands, i); k >= 0 && pr.hw.n[k] > 0 {
		return pr.hw.sum[k] / pr.hw.n[k], pr.base[k] / pr.hw.n[k]
	}
	n := 0.0
	for j := range pr.hw.k {
		if pr.hw.key[j].engine == c.Backend.Engine {
			inv += pr.hw.sum[j]
			base += pr.base[j]
			n += pr.hw.n[j]
		}
	}
	if n == 0 {
		return 1 / cfg.PrefillRate, cfg.BaseLatency.Seconds()
	}
	return inv / n, base / n
}

// scoreConsts are the config's figures a pick's estimates share, in
// seconds, converted once per pick rather than once per candidate.
type scoreConsts struct {
	kvPen, loraLoad, loraWait, decode float64 // seconds
	loraCopy                          float64 // a free slot's LoRA penalty: [slotsTaken]
	out, need                         int     // output tokens; KV tokens needed besides the uncached prompt
	step                              float64 // StepTokens
	queued, arrivals                  float64 // 1, or 0 for a miss term turned off ([Rules])
}

// consts converts the config's figures for p's estimates.
func (s *TTFTScorer) consts(p *PickInfo) scoreConsts {
	out := p.Req.MaxTokens
	if out <= 0 {
		out = s.cfg.DefaultMaxTokens
	}
	k := scoreConsts{
		kvPen: s.cfg.KVPenalty.Seconds(), loraLoad: s.cfg.LoRALoadDelay.Seconds(), loraWait: s.cfg.LoRASlotWait.Seconds(),
		decode: s.cfg.DecodeCost.Seconds(), out: out, need: max(p.Req.MaxTokens, s.cfg.DefaultMaxTokens),
	}
	k.loraCopy = k.loraLoad + k.loraWait*slotsTaken(p)
	k.step = float64(s.cfg.StepTokens)
	on := func(r Rules) float64 {
		if s.cfg.Off.has(r) {
			return 0
		}
		return 1
	}
	k.queued, k.arrivals = on(ruleMissQueued), on(ruleMissArrivals)
	return k
}

// slotsTaken is, for a request for an adapter that a candidate runs, the
// share of the candidates whose adapter slots the last scrape showed all
// in use; else 0. A free slot taken for such an adapter is a copy of it:
// both servers keep it while its requests keep coming to either, so the
// next adapter that runs nowhere finds one slot fewer, and where every
// slot is taken it waits for one ([TTFTConfig.LoRASlotWait]). The share of
// full servers is taken as the chance it does. It reads the scrape, which
// every replica reads alike. See docs/design/ttft.md#lora-copy.
func slotsTaken(p *PickInfo) float64 {
	running := false
	full, known := 0, 0
	for i := range p.Cands {
		c := &p.Cands[i]
		if c.LoRA == LoRANone {
			return 0
		}
		running = running || c.LoRA == LoRARunning
		if info := c.Backend.Metrics.LoRA; info != nil && info.Max > 0 {
			known++
			if len(info.Running) >= info.Max {
				full++
			}
		}
	}
	if !running || known == 0 {
		return 0
	}
	return float64(full) / float64(known)
}

// estimate fills in c's estimate fields from its learned model est, with
// inv and base its inverse prefill rate and base (est's own once learned,
// else the priors').
func (s *TTFTScorer) estimate(p *PickInfo, c *Candidate, est Estimate, inv, base float64, k *scoreConsts) {
	c.Prefill = base + (c.AheadTokens+float64(c.UncachedTokens))*inv
	c.QueueWait = c.Queued * est.QueueWait
	c.Backlog = c.AheadTokens*inv + c.QueueWait
	c.KVPenalty = 0
	rho := 0.0
	if c.KVUsage.Known {
		rho = min(max(c.KVUsage.V, 0), maxUtilisation)
		pen := k.kvPen
		c.KVPenalty = pen * min(max((c.KVUsage.V-s.cfg.KVSoft)/(1-s.cfg.KVSoft), 0), 1)
		m := &c.Backend.Metrics
		if capTok := m.BlockSize.V * m.NumBlocks.V; m.BlockSize.Known && m.NumBlocks.Known && capTok > 0 {
			need := float64(c.UncachedTokens + k.need)
			if (1-c.KVUsage.V)*capTok < need {
				c.KVPenalty += pen
			}
		}
	}
	switch c.LoRA {
	case LoRAFree:
		c.LoRAPenalty = k.loraCopy
	case LoRAUnknown:
		c.LoRAPenalty = k.loraLoad
	case LoRAWaiting:
		c.LoRAPenalty = k.loraWait
	case LoRAFull:
		c.LoRAPenalty = 2 * k.loraWait
	default:
		c.LoRAPenalty = 0
	}
	// Queued requests join the batch soon; they slow its steps as much.
	c.DecodeSlowdown = k.decode * (c.Running + c.Queued) * float64(k.out)
	c.TTFT = c.Prefill + c.QueueWait + c.KVPenalty + c.LoRAPenalty + c.DecodeSlowdown
	unc, step := float64(c.UncachedTokens), k.step
	if unc < step {
		step = unc
	}
	c.MissCost = s.cfg.MissWeight * inv * (k.queued*step*c.Queued + k.arrivals*unc*rho/(1-rho))
	c.Cost = c.TTFT + c.MissCost
	c.First = 0
	if m := c.Backend.Ledger.first.load(); m.learned() {
		c.First = m.predict(c)
	}
}
