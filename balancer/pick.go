package balancer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// maxCandidates bounds the backends one pick returns.
const maxCandidates = 8

// ErrSaturated is returned by [Balancer.Pick] when every backend that could
// take the request is saturated and the admission queue is on:
// [Balancer.PickWait] then waits for capacity.
var ErrSaturated = errors.New("every backend is saturated")

// Request is what the picker needs to know about one request.
type Request struct {
	// Model is the model backends are asked for (after model routing).
	Model string
	// Prompt is the canonical prompt bytes (prefix package); nil for
	// requests routed by model and load only, and when Parts holds them.
	Prompt []byte
	// Parts, when set, holds the canonical prompt in pieces instead of
	// Prompt (prefix.Parts: a long prompt's text hashed where it lies in
	// the request body, never copied). Only for a balancer whose
	// [Balancer.PromptInParts] is true.
	Parts PromptParts
	// Seed seeds the prompt's block hashes: the model and cache_salt.
	Seed uint64
	// PromptTokens estimates the prompt's tokens.
	PromptTokens int
	// MaxTokens is the output tokens requested; 0 means not said.
	MaxTokens int
	// UserText is the start of the first user message of a chat (the
	// prompt's text for a completion), for policies keyed by it
	// (consistent-hash); nil means Prompt.
	UserText []byte
	// FirstUser and FirstTurn are, for a chat with a user message, where
	// the first one begins and ends in the prompt's canonical bytes
	// ([prefix.Parts]); 0 otherwise.
	FirstUser, FirstTurn int
	// Session is the session-affinity header's value, or "".
	Session string
	// Priority orders the admission queue; negative is sheddable.
	Priority int
	// Guard, when set, is attached to the chosen backend inside the pick,
	// so that concurrent picks see this request in the ledger at once and
	// a burst does not all choose the backend that looked idlest.
	Guard *Guard
	// TokenBlocks are the prompt's full blocks of token ids as the
	// engines tokenize it, hashed as the [CacheEvents] index keys them
	// (kvevents.Blocks), TokenBlockSize tokens a block; nil when the
	// prompt was not tokenized, and then only the approximate index is
	// matched.
	TokenBlocks    []uint64
	TokenBlockSize int
}

// PromptParts is a canonical prompt in pieces (prefix.Parts): its length,
// and its block hashes cut as [PrefixIndex.HashShape] says.
type PromptParts interface {
	Len() int
	AppendHashes(dst []uint64, seed uint64, blockBytes, maxBlocks int, partial bool) []uint64
	// AppendRange appends the bytes from offset from up to to.
	AppendRange(dst []byte, from, to int) []byte
}

// LaterTurn reports whether the prompt is a later turn of a chat
// conversation: it goes on past its first user message.
func (r *Request) LaterTurn() bool {
	n := len(r.Prompt)
	if r.Parts != nil {
		n = r.Parts.Len()
	}
	return r.FirstTurn > 0 && r.FirstTurn < n
}

