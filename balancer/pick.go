package balancer

import (
	"cmp"
	"math"
	"time"
)

// CandidateLimit bounds the backends one pick returns, and so the
// attempts one request may make (proxy.max_attempts).
const CandidateLimit = 8

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
	// SessionHome is the backend ID the fleet's session table holds for
	// Session, looked up by the caller where replicas share sessions; it
	// goes before this balancer's own table, which only knows the
	// sessions it routed. "" for none.
	SessionHome string
	// Avoid, when set, is the ID of a backend the request must not go to:
	// the one whose stream of it broke, when the rest is asked elsewhere.
	Avoid string
	// Holder, when set, is the ID of the only backend the request may go
	// to: the one storing the response it continues. The pick's other
	// stages still apply (a saturated holder makes the request wait).
	Holder string
	// Role is the part of a disaggregated prefill/decode fleet the pick
	// is for: [RolePrefill] picks among the backends that prefill, any
	// other (the zero value) among those that decode, which answer
	// requests that take no prefill leg too. In a fleet of [RoleBoth]
	// backends it changes nothing.
	Role Role
	// NearHost, when set, is the host of the backend serving the
	// request's other leg (the decode server, for a prefill pick): a
	// candidate there that ties the picker's choice is preferred, since
	// KV cache moves faster within a host (NVLink, CUDA IPC) than across.
	NearHost string
	// Priority orders the admission queue; negative is sheddable.
	Priority int
	// TTFTDeadline, when above 0, is how long after Arrived the request's
	// first token should come: the pick prefers the backends whose
	// estimate meets it ([Balancer.deadline]), and the admission queue
	// serves a tenant's requests earliest deadline first.
	TTFTDeadline time.Duration
	// Arrived is when the request arrived, from which TTFTDeadline counts;
	// zero counts it from each pick.
	Arrived time.Time
	// Tenant identifies the client for fairness in the admission queue
	// ([AdmissionConfig.Fairness]): the API key's name, or the tenant
	// header's value when no keys are configured. "" is one anonymous
	// tenant, like any other name.
	Tenant string
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
func (r *Request) hasPrompt() bool { return r.promptBytes() > 0 }

// promptBytes is the length of the canonical prompt.
func (r *Request) promptBytes() int {
	if r.Parts != nil {
		return r.Parts.Len()
	}
	return len(r.Prompt)
}

// Decision is the outcome of [Balancer.Pick].
type Decision struct {
	// Candidates are the backends to try, best first. Never empty when Pick
	// returns a nil error.
	Candidates []*Backend
	// Work is each candidate's estimated cost, for [Guard.Attach].
	Work [CandidateLimit]Work
	// Reason says why the first candidate was chosen.
	Reason Reason
	// Waited is the time spent in the admission queue.
	Waited time.Duration
	// TTFT is the policy's estimate of the first candidate's time to
	// first token, in seconds ([Candidate.FirstToken]); 0 for a policy
	// that makes none.
	TTFT float64
	// Uncached is the prompt tokens the first candidate is believed not
	// to hold in its prefix cache: what a prefill leg would spare it.
	Uncached int
}

