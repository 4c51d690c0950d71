package balancer

import (
	"math"
	"sync/atomic"
)

// TTFTPicker is the ttft policy's picker. It places a request by the
// estimate parts its embedded [TTFTScorer] writes into each candidate
// (TTFT, Backlog, KVPenalty, LoRAPenalty), which no other scorer fills in,
// so it runs as its own policy's only scorer as well as its picker
// ([ttftPolicy]). Its margins are the scorer's [TTFTConfig]: TieTolerance,
// CopyMargin, ColdRoom and ColdBacklog.
//
// Its rules are about where a prompt lives, not only this request's first
// token: the index sends a prompt's later requests to whoever holds it, so
// a placement lasts; and replicas that share no state must place a prompt
// alike. In the order Choose applies them:
//
//   - A cold prompt (no candidate holds any of it) is placed
//     ([TTFTPicker.place]). Alone, on the backend that took the fewest
//     new prompt tokens lately, so that new prompts spread evenly over the
//     caches (docs/design/ttft.md#alone). With [TTFTConfig.Replicated], by
//     bounded-load rendezvous of its first block, and a conversation by its
//     own key ([PickInfo.Conversation]) on every later turn and, once most
//     requests on its system prompt are later turns ([conversations]), on
//     its first: a hash every replica computes alike, since a replica's
//     index knows where a conversation's earlier turns went only if it
//     routed them, and a tie window on first-token estimates does not hold
//     still. A first turn is placed so only on a system prompt whose
//     requests come back: one-off questions on a shared document belong
//     with their prefix. ColdBacklog 0 turns this rule off. See
//     docs/design/ttft.md#rendezvous and docs/design/ttft.md#conversations.
//   - Otherwise the highest score wins, but a candidate that holds less of
//     the prompt than the best holder must beat it by CopyMargin, and
//     one with any work queued (a backlog) may not take it at all: a copy
//     of a prompt stays in both caches while its requests keep coming to
//     either, and behind a queue its prefill adds to the work every request
//     there waits for, while the holder's queue drains as fast without it.
//     See docs/design/ttft.md#copy-margin and
//     docs/design/ttft.md#no-copy-behind-a-backlog.
//   - Candidates within TieTolerance of the best (score ≥
//     best/(1+TieTolerance)) tie. A warm tie goes to the candidate holding the most of
//     the prompt (the same first token, less work for the fleet), then to
//     the highest rendezvous hash of the prompt's first block and the
//     backend ID, so that replicas, which see loads that differ by their
//     own requests, place a conversation on the same backend.
//   - A cold tie goes to the highest rendezvous hash among the tied
//     candidates with room: KV tokens free at the last scrape at least
//     ColdRoom of the most any tied candidate has. New prompts then fill
//     the fleet by room, and since the test is coarse and reads the scrape
//     every replica reads, replicas still agree. See
//     docs/design/ttft.md#cold-room.
type TTFTPicker struct {
	// TTFTScorer is the picker's own scorer: Choose reads the estimate
	// parts it writes into each candidate, and its config.
	TTFTScorer

	turns  conversations
	routed promptStarts
	placed atomic.Uint64 // new prompts placed alone: [Ledger.place]'s count
}

var (
	_ Picker = (*TTFTPicker)(nil)
	_ Scorer = (*TTFTPicker)(nil)
)

// ttftPolicy is the policy of the ttft presets: one [TTFTPicker], run as
// the only scorer and as the picker, so that Choose reads the estimates
// its own Score wrote on the same pick.
func ttftPolicy(cfg TTFTConfig) *policy {
	t := &TTFTPicker{TTFTScorer: TTFTScorer{cfg: cfg}}
	return &policy{scorers: []weighted{{t, 1}}, picker: t}
}