// hasPrompt reports whether the request carries a prompt to match.
func (r *Request) hasPrompt() bool {
	return len(r.Prompt) > 0 || r.Parts != nil && r.Parts.Len() > 0
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

// Decision is the outcome of [Balancer.Pick].
type Decision struct {
	// Candidates are the backends to try, best first. Never empty when Pick
	// returns a nil error.
	Candidates []*Backend
	// Work is each candidate's estimated cost, for [Guard.Attach].
	Work [maxCandidates]Work
	// Reason says why the first candidate was chosen, for the
	// x-llmlb-reason header: prefix-hit, least-load, lora, affinity,
	// round-robin, random, consistent-hash, cache-space, stale-metrics,
	// fallback or saturated.
	Reason string
	// Waited is the time spent in the admission queue.
	Waited time.Duration
}

// LoRAState is how ready a backend is to run a request's adapter.
type LoRAState int

const (
	// LoRANone: the request is for a base model.
	LoRANone LoRAState = iota
	// LoRARunning: the adapter is loaded (scraped, or in flight from us).
	LoRARunning
	// LoRAFree: a slot is free below max_lora; the adapter must be loaded.
	LoRAFree
	// LoRAUnknown: the backend reports no LoRA information.
	LoRAUnknown
	// LoRAWaiting: requests already wait for the adapter to get a slot.
	LoRAWaiting
	// LoRAFull: every slot holds another adapter.
	LoRAFull
)

var loraNames = [...]string{"none", "running", "free-slot", "unknown", "waiting", "no-slot"}

// String returns the state's name as /debug/route shows it.
func (s LoRAState) String() string { return loraNames[s] }

// MarshalText writes s as its name.
func (s LoRAState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a name MarshalText wrote.
func (s *LoRAState) UnmarshalText(b []byte) error {
	for i, n := range loraNames {
		if n == string(b) {
			*s = LoRAState(i)
			return nil
		}
	}
	return fmt.Errorf("unknown LoRA state %q", b)
}

// Candidate is one backend as a pick sees it: scraped values corrected by
// what the balancer sent since the scrape, prefix match and, once scored,
// the time-to-first-token estimate's parts.
type Candidate struct {
	Backend *Backend `json:"-"`
	// Queued and Running estimate the backend's waiting and running
	// requests now: the last scrape plus requests sent since, minus those
	// that started or finished since. Without metrics, our own.
	Queued  float64 `json:"queued"`
	Running float64 `json:"running"`
	// KVUsage estimates KV-cache use now, 0..1.
	KVUsage  Value `json:"kv_usage"`
	InFlight int64 `json:"in_flight"`
	// PendingTokens are prompt tokens we sent that are not prefilled yet.
	PendingTokens int64 `json:"pending_tokens"`
	// AheadTokens estimates the prefill work queued before this request:
	// our pending prompts plus the server's other queued requests, each
	// at the mean uncached size of our pending ones, or when none is
	// pending of the last ten or so we sent there (this prompt's before
	// the first): what another balancer sends a server is guessed to
	// look like what this one sends it, not like this prompt.
	AheadTokens float64 `json:"ahead_tokens"`
	// MatchedBlocks of the request's PromptBlocks the backend is believed
	// to hold, MatchedTokens their tokens, UncachedTokens the rest.
	MatchedBlocks  int       `json:"matched_blocks"`
	MatchedTokens  int       `json:"matched_tokens"`
	UncachedTokens int       `json:"uncached_tokens"`
	LoRA           LoRAState `json:"lora"`
	Saturated      bool      `json:"saturated"`
	// The ttft policy's estimate in seconds and its parts.
	TTFT        float64 `json:"ttft_seconds"`
	Prefill     float64 `json:"prefill_seconds"`
	QueueWait   float64 `json:"queue_wait_seconds"`
	KVPenalty   float64 `json:"kv_penalty_seconds"`
	LoRAPenalty float64 `json:"lora_penalty_seconds"`
	// DecodeSlowdown is what the request's decode loses to the backend's
	// running batch (TTFTConfig.DecodeCost).
	DecodeSlowdown float64 `json:"decode_slowdown_seconds"`
	// MissCost is what prefilling the uncached tokens here costs the
	// requests that share the backend; Cost is TTFT plus MissCost, what
	// the ttft policy minimises ([TTFTScorer]).
	MissCost float64 `json:"miss_cost_seconds"`
	// Backlog is the part of TTFT spent behind other work: the prefill
	// queued ahead (AheadTokens) and the queue wait.
	Backlog float64 `json:"backlog_seconds"`
	Cost    float64 `json:"cost_seconds"`

	adapter  string // the request's adapter on this backend, or ""
	slotWait bool   // the adapter may wait for a slot here (Work.SlotWait)
}

// Pick is one pick in progress, as scorers and pickers see it. Cands are
// the backends that passed the filters, in snapshot order.
type Pick struct {
	Req   *Request
	Cands []Candidate
	// PromptBlocks is how many blocks the prompt hashed to.
	PromptBlocks int
	// Key is a hash of the prompt's start, the same on every replica.
	Key uint64
	// Conversation is, for a chat, a hash of the prompt through its first
	// user message (the chained hash of the last whole block there, with
	// the bytes after it up to the message's end; the first block when no
	// system prompt comes before the message): the same on every turn of
	// a conversation and every replica, different for conversations that
	// share a system prompt, however short their first messages. 0 for
	// other requests.
	Conversation uint64
	// Dry is set for /debug/route: pickers must not change state.
	Dry bool

	snap   *Snapshot
	hashes []uint64
}

// scratch holds one pick's buffers; pooled, so a warm Pick allocates
// nothing.
type scratch struct {
	p       Pick
	cands   []Candidate
	scores  []float64
	total   []float64
	hashes  []uint64
	bySlot  []int32
	tail    []byte // the bytes a conversation's key reads after its last whole block
	matched bool   // the index found some backend holding the prompt's start
	stale   []int
	unknown []int
}

// Scorer rates every candidate of a pick, writing a value in [0,1] (1 is
// best) into out, which is indexed like p.Cands. A scorer may also fill in
// the candidates' estimate fields.
type Scorer interface {
	Score(p *Pick, out []float64)
}

// Picker chooses the primary candidate given the weighted total scores,
// indexed like p.Cands, and says why.
type Picker interface {
	Choose(p *Pick, total []float64) (int, string)
}

// Pick chooses the backends for req from the current snapshot, in named
// stages (see pick): hash the prompt; filter: the backend must serve the
// model and be ready with fresh metrics; when none is, ready backends with
// stale metrics are used ("stale-metrics"); when none is ready, those not
// probed yet ("fallback"); down and draining backends never. Then prefix
// match; saturation: among the fresh, saturated backends are dropped
// unless they hold part of the prompt and their queue is not far past the
// others' (SaturationConfig.KeepHolders, HolderQueue); if
// all are saturated, Pick returns [ErrSaturated] when the admission queue
// is on, and uses them all ("saturated") when it is off. Then session
// affinity, the policy's scorers, its picker and the fallbacks' order,
// and last the commit. The decision's Candidates are appended to dst[:0],
// so a caller that reuses dst does not allocate.
func (b *Balancer) Pick(req *Request, dst []*Backend) (Decision, error) {
	return b.pick(req, dst, false, nil)
}

// PickWait is Pick that waits in the admission queue, in priority order,
// while every backend is saturated, for at most the admission timeout or
// until ctx ends. A sheddable request (negative priority) is refused at
// once with [ErrShed]; a full queue gives [ErrQueueFull]; the timeout
// [ErrQueueTimeout].
func (b *Balancer) PickWait(ctx context.Context, req *Request, dst []*Backend) (Decision, error) {
	dec, err := b.Pick(req, dst)
	if !errors.Is(err, ErrSaturated) {
		return dec, err
	}
	t, err := b.Enqueue(req)
	if err != nil {
		return dec, err
	}
	timer := time.NewTimer(b.cfg.Admission.Timeout)
	defer timer.Stop()
	for {
		select {
		case <-t.w.ch:
		case <-ctx.Done():
			t.Leave("cancelled")
			return dec, ctx.Err()
		case <-timer.C:
			t.Leave("timeout")
			return dec, ErrQueueTimeout
		}
		dec, err = t.Pick(dst)
		if !errors.Is(err, ErrSaturated) {
			return dec, err
		}
	}
}

// Ticket is a request's place in the admission queue. [Balancer.PickWait]
// waits on one in real time; a driver with its own clock (the routing
// benchmark's virtual time) calls [Ticket.Pick] as capacity may free and
// [Ticket.Leave] when its timeout passes. A Ticket is used by one
// goroutine.
type Ticket struct {
	b     *Balancer
	w     *waiter
	req   *Request
	since time.Time
	done  bool
}

// Enqueue puts req, which [Balancer.Pick] found saturated, in the admission
// queue. A sheddable request is refused with [ErrShed], and a full queue
// with [ErrQueueFull].
func (b *Balancer) Enqueue(req *Request) (*Ticket, error) {
	if req.Priority < 0 {
		b.adm.refuse("shed")
		return nil, ErrShed
	}
	w, err := b.adm.enter(req.Priority)
	if err != nil {
		return nil, err
	}
	return &Ticket{b: b, w: w, req: req, since: b.now()}, nil
}

// Pick picks for the ticket's request if it is first in line and a
// backend has room; it returns [ErrSaturated] otherwise, and the ticket
// keeps its place. Any other outcome leaves the queue, with the decision's
// Waited set.
func (t *Ticket) Pick(dst []*Backend) (Decision, error) {
	if t.done || !t.b.adm.isHead(t.w) {
		return Decision{}, ErrSaturated
	}
	dec, err := t.b.Pick(t.req, dst)
	if errors.Is(err, ErrSaturated) {
		return dec, err
	}
	t.done = true
	t.b.adm.leave(t.w)
	dec.Waited = t.b.now().Sub(t.since)
	t.b.adm.observeWait(dec.Waited)
	return dec, err
}

// Leave gives up the ticket's place; reason ("timeout", "cancelled") is
// counted among [Balancer.Refusals].
func (t *Ticket) Leave(reason string) {
	if t.done {
		return
	}
	t.done = true
	t.b.adm.leave(t.w)
	t.b.adm.refuse(reason)
}

// pick runs the stages of one pick; dry (for [Balancer.Explain]) changes
// no state, and ex, when set, collects every backend's breakdown.
//
// The prompt is hashed and matched against the prefix index before any
// lock. A pick that attaches a guard then holds pickMu only while it reads
// the ledgers, chooses and attaches: otherwise a burst of picks all read
// the same idle ledger before any attaches and pile onto one backend. The
// commit (index insert, sessions, learning pickers) follows unlocked.
func (b *Balancer) pick(req *Request, dst []*Backend, dry bool, ex *Explanation) (Decision, error) {
	s := b.pool.Get().(*scratch)
	defer b.pool.Put(s)
	p := &s.p
	*p = Pick{Req: req, Dry: dry, snap: b.snap.Load()}
	b.hashPrompt(s, p)

	dec, primary, err := b.chooseAndAttach(s, p, dst, ex)
	if err != nil || dry {
		return dec, err
	}
	b.commit(p, primary)
	return dec, nil
}

// chooseAndAttach is choose, and for a pick with a guard, the attach,
// both under pickMu.
func (b *Balancer) chooseAndAttach(s *scratch, p *Pick, dst []*Backend, ex *Explanation) (Decision, int, error) {
	g := p.Req.Guard
	if g == nil || p.Dry {
		return b.choose(s, p, dst, ex)
	}
	b.pickMu.Lock()
	defer b.pickMu.Unlock()
	dec, primary, err := b.choose(s, p, dst, ex)
	if err == nil {
		g.Attach(p.Cands[primary].Backend, dec.Work[0], b.now())
	}
	return dec, primary, err
}

// choose is the part of a pick that reads the ledgers: filter, prefix
// match, saturation, affinity, score and order. It returns the decision
// and the primary's index in p.Cands.
func (b *Balancer) choose(s *scratch, p *Pick, dst []*Backend, ex *Explanation) (Decision, int, error) {
	tier, reason, err := b.filter(s, p, ex)
	if err != nil {
		return Decision{}, 0, err
	}
	b.applyMatch(s, p)
	why, err := b.saturation(p, tier, ex)
	if err != nil {
		return Decision{}, 0, err
	}
	reason = cmp.Or(why, reason)
	primary, why := b.affinity(p)
	reason = cmp.Or(why, reason)
	total := b.score(s, p)
	if primary < 0 {
		primary, why = b.pol.picker.Choose(p, total)
		reason = cmp.Or(reason, why)
	}
	dec := b.order(p, primary, total, dst)
	dec.Reason = reason
	if ex != nil {
		for i := range p.Cands {
			ex.add(&p.Cands[i], total[i], "")
		}
		ex.Reason = reason
		for _, be := range dec.Candidates {
			ex.Chosen = append(ex.Chosen, be.ID)
		}
	}
	return dec, primary, nil
}

// filter is the first stage: the backends that may take the request, in
// snapshot order, as p.Cands, and the tier they came from (fresh, stale or
// unknown) with the reason that tier gives.
func (b *Balancer) filter(s *scratch, p *Pick, ex *Explanation) (tier, reason string, err error) {
	req, snap, now := p.Req, p.snap, b.now()
	cands := s.cands[:0]
	s.stale = s.stale[:0]
	known, unknownModels := false, false
	unknownIdx := s.unknown[:0]
	defer func() { s.unknown = unknownIdx[:0] }()
	for i, be := range snap.Backends {
		// A backend whose models are not known may serve the model, even
		// when it is down (its servers may be all the model has, and a
		// 404 would tell clients to give up); one draining is on its way
		// out.
		if !be.ModelsKnown() && be.State != StateDraining {
			unknownModels = true
		}
		if !be.Serves(req.Model) {
			ex.skip(be, "does not serve the model")
			continue
		}
		known = true
		if skipEjected(be, ex) {
			continue
		}
		switch {
		case be.State == StateReady && !be.Stale:
			cands = b.appendCandidate(cands, be, req, now)
		case be.State == StateReady:
			s.stale = append(s.stale, i)
		case be.State == StateUnknown:
			unknownIdx = append(unknownIdx, i)
		default:
			ex.skip(be, be.State.String())
		}
	}
	tier = "fresh"
	if len(cands) == 0 && len(s.stale) > 0 {
		for _, i := range s.stale {
			cands = b.appendCandidate(cands, snap.Backends[i], req, now)
			cands[len(cands)-1].Saturated = false // stale values do not say it is full
		}
		reason, tier = "stale-metrics", "stale"
	} else {
		for _, i := range s.stale {
			ex.skip(snap.Backends[i], "stale metrics")
		}
	}
	if len(cands) == 0 {
		for _, i := range unknownIdx {
			cands = b.appendCandidate(cands, snap.Backends[i], req, now)
		}
		reason, tier = "fallback", "unknown"
	} else {
		for _, i := range unknownIdx {
			ex.skip(snap.Backends[i], "not probed yet")
		}
	}
	s.cands = cands
	p.Cands = cands
	if ex != nil {
		ex.Tier = tier
	}
	if len(cands) == 0 {
		// 404 only when no backend has ever offered the model and none
		// may: with no backends at all (DNS not answered yet) nothing is
		// known.
		if !known && !unknownModels && len(snap.Backends) > 0 && !snap.Offered(req.Model) {
			return tier, "", errModel(req.Model, ErrUnknownModel)
		}
		return tier, "", errModel(req.Model, ErrNoBackend)
	}
	return tier, reason, nil
}

// saturation keeps the candidates with room, and the saturated ones that
// hold part of the prompt when KeepHolders is on, unless a holder's queue
// is past HolderQueue times the shortest; if none is left, it queues
// (ErrSaturated) or, with the queue off or in a dry run, keeps them all
// ("saturated"). A preset whose peer has no saturation filter keeps every
// candidate.
//
// The bound is relative so that a fleet saturated as a whole keeps its
// prompts where they are, and a holder whose queue runs far ahead of the
// others' does not: kept with no bound, the holder was often the only
// candidate left, and took every request on its prompts while the others
// were full too (4 servers, burst at x4, seed 2: 299 of one 300-request
// burst went to the A100 holding its prefix, whose queue reached 313
// while the H100s' stayed near 16; TTFT p90 16.25 s, 5.05 s with the
// bound; the median of 24 seeds 4.45 -> 3.91 s).
func (b *Balancer) saturation(p *Pick, tier string, ex *Explanation) (string, error) {
	if !b.pol.admission {
		return "", nil
	}
	cands := p.Cands
	if sat := &b.cfg.Saturation; sat.KeepHolders {
		limit := math.Inf(1)
		if sat.HolderQueue > 0 && sat.Queue > 0 {
			shortest := math.Inf(1)
			for i := range cands {
				shortest = min(shortest, cands[i].Queued)
			}
			limit = sat.HolderQueue * max(shortest, float64(sat.Queue))
		}
		for i := range cands {
			if c := &cands[i]; c.Saturated && c.MatchedTokens > 0 && c.Queued <= limit {
				c.Saturated = false
			}
		}
	}
	free := 0
	for i := range cands {
		if !cands[i].Saturated {
			free++
		}
	}
	switch {
	case free == 0 && tier != "stale":
		if b.cfg.Admission.MaxQueue > 0 && !p.Dry {
			return "", ErrSaturated
		}
		return "saturated", nil
	case free < len(cands):
		for i := range cands {
			if cands[i].Saturated {
				ex.add(&cands[i], 0, "saturated")
			}
		}
		p.Cands = slices.DeleteFunc(cands, func(c Candidate) bool { return c.Saturated })
	}
	return "", nil
}

// affinity returns the candidate the request's session stays on, unless
// that backend is saturated or gone, or -1.
func (b *Balancer) affinity(p *Pick) (int, string) {
	if b.sessions == nil || p.Req.Session == "" {
		return -1, ""
	}
	id, ok := b.sessions.Get(p.Req.Session)
	if !ok {
		return -1, ""
	}
	for i := range p.Cands {
		if p.Cands[i].Backend.ID == id && !p.Cands[i].Saturated {
			return i, "affinity"
		}
	}
	return -1, ""
}

// score returns the policy's weighted total per candidate in [0,1]; for
// pickers that do not score, the fallback order: fewest in flight.
func (b *Balancer) score(s *scratch, p *Pick) []float64 {
	total := grow(s.total, len(p.Cands))
	clear(total)
	s.total = total
	if len(b.pol.scorers) == 0 {
		for i := range p.Cands {
			total[i] = -float64(p.Cands[i].InFlight)
		}
		return total
	}
	scores := grow(s.scores, len(p.Cands))
	s.scores = scores
	wsum := 0.0
	for _, ws := range b.pol.scorers {
		clear(scores)
		ws.s.Score(p, scores)
		for i, v := range scores {
			if math.IsNaN(v) {
				v = 0
			}
			total[i] += ws.w * min(max(v, 0), 1)
		}
		wsum += ws.w
	}
	for i := range total {
		total[i] /= wsum
	}
	return total
}

// order puts the primary first, then the best of the rest by total score
// as fallbacks, each with its estimated work.
func (b *Balancer) order(p *Pick, primary int, total []float64, dst []*Backend) Decision {
	var dec Decision
	cands := p.Cands
	out := append(dst[:0], cands[primary].Backend)
	dec.Work[0] = b.work(p.Req, &cands[primary])
	// Each fallback is the best below the one before it in (score, then
	// earlier index) order, so no candidate is taken twice.
	prev := -1
	for len(out) < b.cfg.MaxCandidates && len(out) < len(cands) {
		best := -1
		for i := range cands {
			if i == primary || prev >= 0 && !below(total, i, prev) {
				continue
			}
			if best < 0 || total[i] > total[best] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		dec.Work[len(out)] = b.work(p.Req, &cands[best])
		out = append(out, cands[best].Backend)
		prev = best
	}
	dec.Candidates = out
	return dec
}

// below reports whether candidate i comes after j in the fallback order:
// a lower total, or an equal one at a later index.
func below(total []float64, i, j int) bool {
	return total[i] < total[j] || total[i] == total[j] && i > j
}

// commit is the last stage of a pick that is not a dry run: learning
// scorers and pickers see the outcome, the index records that the primary
// now holds the prompt, and the session remembers its backend.
func (b *Balancer) commit(p *Pick, primary int) {
	be := p.Cands[primary].Backend
	for _, ws := range b.pol.scorers {
		if c, ok := ws.s.(committer); ok {
			c.Commit(p, primary)
		}
	}
	if b.pol.index != nil && len(p.hashes) > 0 {
		b.pol.index.Insert(be.slot, p.hashes)
	}
	if b.sessions != nil && p.Req.Session != "" {
		b.sessions.Add(p.Req.Session, be.ID)
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// appendCandidate appends be's Candidate to cands, filled in place: a
// Candidate is some 200 bytes, and returned by value it was copied twice
// per backend per pick.
func (b *Balancer) appendCandidate(cands []Candidate, be *Backend, req *Request, now time.Time) []Candidate {
	cands = append(cands, Candidate{})
	b.fill(&cands[len(cands)-1], be, req, now)
	return cands
}

// fill reads be's scraped values and ledger into c, which is zero.
func (b *Balancer) fill(c *Candidate, be *Backend, req *Request, now time.Time) {
	l, m, mk := be.Ledger, &be.Metrics, be.mark
	inFlight := l.InFlight()
	pending, pendingTok := l.Pending()
	c.Backend, c.InFlight, c.PendingTokens = be, inFlight, pendingTok
	scraped := !m.At.IsZero()
	sinceStarted := float64(l.started.Load() - mk.started)
	sincePrefilled := float64(l.prefilled.Load() - mk.prefilled)
	sinceFinished := float64(l.finished.Load() - mk.finished)
	if scraped && m.Queued.Known {
		c.Queued = max(0, m.Queued.V+sinceStarted-sincePrefilled)
	} else {
		c.Queued = float64(pending)
	}
	if scraped && m.Running.Known {
		c.Running = max(0, m.Running.V+sincePrefilled-sinceFinished)
	} else {
		c.Running = float64(inFlight - pending)
	}
	if scraped && m.KVUsage.Known {
		kv := m.KVUsage.V
		if capTok := m.BlockSize.V * m.NumBlocks.V; m.BlockSize.Known && m.NumBlocks.Known && capTok > 0 {
			kv += float64(l.openTokens.Load()-mk.openTokens) / capTok
		}
		c.KVUsage = Known(min(max(kv, 0), 1))
	}
	c.LoRA, c.adapter, c.slotWait = loraState(be, req.Model)
	// Only a queue the server reports saturates it: our own pending
	// requests alone may all be prefilling on a server with room.
	sat := b.cfg.Saturation
	c.Saturated = (sat.Queue > 0 && scraped && m.Queued.Known && c.Queued >= float64(sat.Queue)) ||
		(sat.KV > 0 && c.KVUsage.Known && c.KVUsage.V >= sat.KV)
	c.UncachedTokens = req.PromptTokens
	ahead := l.aheadTokens(pending, pendingTok, now)
	if b.pol.events != nil {
		ahead += b.othersPrefilling(be, pending, now)
	}
	c.AheadTokens = ahead + max(0, c.Queued-float64(pending))*l.queuedSize(pending, pendingTok, req.PromptTokens)
}

// loraState says how ready be is to run model if model is one of its
// adapters, and whether a request for it may wait for an adapter slot
// there: no slot free, requests waiting for one, or running only by our
// own requests none of which has started.
func loraState(be *Backend, model string) (state LoRAState, adapter string, slotWait bool) {
	isAdapter := false
	for _, a := range be.Adapters {
		if a.Name == model {
			isAdapter = true
			break
		}
	}
	if !isAdapter {
		return LoRANone, "", false
	}
	ours := be.Ledger.adapterLoad(model)
	info := be.Metrics.LoRA
	switch {
	case ours.started > 0, info != nil && slices.Contains(info.Running, model):
		return LoRARunning, model, false
	case ours.sent > 0:
		return LoRARunning, model, info != nil
	case info == nil:
		return LoRAUnknown, model, false
	case slices.Contains(info.Waiting, model):
		return LoRAWaiting, model, true
	}
	used := len(info.Running)
	for _, a := range be.Ledger.adaptersInFlight(nil) {
		if !slices.Contains(info.Running, a) {
			used++
		}
	}
	if info.Max <= 0 || used < info.Max {
		return LoRAFree, model, false
	}
	return LoRAFull, model, true
}

// hashPrompt is the stage before any lock: it hashes the prompt into
// blocks, sets the pick's key, and asks the prefix index how many leading
// blocks each backend slot holds (s.bySlot).
func (b *Balancer) hashPrompt(s *scratch, p *Pick) {
	req := p.Req
	s.matched = false
	if !req.hasPrompt() {
		return
	}
	if idx := b.pol.index; idx != nil {
		bb, most, partial := idx.HashShape()
		if req.Parts != nil {
			s.hashes = req.Parts.AppendHashes(s.hashes[:0], req.Seed, bb, most, partial)
		} else {
			s.hashes = idx.AppendHashes(s.hashes[:0], req.Seed, req.Prompt)
		}
		p.hashes = s.hashes
		p.PromptBlocks = len(s.hashes)
		if req.FirstTurn > 0 && len(s.hashes) > 0 {
			p.Conversation, s.tail = conversation(req, s.hashes, bb, s.tail[:0])
		}
		if len(s.hashes) > 0 {
			p.Key = s.hashes[0]
			by := grow(s.bySlot, p.snap.slots)
			clear(by)
			s.bySlot = by
			s.matched = idx.Match(s.hashes, by) > 0
		}
	}
	if p.Key == 0 {
		if req.Parts != nil { // keyOf's hash: the first 256 bytes, or all of a shorter prompt
			s.hashes = req.Parts.AppendHashes(s.hashes[:0], req.Seed, 256, 1, true)
			p.Key, s.hashes = s.hashes[0], s.hashes[:0]
		} else {
			p.Key = keyOf(req.Seed, req.Prompt)
		}
	}
}

// conversation returns [Pick.Conversation] for a chat whose prompt hashed
// to hashes in blocks of bb bytes, reading the bytes after the last whole
// block into buf, which it returns for reuse.
func conversation(req *Request, hashes []uint64, bb int, buf []byte) (uint64, []byte) {
	j := req.FirstTurn/bb - 1 // the last whole block of the first turn
	switch {
	case req.FirstUser < bb:
		return hashes[0], buf // the first block is the conversation's own
	case j >= len(hashes):
		return hashes[len(hashes)-1], buf
	}
	from, to := (j+1)*bb, min(req.FirstTurn, (j+1)*bb+maxTail)
	if req.Parts != nil {
		buf = req.Parts.AppendRange(buf, from, to)
	} else if to <= len(req.Prompt) {
		buf = append(buf, req.Prompt[from:to]...)
	}
	var d xxhash.Digest
	d.ResetWithSeed(hashes[j])
	_, _ = d.Write(buf)
	return d.Sum64(), buf
}

// maxTail bounds the bytes after a conversation's last whole block that
// its key reads: blocks are 256 bytes unless the engines' are larger.
const maxTail = 1024

// applyMatch fills in each candidate's share of the prompt from the index
// match (or, for the presets that know them, the engines' true caches).
func (b *Balancer) applyMatch(s *scratch, p *Pick) {
	req := p.Req
	if !req.hasPrompt() {
		return
	}
	blockTokens := 16
	if idx := b.pol.index; idx != nil {
		blockTokens = max(1, idx.BlockTokens())
	}
	if b.pol.oracle != nil {
		// The true cache is counted in tokens: a block is a token.
		p.PromptBlocks = req.PromptTokens
	}
	for i := range p.Cands {
		c := &p.Cands[i]
		if sl := c.Backend.slot; s.matched && sl < len(s.bySlot) {
			c.MatchedBlocks = int(s.bySlot[sl])
		}
		c.MatchedTokens = min(c.MatchedBlocks*blockTokens, req.PromptTokens)
		switch {
		case b.pol.oracle != nil:
			c.MatchedTokens = min(b.pol.oracle.CachedTokens(c.Backend, req), req.PromptTokens)
			c.MatchedBlocks = c.MatchedTokens
		case b.pol.events != nil:
			// The server's own events add what other balancers sent
			// there; what this one sent and the server has not yet
			// computed (queued), which no event has named yet, stays.
			if n, ok := b.pol.events.Held(c.Backend, req); ok && min(n, req.PromptTokens) > c.MatchedTokens {
				c.MatchedTokens = min(n, req.PromptTokens)
				c.MatchedBlocks = (c.MatchedTokens + blockTokens - 1) / blockTokens
			}
		}
		c.UncachedTokens = req.PromptTokens - c.MatchedTokens
	}
}

// stepSlack is how many times a step's prefill time a prefill seen in
// progress is believed to go on without a later step reported.
const stepSlack = 1.5

// othersPrefilling is the prefill work the backend's KV events show in
// progress that is not ours, which our ledger cannot see: it adds to our
// pending prompts ([Ledger.aheadTokens]) in what is ahead of a new
// request. Which sequences are ours the events do not say, so our pending
// requests, and those whose first byte came since a pick first read that
// step, are taken to be as many of them (all, with no other balancer) and
// the rest count by their share. A prefill seen in progress is taken to
// have as much left as it has done (its prompt's length is unknown here;
// for lengths with a Pareto tail of index 2 that is the expected
// remainder), less what the backend's rate has prefilled since the step
// the events reported, and to have ended if no later step has been
// reported by the time half as long again as that step's prefill should
// take (a server prefilling sends a batch of events every step).
func (b *Balancer) othersPrefilling(be *Backend, pending int64, now time.Time) float64 {
	l := be.Ledger
	p, ok := b.pol.events.Prefilling(be)
	if !ok || p.Done <= 0 {
		return 0
	}
	if at := p.At.UnixNano(); l.eventsAt.Load() != at {
		l.eventsPrefilled.Store(l.prefilled.Load())
		l.eventsAt.Store(at)
	}
	others := int64(p.Sequences) - pending - (l.prefilled.Load() - l.eventsPrefilled.Load())
	if others <= 0 {
		return 0
	}
	rate := b.cfg.TTFT.PrefillRate
	if est := l.est.load(); est.learned() {
		rate = est.Rate
	}
	since := now.Sub(p.At).Seconds()
	if since > stepSlack*float64(p.Step)/rate {
		return 0
	}
	return max(0, float64(p.Done)-rate*since) * float64(others) / float64(p.Sequences)
}

// work is what req costs candidate c.
func (b *Balancer) work(req *Request, c *Candidate) Work {
	decode := req.MaxTokens
	if decode <= 0 {
		decode = b.cfg.TTFT.DefaultMaxTokens
	}
	inv := 1 / b.cfg.TTFT.PrefillRate
	if est := c.Backend.Ledger.est.load(); est.learned() {
		inv = 1 / est.Rate
	}
	return Work{UncachedTokens: c.UncachedTokens, DecodeTokens: decode, Adapter: c.adapter, AheadTokens: c.AheadTokens, QueuedAhead: c.Queued, SlotWait: c.slotWait,
		PrefillSeconds: float64(c.UncachedTokens) * inv}
}

// keyOf hashes the start of a prompt too short for one block.
func keyOf(seed uint64, prompt []byte) uint64 {
	if len(prompt) > 256 {
		prompt = prompt[:256]
	}
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(prompt)
	return d.Sum64()
}