// PickInfo is one pick in progress, as scorers and pickers see it. Cands are
// the backends that passed the filters, in snapshot order.
type PickInfo struct {
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
	p       PickInfo
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
// best) into out, which is indexed like p.Cands. [TTFTScorer] also fills
// in the candidates' estimate fields, which only [TTFTPicker] reads.
type Scorer interface {
	Score(p *PickInfo, out []float64)
}

// Picker chooses the primary candidate given the weighted total scores,
// indexed like p.Cands, and says why.
type Picker interface {
	Choose(p *PickInfo, total []float64) (int, Reason)
}

// Pick chooses the backends for req from the current snapshot, in named
// stages (see pick): hash the prompt; filter: the backend must serve the
// model and be ready with fresh metrics; when none is, ready backends with
// stale metrics are used ([ReasonStaleMetrics]); when none is ready, those
// not probed yet ([ReasonFallback]); down and draining backends never.
// Then prefix match; saturation: among the fresh, saturated backends are
// dropped unless they hold part of the prompt and their queue is not far
// past the others' (SaturationConfig.KeepHolders, HolderQueue); if all are
// saturated, Pick returns [ErrSaturated] when the admission queue is on,
// and uses them all ([ReasonSaturated]) when it is off. Then session
// affinity, the policy's scorers, its picker and the fallbacks' order, and
// last the commit. The decision's Candidates are appended to dst[:0],
// so a caller that reuses dst does not allocate.
func (b *Balancer) Pick(req *Request, dst []*Backend) (Decision, error) {
	return b.pick(req, dst, false, nil)
}

// pick runs the stages of one pick; dry (for [Balancer.Explain]) changes
// no state, and ex, when set, collects every backend's breakdown.
//
// The prompt is hashed and matched against the prefix index before any
// lock. A pick that attaches a guard then holds pickMu only while it reads
// the ledgers, chooses and attaches: otherwise a burst of picks all read
// the same idle ledger before any attaches and pile onto one backend. The
// commit (index insert, sessions, learning scorers) follows unlocked.
func (b *Balancer) pick(req *Request, dst []*Backend, dry bool, ex *Explanation) (Decision, error) {
	s := b.pool.Get().(*scratch)
	defer b.pool.Put(s)
	p := &s.p
	*p = PickInfo{Req: req, Dry: dry, snap: b.snap.Load()}
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
func (b *Balancer) chooseAndAttach(s *scratch, p *PickInfo, dst []*Backend, ex *Explanation) (Decision, int, error) {
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
func (b *Balancer) choose(s *scratch, p *PickInfo, dst []*Backend, ex *Explanation) (Decision, int, error) {
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
	if p.Req.Holder != "" && len(p.Cands) > 0 {
		primary, reason = 0, ReasonStored // the filter left only the holder
	}
	total := b.score(s, p)
	if primary < 0 {
		var err error
		if total, primary, err = b.deadline(p, total, ex); err != nil {
			return Decision{}, 0, err
		}
		if primary >= 0 {
			reason = ReasonDeadline
		}
	}
	if primary < 0 {
		primary, why = b.pol.picker.Choose(p, total)
		reason = cmp.Or(reason, why)
		primary = b.near(p, primary, total)
	}
	dec := b.order(p, primary, total, dst)
	dec.Reason = reason
	dec.Uncached = p.Cands[primary].UncachedTokens
	if ex != nil {
		for i := range p.Cands {
			ex.add(&p.Cands[i], total[i], "")
		}
		ex.Reason = reason
		for _, be := range dec.Candidates {
			ex.Chosen = append(ex.Chosen, be.ID)
			ex.ChosenNames = append(ex.ChosenNames, be.Name)
		}
	}
	return dec, primary, nil
}

// near returns, for a pick with a NearHost whose primary is elsewhere, a
// candidate on that host whose total is within TTFT.TieTolerance of the
// primary's (the first such in snapshot order); primary otherwise. A
// tie is all locality may decide: it never takes a request to a slower
// backend than the picker's choice by more than the tolerance.
func (b *Balancer) near(p *PickInfo, primary int, total []float64) int {
	host := p.Req.NearHost
	if host == "" || p.Cands[primary].Backend.URL.Hostname() == host {
		return primary
	}
	floor := total[primary] / (1 + b.cfg.TTFT.TieTolerance)
	for i := range p.Cands {
		if p.Cands[i].Backend.URL.Hostname() == host && total[i] >= floor {
			return i
		}
	}
	return primary
}

// affinity returns the candidate the request's session stays on, unless
// that backend is saturated or gone, or -1: the fleet's home for the
// session where the caller found one, else this balancer's.
func (b *Balancer) affinity(p *PickInfo) (int, Reason) {
	if b.sessions == nil || p.Req.Session == "" {
		return -1, ""
	}
	id, ok := p.Req.SessionHome, p.Req.SessionHome != ""
	if !ok {
		id, ok = b.sessions.Get(p.Req.Session)
	}
	if !ok {
		return -1, ""
	}
	for i := range p.Cands {
		if p.Cands[i].Backend.ID == id && !p.Cands[i].Saturated {
			return i, ReasonAffinity
		}
	}
	return -1, ""
}

// score returns the policy's weighted total per candidate in [0,1]; for
// pickers that do not score, the fallback order: fewest in flight.
func (b *Balancer) score(s *scratch, p *PickInfo) []float64 {
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
func (b *Balancer) order(p *PickInfo, primary int, total []float64, dst []*Backend) Decision {
	var dec Decision
	cands := p.Cands
	out := append(dst[:0], cands[primary].Backend)
	dec.Work[0] = b.work(p, &cands[primary])
	dec.TTFT = cands[primary].FirstToken()
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
		dec.Work[len(out)] = b.work(p, &cands[best])
		out = append(out, cands[best].Backend)
		prev = best
	}
	dec.Candidates = out
	return dec
}

// work is what p's request costs candidate c.
func (b *Balancer) work(p *PickInfo, c *Candidate) Work {
	req := p.Req
	decode := req.MaxTokens
	if decode <= 0 {
		decode = b.cfg.TTFT.DefaultMaxTokens
	}
	inv := 1 / b.cfg.TTFT.PrefillRate
	if est := c.Backend.Ledger.est.load(); est.learned() {
		inv = 1 / est.Rate
	}
	w := Work{UncachedTokens: c.UncachedTokens, DecodeTokens: decode, Adapter: c.adapter, AheadTokens: c.AheadTokens, QueuedAhead: c.Queued, SlotWait: c.slotWait,
		Running: c.Running, LoadsAdapter: c.LoRA == LoRAFree || c.LoRA == LoRAUnknown,
		PrefillSeconds: float64(c.UncachedTokens) * inv, Estimate: c.FirstToken()}
	// A stored response's follow-up (Holder) teaches no rate: its server
	// counts the whole stored conversation, not the bytes seen here.
	if req.Holder == "" {
		w.PromptBytes = req.promptBytes()
	}
	if idx := b.pol.index; b.pol.learnTokens && len(p.hashes) > 0 {
		bb, _, _ := idx.HashShape()
		w.Matched, w.MatchedBytes = true, min(c.MatchedBlocks*bb, w.PromptBytes)
		w.NextEvicted = c.MatchedBlocks < len(p.hashes) && idx.Evicted(c.Backend.slot, p.hashes[c.MatchedBlocks])
	}
	return w
}

// below reports whether candidate i comes after j in the fallback order:
// a lower total, or an equal one at a later index.
func below(total []float64, i, j int) bool {
	return total[i] < total[j] || total[i] == total[j] && i > j
}

// commit is the last stage of a pick that is not a dry run: learning
// scorers ([committer]) see the outcome, the index records that the
// primary now holds the prompt, and the session remembers its backend.
// Pickers that learn do so in Choose, unless the pick is dry.
func (b *Balancer) commit(p *PickInfo, primary int) {
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

// grow returns s with length n, allocating only when its capacity is
// short, so pooled buffers are reused; the contents are not cleared.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// committer is a scorer that learns from the pick's outcome: the pick's
// commit calls Commit on each of the policy's scorers that has it once the
// primary is chosen, never for a dry run.
type committer interface {
	Commit(p *PickInfo, chosen int)
}