// Choose implements [Picker].
func (t *TTFTPicker) Choose(p *PickInfo, total []float64) (int, Reason) {
	most := 0
	for i := range p.Cands {
		most = max(most, p.Cands[i].MatchedTokens)
	}
	isCold := most == 0
	// Among replicas a conversation goes to its home; a cold prompt is
	// placed ([TTFTPicker.place]).
	off := t.cfg.Off
	conv := false
	if p.Conversation != 0 && !off.has(ruleConversations) && t.cfg.Replicated {
		later := p.Req.LaterTurn()
		conv = later || t.turns.mostlyLater(p.Key)
		if !p.Dry {
			t.turns.note(p.Key, later)
		}
	}
	if (conv || isCold && !off.has(ruleColdPlace)) && p.Req.hasPrompt() {
		// A cold prompt this balancer has routed before was evicted from
		// wherever it went. A prompt is cold the first time its start is
		// routed, so only cold picks need noting.
		evicted := false
		if isCold && !conv && !off.has(ruleEvicted) {
			evicted = t.routed.has(p.Key)
			if !p.Dry {
				t.routed.note(p.Key)
			}
		}
		if t.cfg.ColdBacklog > 0 {
			if i := t.place(p, conv, evicted); i >= 0 {
				return i, reasonFor(p, i)
			}
		}
	}
	// A copy of what another candidate holds must beat it by the
	// CopyMargin: its score counts for 1/(1+CopyMargin)
	// of what it is; it is made only on a backend with no work queued;
	// and, but for an adapter's, it must beat the holder by the margin
	// without the decode slowdown too (see [copyCost]).
	copyDiscount := 1 / (1 + t.cfg.CopyMargin)
	if off.has(ruleCopyMargin) {
		copyDiscount = 1
	}
	holder := math.Inf(1) // the best holder's cost without the slowdown
	for i := range p.Cands {
		if c := &p.Cands[i]; c.MatchedTokens == most {
			holder = min(holder, copyCost(c))
		}
	}
	adj := func(i int) float64 {
		switch c := &p.Cands[i]; {
		case c.MatchedTokens == most:
			return total[i]
		case c.Backlog > 0 && !off.has(ruleBacklogCopy):
			return 0
		case c.LoRA == LoRANone && !off.has(ruleCopyBatch) && copyCost(c) >= holder*copyDiscount:
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
	floor := adj(best) / (1 + t.cfg.TieTolerance)
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
		if f := freeKV(c); isCold && f >= 0 && f < t.cfg.ColdRoom*room {
			continue
		}
		m, h := c.MatchedTokens, mix(p.Key^c.Backend.idHash)
		if m > held || (m == held && h >= top) {
			pick, top, held = i, h, m
		}
	}
	return pick, reasonFor(p, pick)
}

// copyCost is what a copy is judged by against the holder: the cost
// without the decode slowdown. The batch a request would join drains within
// seconds, while a copy stays in both caches as long as its requests come,
// and where a cache holds little beside its own prompts the copy evicts
// another's. An adapter's requests still count the slowdown: they can go
// only where the adapter runs, so its holders' batches grow with all of
// them. See docs/design/ttft.md#copy-batch.
func copyCost(c *Candidate) float64 { return c.Cost - c.DecodeSlowdown }

// conversations tells, per prompt start (a chat's [PickInfo.Key], the first
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

// promptStarts remembers the prompt starts ([PickInfo.Key]) a balancer has
// routed cold: a direct-mapped table of 16,384 keys, read and written
// without a lock. Picks that race lose an entry and a key is forgotten
// when a newer one takes its slot; such a prompt is taken for new.
type promptStarts struct{ e [16384]atomic.Uint64 }

func (s *promptStarts) note(key uint64) { s.e[key%uint64(len(s.e))].Store(key) }

func (s *promptStarts) has(key uint64) bool {
	return key != 0 && s.e[key%uint64(len(s.e))].Load() == key
}

// maxClasses is how many hardware classes [TTFTPicker.place] tells
// apart; candidates of further classes count as their own.
const maxClasses = 8

// place returns the candidate a cold prompt goes to, or -1 when fewer
// than two qualify (one backend is no choice to agree on): alone, the one
// that took the fewest new prompt tokens lately, ties by rendezvous; with
// [TTFTConfig.Replicated], by bounded-load rendezvous of its first block,
// the highest rendezvous hash of the key. Either among the candidates that
//
//   - are as fast as the fastest, within CopyMargin, by their
//     hardware class's time plus their own penalties (a full cache, the
//     adapter not loaded). A class is the backends of one engine and one
//     KV size, taken as the same GPU and model, and its time the mean of
//     its members' estimates of the prompt's first token less those
//     penalties, which is steady where each member's own estimate is not.
//     The decode slowdown, which follows load, and the members' backlogs
//     stay in the mean: while the fast class is behind, a slower one with
//     little queued is as fast for a new prompt, and takes it now rather
//     than later by a copy. See docs/design/ttft.md#class-time.
//   - have a backlog of at most ColdBacklog times the fastest class's time
//     without its backlog, the prompt's time alone there: replicas whose
//     loads differ below the bound still agree;
//   - have room, as in the tie rule: KV tokens free at the last scrape at
//     least ColdRoom of the most any of them has.
//
// With conv, the key is the conversation's ([PickInfo.Conversation]) and
// the candidate its home: the highest hash among the fast ones, returned
// only if it has the backlog and room of the other two rules, else -1. A
// conversation whose home is busy goes where the scores say, which is
// where its earlier turns are when the index knows, not to the next in the
// hash's order, which holds none of it. See docs/design/ttft.md#busy-home.
//
// A backend that is slow but reports the same engine and KV size as fast
// ones shares their class; its backlog, which its slowness grows, is what
// keeps new prompts off it.
//
// With evicted, the prompt was routed before and no backend holds any of
// it now: the caches it went to did not keep it until it came back.
// Placed again among the fastest, it would evict another prompt there,
// while the slower classes' caches, which new prompts do not go to until
// the fast ones are busy, hold little. So every class counts as fast as
// the fastest (a backend's own penalties, a full cache or an adapter not
// loaded, still count, and the backlog bound still counts from the
// fastest class's time) and room is the share of each one's KV free,
// since the classes' caches differ in size. See docs/design/ttft.md#evicted.
func (t *TTFTPicker) place(p *PickInfo, conv, evicted bool) int {
	var hw hwClasses
	// class is candidate i's class, or -1 when it counts as its own (past
	// maxClasses, or every candidate with the class-time rule off).
	class := func(int) int { return -1 }
	if !t.cfg.Off.has(ruleClassTime) {
		hw.classify(p.Cands)
		class = func(i int) int { return hw.at(p.Cands, i) }
	}
	// own is what the candidate's own state adds to its class's time.
	own := func(c *Candidate) float64 { return c.LoRAPenalty + c.KVPenalty }
	var backlog [maxClasses]float64 // per class, its members' backlogs summed
	for i := range p.Cands {
		c := &p.Cands[i]
		if k := class(i); k >= 0 {
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
		if k := class(i); k >= 0 {
			return hw.sum[k]/hw.n[k] + own(c)
		}
		return c.TTFT - c.Backlog
	}
	speed := func(i int) float64 {
		if k := class(i); k >= 0 {
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
		return pace(i) <= (1+t.cfg.CopyMargin)*fastest && p.Cands[i].Backlog <= t.cfg.ColdBacklog*fastestAlone
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
		return f < 0 || f >= t.cfg.ColdRoom*room
	}
	key := p.Key
	if conv {
		key = p.Conversation
	}
	// An adapter's new prompts go by the hash alone too: spread by tokens,
	// they went to servers that must load the adapter (lora on 4 vllm-v1
	// servers at x2: TTFT p90 7.63 s against 476 ms, seed 1).
	spread := !t.cfg.Replicated && p.Cands[0].LoRA == LoRANone
	pick, top, least := -1, uint64(0), 0.0
	n := t.placed.Load()
	for i := range p.Cands {
		switch {
		case conv && speed(i) > (1+t.cfg.CopyMargin)*fastest:
			continue
		case !conv && (!ok(i) || !hasRoom(i)):
			continue
		}
		// Alone, a new prompt goes to the qualified backend that took the
		// fewest new prompt tokens lately, so that new prompts spread
		// evenly over the caches, even after a backend was passed over
		// while busy; replicas that share no state must agree instead, and
		// go by the highest rendezvous hash, which also breaks ties.
		h, w := mix(key^p.Cands[i].Backend.idHash), 0.0
		if spread {
			w = p.Cands[i].Backend.Ledger.placedWeight(n)
		}
		if pick < 0 || w < least || w == least && h > top {
			pick, top, least = i, h, w
		}
	}
	if pick >= 0 && !conv && spread && !p.Dry {
		p.Cands[pick].Backend.Ledger.place(p.Req.PromptTokens, t.placed.Add(1))
	}
	if conv && pick >= 0 && (!ok(pick) || !hasRoom(pick)) {
		return -1 // home is busy or full
	}
	return pick
}

// hwClasses tells apart up to maxClasses hardware classes, the backends
// of one engine and one reported KV size, and sums a value per class.
type hwClasses struct {
	key    [maxClasses]hwKey
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
	key := classOf(c.Backend)
	for k := range h.k {
		if h.key[k] == key {
			return k
		}
	}
	if h.k == maxClasses {
		return -1
	}
	h.key[h.k] = key
	h.k++
	return h.k - 1
}

// hwKey names a hardware class: one engine and one reported KV size.
type hwKey struct {
	engine string
	blocks float64 // -1 when not reported
}

// classOf is be's hardware class.
func classOf(be *Backend) hwKey {
	k := hwKey{be.Engine, -1}
	if be.Metrics.NumBlocks.Known {
		k.blocks = be.Metrics.NumBlocks.V
	}
	return k
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
