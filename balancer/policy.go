package balancer

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// policy is a preset built for one balancer: weighted scorers and a
// picker, and the prefix index it matches with.
type policy struct {
	name      string
	scorers   []weighted
	picker    Picker
	index     PrefixIndex // nil: no block matching
	sizeIndex bool        // size the index's LRUs from KV capacity
	tree      TextTree
	oracle    Oracle
	events    CacheEvents // the engines' KV events, for the presets with llmlb's own index
	admission bool        // llmlb's saturation filter and admission queue apply
	userKeyed bool        // keyed on Request.UserText
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

// TTFTScorer is llmlb's own scorer. It scores each candidate by what
// sending the request there costs everyone, in seconds of waiting, and
// scores best/cost, so the cheapest scores 1:
//
//	cost = ttft + miss
//	ttft = base + (ahead + uncached)/rate + queued×wait + kv + lora + slowdown
//	miss = MissWeight/rate × (step×queued + uncached×ρ/(1−ρ) + (uncached−step)×least)
//	step = min(uncached, StepTokens)
//
// ttft is the request's own time to first token: ahead is the prefill
// tokens queued before it (our own pending prompts plus the server's other
// queued requests, each at the mean uncached size of ours pending there, or
// of the last ten or so we sent there when none is: another replica's
// requests to a server are guessed to look like ours to it, since this
// prompt's size counted a holder's queue of hits as misses and sent
// requests off their holders; [Ledger.queuedSize]; with KV events, plus
// the share of the prefills the events show in progress that are not
// ours: [Balancer.othersPrefilling]), uncached is the prompt less the
// blocks the prefix index says the backend holds, rate, base and wait are
// learned per backend from measured times to first byte
// ([Ledger.Estimate]), leaving out those that may include a wait for a
// LoRA slot ([Work.SlotWait]): a rare adapter's seconds behind popular ones
// say nothing of prefill, and taught the 4-server lora run's estimates a
// slow server (TTFT p90 205 -> 113 ms at x1); a backend with too few
// samples borrows the mean of the candidates of its hardware class that
// have enough, else of its engine's ([priors]), and the config's values
// only while none has. kv is a penalty rising from KVSoft to
// KVPenalty at a full cache plus KVPenalty again when the request would
// not fit; lora is 0 for a loaded adapter, LoRALoadDelay for a free slot
// or unknown state (for a free slot when another candidate runs the
// adapter, plus LoRASlotWait times the share of servers whose slots are
// full: [slotsTaken]), LoRASlotWait when requests already wait for it and
// twice that with no free slot; slowdown is what the request's decode
// loses to the backend's batch (DecodeCost).
//
// miss is the part the request's own estimate leaves out: prefilling its
// uncached tokens occupies the GPU for uncached/rate seconds, and requests
// that share the GPU meanwhile wait for it too:
//
//   - Those queued there now wait for at most one step of it. The
//     scheduler serves its queue in order, so they are ahead of the new
//     request, and a chunked prefill takes at most StepTokens of each step
//     they share. Each is charged step = min(uncached, StepTokens) tokens.
//     Charging each the whole prefill, as an earlier rule did, kept 468
//     requests of mooncake-conversation (one replica, seed 1, bench
//     --trace) on servers with 44,000 tokens of prefill left on average,
//     besides 28,000 of their own, while another server had none left in
//     397 of them; they waited 6.0 s on average for a first token.
//   - Those arriving while it runs wait for all of it. The estimate takes
//     ρ/(1−ρ) of them, the mean number of requests an M/M/1 server at
//     utilisation ρ holds, with ρ the backend's KV-cache use (capped at
//     0.95), the resource an inference server saturates first.
//   - In overload the queue stands for arrivals too: wherever the
//     request goes, at least least = the shortest candidate queue will be
//     waiting behind the part of its prefill past the first step. So
//     (uncached − step) × least; the shortest, since what a holder's
//     queue holds beyond it is in the holder's own ttft. A prompt of at
//     most one step is charged uncached × (queued + ρ/(1−ρ)); a longer
//     one is not spread off its holder merely because every server has a
//     queue.
//
// At idle miss is 0 and the rule is the fastest first token; as the fleet
// fills, a miss costs more than a holder's queue and requests stay where
// their prefix is, so that the fleet's prefill work, and with it its
// throughput, is not spent recomputing prompts it already holds. A
// holder's own queue still counts in full, so a burst spreads once the
// holder's wait passes what copying the prefix elsewhere costs.
type TTFTScorer struct{ cfg TTFTConfig }

var _ Scorer = (*TTFTScorer)(nil)

// minSamples is how many first bytes a backend's learned estimate needs
// before it replaces the fleet's.
const minSamples = 5

// maxUtilisation caps ρ in the miss cost: a full cache counts as 19
// requests arriving behind the prefill, not infinitely many.
const maxUtilisation = 0.95

// Score implements [Scorer].
func (s *TTFTScorer) Score(p *Pick, out []float64) {
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
// engine and KV size, as [TiePicker.place] tells them apart), else of its
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
func (pr *priors) learn(p *Pick) {
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
func (pr *priors) of(p *Pick, i int, cfg *TTFTConfig) (inv, base float64) {
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
	least                             float64 // the fewest requests queued on any candidate
}

func (s *TTFTScorer) consts(p *Pick) scoreConsts {
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
	k.least = math.Inf(1)
	for i := range p.Cands {
		if q := p.Cands[i].Queued; q < k.least {
			k.least = q
		}
	}
	return k
}

// slotsTaken is, for a request for an adapter that a candidate runs, the
// share of the candidates whose adapter slots the last scrape showed all
// in use; else 0. A free slot taken for such an adapter is a copy of it:
// both servers keep it while its requests keep coming to either, and the
// next adapter that runs nowhere then finds one slot fewer, and where
// every slot is taken it waits for one ([TTFTConfig.LoRASlotWait]). The
// share of full servers is taken as the chance it does. Without this
// charge a copy cost only the load delay, so a popular adapter's holders,
// a little busier than a server with a free slot, spread it over the
// fleet: on 4 servers with 4 slots each for 16 adapters, at 8 replicas,
// the most popular ran on all four, and the rarer ones waited seconds
// for slots (lora, TTFT p90 0.21-1.92 s at seeds 1-8). Read from the
// scrape, which every replica reads alike.
func slotsTaken(p *Pick) float64 {
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
func (s *TTFTScorer) estimate(p *Pick, c *Candidate, est Estimate, inv, base float64, k *scoreConsts) {
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
	c.MissCost = s.cfg.MissWeight * inv * (step*c.Queued + unc*rho/(1-rho) + (unc-step)*k.least)
	c.Cost = c.TTFT + c.MissCost
}

// TiePicker takes the highest score; candidates within Tolerance of it
// (score ≥ best/(1+Tolerance)) tie, and within Cold of it when the
// request is cold (no candidate holds any of its prompt). A warm tie goes
// to the candidate holding the most of the prompt (the same first token
// time, less work for the fleet), then to the highest rendezvous hash of
// the prompt's first block and the backend ID. Replicas that do not share
// state, and so see loads that differ by their own requests, thus place a
// conversation on the same backend.
//
// Both margins are about where a prompt lives, not only this request's
// first token: the index sends a prompt's later requests to whoever holds
// it, so a placement lasts. A cold tie goes to the highest rendezvous
// hash among the tied candidates with room, those whose KV tokens free at
// the last scrape are at least Room of the most any tied candidate has:
// new prompts fill the fleet by room, not by a hash that leaves one
// server 25 prompts and its neighbour 20, nor by a first token time that
// a start-up backlog of cold prefills distorts; and since the test is
// coarse and the scrape is what every replica reads, replicas still agree
// (taking the most free instead split them: 8 replicas kept 0.55 of one
// replica's shared-prefix hit rate, 0.78 with the threshold). A warm
// request's candidates that hold less of the prompt than the best holder
// must beat it by the Cold margin too: a copy of a prompt another server
// holds stays in both caches while its requests keep coming to either,
// so it is made only when the holder is clearly slower, not for one
// request's few hundred milliseconds (8 servers, shared-prefix at x4:
// copies made while the fleet filled took a third of the prefixes twice,
// KV use rose to 0.99 where requests landed, and the engines preempted
// 47-105 requests; TTFT p90 4.28/2.49/1.43 s at seeds 1-3, 1.13/0.78/
// 0.66 s with both rules, against 0.65/0.72/0.84 s for llm-d-load). Nor
// is a copy made on a backend with any work queued (a backlog): a copy
// relieves a busy holder only where its prefill runs at once; behind a
// queue it adds its prefill to the work every request there waits for,
// and the holder's queue drains as fast without it (8 servers,
// shared-prefix at x4, seed 4: seconds behind on the groups' first
// prompts, the fleet was sent 1.30 M uncached prompt tokens in the first
// 7 s against epp's 1.24 M, the difference copies onto H100s as far
// behind as the holders; TTFT p90 0.999 -> 0.912 s without them, the
// median of 12 seeds 0.858 -> 0.782 s with copies barred behind a
// backlog longer than the copy's own time, and over 24 seeds 922 ->
// 839 ms with copies barred behind any backlog; barred behind a quarter
// of the copy's own time, 836 ms, but the copies still made cost the
// 4-server shared-prefix overload at x2 3 s of TTFT p90 and lora at x4
// 2 s, medians of 24 seeds). A burst of one prompt then waits at its
// holders while every other backend has work of its own (8 servers,
// burst at x4: 857 -> 1,040 ms over 24 seeds, still 0.65 of the best
// peer's; 766 ms at 3 seeds with [TiePicker.place]'s class backlogs).
//
// Before all that, a cold prompt goes by bounded-load rendezvous of its
// first block when it can ([TiePicker.place]): replicas agree on a
// placement only if the candidates they choose among agree, and a tie
// window on first token estimates does not hold still: each replica
// learns every backend's prefill rate from its own few samples, and one
// replica's estimates of six identical idle H100 servers for one prompt
// ranged 0.21-0.45 s in one pick, so a 50% window held a different set
// for each replica and each minute (8 replicas, shared-prefix: 1,109
// first meetings of a replica with a group chose 2.6 servers a group).
//
// A conversation goes the same way, by its own key ([Pick.Conversation]),
// on every later turn and, once most requests on its system prompt are
// later turns ([conversations]), on its first: a replica's index knows
// where a conversation's earlier turns went only if it routed them, which
// with 8 replicas it did for one turn in eight, so the others sent a turn
// to whoever held the system prompt or, once that server was full, where
// their own loads said (8 replicas, multi-turn: 520 of 1,020 turns that
// reached a replica new to their conversation went elsewhere than its
// server; 0.81 of one replica's hit rate kept). Placed by its key, every
// replica finds it where the first turn went; the index and the scores
// decide only when its home is busy or full. A
// first turn is placed so only on a system prompt whose requests come
// back: on one whose requests are one-off questions (a shared document,
// shared-prefix) the questions belong together with their prefix.
type TiePicker struct {
	Tolerance, Cold, Room, Backlog float64

	turns  conversations
	routed promptStarts
}

var _ Picker = (*TiePicker)(nil)

// Choose implements [Picker].
func (t *TiePicker) Choose(p *Pick, total []float64) (int, string) {
	most := 0
	for i := range p.Cands {
		most = max(most, p.Cands[i].MatchedTokens)
	}
	isCold := most == 0
	// A conversation goes to its home, a cold prompt by its first block.
	conv := false
	if p.Conversation != 0 {
		later := p.Req.LaterTurn()
		conv = later || t.turns.mostlyLater(p.Key)
		if !p.Dry {
			t.turns.note(p.Key, later)
		}
	}
	if (conv || isCold) && p.Req.hasPrompt() {
		// A cold prompt this balancer has routed before was evicted from
		// wherever it went. A prompt is cold the first time its start is
		// routed, so only cold picks need noting.
		evicted := false
		if isCold && !conv {
			evicted = t.routed.has(p.Key)
			if !p.Dry {
				t.routed.note(p.Key)
			}
		}
		if t.Backlog > 0 {
			if i := t.place(p, conv, evicted); i >= 0 {
				return i, reasonFor(p, i)
			}
		}
	}
	// A copy of what another candidate holds must beat it by the Cold
	// margin: its score counts for 1/(1+Cold) of what it is; and it is
	// made only on a backend with no work queued.
	copyDiscount := 1 / (1 + t.Cold)
	adj := func(i int) float64 {
		switch c := &p.Cands[i]; {
		case c.MatchedTokens == most:
			return total[i]
		case c.Backlog > 0:
			return 0
		}
		return total[i] * copyDiscount
	}
	best := 0
	for i := range total {
		if adj(i) > adj(best) {
			best = i
		}
	}
	tol := t.Tolerance
	if isCold {
		tol = max(tol, t.Cold)
	}
	floor := adj(best) / (1 + tol)
	// A cold prompt goes to a tied candidate with room (unknown counts
	// as room).
	room := -1.0
	if isCold {
		for i := range total {
			if adj(i) >= floor {
				room = max(room, freeKV(&p.Cands[i]))
			}
		}
	}
	pick, top, held := best, uint64(0), -1
	for i := range total {
		if adj(i) < floor {
			continue
		}
		c := &p.Cands[i]
		if f := freeKV(c); isCold && f >= 0 && f < t.Room*room {
			continue
		}
		m, h := c.MatchedTokens, mix(p.Key^c.Backend.idHash)
		if m > held || (m == held && h >= top) {
			pick, top, held = i, h, m
		}
	}
	return pick, reasonFor(p, pick)
}

// conversations tells, per prompt start (a chat's [Pick.Key], the first
// block of its system prompt), whether its requests are mostly later
// turns of conversations, which come back with their history, from the
// last 32-64 chats on it: a direct-mapped table of 4,096 entries, each a
// tag from the key's high bits, the later turns and the requests, read
// and written without a lock (picks that race lose a count).
type conversations struct{ e [4096]atomic.Uint64 }

const (
	turnsWindow = 64 // counts halve at this many requests
	turnsMin    = 4  // requests seen before a start can be mostly later turns
)

func (c *conversations) slot(key uint64) (e *atomic.Uint64, tag uint64) {
	return &c.e[key%uint64(len(c.e))], key >> 32
}

// note counts one chat on key, a later turn or not.
func (c *conversations) note(key uint64, later bool) {
	e, tag := c.slot(key)
	v := e.Load()
	n, l := v&0xffff, v>>16&0xffff
	if v>>32 != tag {
		n, l = 0, 0
	}
	n++
	if later {
		l++
	}
	if n >= turnsWindow {
		n, l = n/2, l/2
	}
	e.Store(tag<<32 | l<<16 | n)
}

// mostlyLater reports whether more than half of the chats counted on key,
// of at least turnsMin, were later turns.
func (c *conversations) mostlyLater(key uint64) bool {
	e, tag := c.slot(key)
	v := e.Load()
	n, l := v&0xffff, v>>16&0xffff
	return v>>32 == tag && n >= turnsMin && 2*l > n
}

// promptStarts remembers the prompt starts ([Pick.Key]) a balancer has
// routed cold: a direct-mapped table of 16,384 keys, read and written
// without a lock. Picks that race lose an entry and a key is forgotten
// when a newer one takes its slot; such a prompt is taken for new.
type promptStarts struct{ e [16384]atomic.Uint64 }

func (s *promptStarts) note(key uint64) { s.e[key%uint64(len(s.e))].Store(key) }

func (s *promptStarts) has(key uint64) bool {
	return key != 0 && s.e[key%uint64(len(s.e))].Load() == key
}

// maxClasses is how many hardware classes [TiePicker.place] tells
// apart; candidates of further classes count as their own.
const maxClasses = 8

// place returns the candidate a cold prompt goes to by bounded-load
// rendezvous of its first block, or -1 when none qualifies: the highest
// rendezvous hash of the key among the candidates that
//
//   - are as fast as the fastest, within Cold, by their hardware class's
//     time plus their own penalties (a full cache, the adapter not
//     loaded): a class is the backends of one engine and one KV size,
//     taken as the same GPU and model, and its time the mean of its
//     members' estimates of the prompt's first token less those
//     penalties, which is steady where each member's own estimate is not
//     (the decode slowdown, which follows load, stays in the mean: counted
//     per candidate, it split 8 replicas' placements again, shared-prefix
//     TTFT p90 125 -> 281 ms). The members' backlogs stay in the mean
//     too: while the fast class is behind, a slower one with little
//     queued is as fast for a new prompt, and takes it, where it would
//     otherwise take the prompt's group only later, by a copy (8 servers,
//     shared-prefix at x4, seed 1: the A100s were the first server of 10
//     groups and later home to 9 more, moved there by copying; over 24
//     seeds TTFT p90 839 -> 788 ms; burst at x4 1,040 -> 766 ms at 3
//     seeds);
//   - have a backlog of at most Backlog times the fastest class's time
//     without its backlog, the prompt's time alone there: replicas whose
//     loads differ below the bound still agree;
//   - have room, as in the tie rule: KV tokens free at the last scrape at
//     least Room of the most any of them has.
//
// With conv, the key is the conversation's ([Pick.Conversation]) and the
// candidate its home: the highest hash among the fast ones, returned only
// if it has the backlog and room of the other two rules. A conversation
// whose home is busy goes where the scores say, which is where its
// earlier turns are when the index knows, not to the next in the hash's
// order, which holds none of it (8 servers, multi-turn at x4, seeds 1-3:
// TTFT p90 129/109/100 ms to the next, 104/103/98 ms by the scores,
// both with the key of the last whole block alone).
//
// A backend that is slow but reports the same engine and KV size as fast
// ones shares their class; its backlog, which its slowness grows, is what
// keeps new prompts off it.
//
// With evicted, the prompt was routed before and no backend holds any of
// it now: the caches it went to did not keep it until it came back.
// Placed again among the fastest, it evicts another prompt there, while
// the slower classes' caches, which new prompts do not go to until the
// fast ones are busy, hold little. So every class counts as fast as the
// fastest (a backend's own penalties, a full cache or an adapter not
// loaded, still count, and the backlog bound still counts from the
// fastest class's time) and room is the share of each one's KV free,
// since the classes' caches differ in size. Its later requests then hit
// where it went: 4 servers (three H100s, an A100), shared-prefix at
// x0.25, where the H100s' caches cannot keep all 150 system prompts: TTFT
// p90 281 -> 182 ms, the median of 24 seeds, as llm-d-precise's 182 ms,
// which reads the caches' real contents.
func (t *TiePicker) place(p *Pick, conv, evicted bool) int {
	var hw hwClasses
	hw.classify(p.Cands)
	// own is what the candidate's own state adds to its class's time.
	own := func(c *Candidate) float64 { return c.LoRAPenalty + c.KVPenalty }
	var backlog [maxClasses]float64 // per class, its members' backlogs summed
	for i := range p.Cands {
		c := &p.Cands[i]
		if k := hw.at(p.Cands, i); k >= 0 {
			hw.sum[k] += c.TTFT - c.Backlog - own(c)
			backlog[k] += c.Backlog
			hw.n[k]++
		}
	}
	// alone is candidate i's class's time for the prompt with nothing
	// queued, speed with the class's mean backlog; both add i's own
	// penalties.
	alone := func(i int) float64 {
		c := &p.Cands[i]
		if k := hw.at(p.Cands, i); k >= 0 {
			return hw.sum[k]/hw.n[k] + own(c)
		}
		return c.TTFT - c.Backlog
	}
	speed := func(i int) float64 {
		if k := hw.at(p.Cands, i); k >= 0 {
			return alone(i) + backlog[k]/hw.n[k]
		}
		return p.Cands[i].TTFT
	}
	fastest, fastestAlone := math.Inf(1), math.Inf(1)
	for i := range p.Cands {
		fastest = min(fastest, speed(i))
		fastestAlone = min(fastestAlone, alone(i))
	}
	// An evicted prompt counts every class as fast as the fastest (the
	// class backlogs in); each backend's own penalties still count.
	pace := speed
	if evicted {
		pace = func(i int) float64 { return fastest + own(&p.Cands[i]) }
	}
	ok := func(i int) bool {
		return pace(i) <= (1+t.Cold)*fastest && p.Cands[i].Backlog <= t.Backlog*fastestAlone
	}
	free := freeKV
	if evicted {
		free = freeShare
	}
	room, qualified := -1.0, 0
	for i := range p.Cands {
		if ok(i) {
			room = max(room, free(&p.Cands[i]))
			qualified++
		}
	}
	if qualified < 2 {
		return -1 // no choice to agree on: one backend is not a spread
	}
	hasRoom := func(i int) bool {
		f := free(&p.Cands[i])
		return f < 0 || f >= t.Room*room
	}
	key := p.Key
	if conv {
		key = p.Conversation
	}
	pick, top := -1, uint64(0)
	for i := range p.Cands {
		switch {
		case conv && speed(i) > (1+t.Cold)*fastest:
			continue
		case !conv && (!ok(i) || !hasRoom(i)):
			continue
		}
		if h := mix(key ^ p.Cands[i].Backend.idHash); pick < 0 || h > top {
			pick, top = i, h
		}
	}
	if conv && pick >= 0 && (!ok(pick) || !hasRoom(pick)) {
		return -1 // home is busy or full
	}
	return pick
}

// hwClasses tells apart up to maxClasses hardware classes, the backends
// of one engine and one reported KV size, and sums a value per class.
type hwClasses struct {
	key [maxClasses]struct {
		engine string
		blocks float64 // -1 when not reported
	}
	sum, n [maxClasses]float64
	k      int      // classes seen
	first  [64]int8 // the first candidates' classes, set by classify
}

// classify enters every candidate's class, remembering the first ones'.
func (h *hwClasses) classify(cands []Candidate) {
	for i := range cands {
		k := h.of(&cands[i])
		if i < len(h.first) {
			h.first[i] = int8(k)
		}
	}
}

// at returns the class of cands[i], which classify has seen, or -1 past
// maxClasses.
func (h *hwClasses) at(cands []Candidate, i int) int {
	if i < len(h.first) {
		return int(h.first[i])
	}
	return h.of(&cands[i])
}

// of returns c's class, entering it if new, or -1 past maxClasses.
func (h *hwClasses) of(c *Candidate) int {
	e, b := c.Backend.Engine, -1.0
	if m := &c.Backend.Metrics; m.NumBlocks.Known {
		b = m.NumBlocks.V
	}
	for k := range h.k {
		if h.key[k].engine == e && h.key[k].blocks == b {
			return k
		}
	}
	if h.k == maxClasses {
		return -1
	}
	h.key[h.k].engine, h.key[h.k].blocks = e, b
	h.k++
	return h.k - 1
}

// freeKV is c's KV tokens free at the last scrape, or -1 when unknown.
func freeKV(c *Candidate) float64 {
	bm := &c.Backend.Metrics
	if !bm.KVUsage.Known || !bm.BlockSize.Known || !bm.NumBlocks.Known {
		return -1
	}
	return (1 - bm.KVUsage.V) * bm.BlockSize.V * bm.NumBlocks.V
}

// freeShare is the share of c's KV blocks free at the last scrape, or -1
// when unknown.
func freeShare(c *Candidate) float64 {
	if bm := &c.Backend.Metrics; bm.KVUsage.Known {
		return 1 - bm.KVUsage.V
	}
	return -1
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
// nginx's default round-robin does (unweighted).
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

// RandomPicker picks uniformly at random, as the SGLang model gateway's
// random policy does.
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
// choiceCount 2). Ties go to the first drawn.
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

// RingPicker is KubeAI's CHWBL, consistent hashing with bounded loads
// (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
// Loads", 2018; kubeai-project/kubeai internal/loadbalancer and
// api/openai/v1/chat_completions.go at f442a2cd): the key is the model or
// adapter name and the first 100 characters of the first user message
// (the system prompt skipped; a completion's prompt), hashed with xxhash64
// onto a ring of VirtualNodes points per backend. The request goes to the
// first backend clockwise whose requests in flight are at most LoadFactor
// times the average counting this one; when none is, to the key's first
// backend, so it never queues.
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
	key := p.Req.UserText
	if key == nil {
		key = p.Req.Prompt
	}
	if n := r.cfg.PrefixBytes; len(key) > n {
		key = key[:n]
	}
	var d xxhash.Digest
	_, _ = d.WriteString(p.Req.Model)
	_, _ = d.Write(key)
	h := d.Sum64()
	var inFlight int64
	for i := range p.Cands {
		inFlight += p.Cands[i].InFlight
	}
	bound := r.cfg.LoadFactor * float64(inFlight+1) / float64(len(p.Cands))
	rg := r.ringFor(p.snap)
	start, _ := slices.BinarySearchFunc(rg.points, h, func(pt ringPoint, h uint64) int { return cmp.Compare(pt.hash, h) })
	home := -1
	for k := range rg.points {
		pt := rg.points[(start+k)%len(rg.points)]
		for i := range p.Cands {
			if p.Cands[i].Backend.idHash != pt.id {
				continue
			}
			if home < 0 {
				home = i
			}
			if float64(p.Cands[i].InFlight) <= bound {
				return i, "consistent-hash"
			}
		}
	}
	return max(home, 0), "consistent-hash"
}

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
func (s *SGLangPicker) Choose(p *Pick, _ []float64) (int, string) {
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
	choice, why := least, "least-load"
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
					choice, why = i, "prefix-hit"
					break
				}
			}
		case hit:
			choice, why = s.holder(p, by, bestLen), "prefix-hit"
			mean := float64(sum) / float64(len(p.Cands))
			if l := float64(p.Cands[choice].InFlight); l > mean*s.cfg.BalanceRelThreshold && l > mean+float64(s.cfg.BalanceAbsThreshold) {
				choice, why = least, "least-load"
			}
		case s.legacy:
			smallest := 0
			for i := range p.Cands {
				if s.tree.Size(p.Cands[i].Backend.slot) < s.tree.Size(p.Cands[smallest].Backend.slot) {
					smallest = i
				}
			}
			choice, why = smallest, "cache-space"
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
func (s *SGLangPicker) holder(p *Pick, by []int32, best int32) int {
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

// committer is a scorer or picker that learns from the pick's outcome; a
// pick calls Commit once the primary is chosen, never for a dry run.
type committer interface {
	Commit(p *Pick, chosen int)
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
type NoHitLRUScorer struct{ lru *coldLRU }

var (
	_ Scorer    = (*NoHitLRUScorer)(nil)
	_ committer = (*NoHitLRUScorer)(nil)
)

// coldLRU is the order in which backends took cold requests, by idHash,
// least recent first.
type coldLRU struct {
	mu    sync.Mutex
	order []uint64 // guarded by mu
}

func cold(p *Pick) bool {
	for i := range p.Cands {
		if p.Cands[i].MatchedBlocks > 0 {
			return false
		}
	}
	return true
}

// Score implements [Scorer].
func (s *NoHitLRUScorer) Score(p *Pick, out []float64) {
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
	s.lru.mu.Lock()
	defer s.lru.mu.Unlock()
	never := 0
	for i := range p.Cands {
		if !slices.Contains(s.lru.order, p.Cands[i].Backend.idHash) {
			out[i] = 1 - float64(never)/float64(n-1)
			never++
		}
	}
	for i := range p.Cands {
		if pos := slices.Index(s.lru.order, p.Cands[i].Backend.idHash); pos >= 0 {
			out[i] = max(0, 1-float64(never+pos)/float64(n-1))
		}
	}
}

// Commit implements [committer]: a cold request makes its backend the
// most recently used.
func (s *NoHitLRUScorer) Commit(p *Pick, chosen int) {
	if !cold(p) {
		return
	}
	id := p.Cands[chosen].Backend.idHash
	s.lru.mu.Lock()
	defer s.lru.mu.Unlock()
	s.lru.order = append(slices.DeleteFunc(s.lru.order, func(x uint64) bool { return x == id }), id)
	if len(s.lru.order) > 1024 { // llm-d's LRU size: gone backends age out
		s.lru.order = slices.Delete(s.lru.order, 0, len(s.lru.order)-1024)
	}
}

// PromptInParts reports whether the policy reads a prompt only through
// its block hashes, so that a request may carry it as [Request.Parts]:
// true for the policies with a prefix index and no text tree, oracle or
// hash ring, which read the prompt's bytes.
func (b *Balancer) PromptInParts() bool {
	_, ring := b.pol.picker.(*RingPicker)
	return b.pol.index != nil && b.pol.tree == nil && b.pol.oracle == nil && !ring
}

// ReadsCacheEvents reports whether the policy matches prompts against the
// engines' KV-cache events ([Deps.Events]), so that a request is worth
// tokenizing into [Request.TokenBlocks] before its pick.
func (b *Balancer) ReadsCacheEvents() bool { return b.pol.events != nil }
