package balancer

import (
	"fmt"
	"math"
	"slices"
	"time"
)

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
	// SlotsFull: the requests running and queued there are as many as
	// the backend runs at once ([Ledger.Slots]), so this one would wait
	// for one of them to finish.
	SlotsFull bool `json:"slots_full"`
	// The ttft policy's estimate in seconds and its parts, written by
	// [TTFTScorer] and read by [TTFTPicker]; zero under other policies.
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
	// First is the learned first-token estimate ([Candidate.FirstToken]),
	// 0 when not set.
	First float64 `json:"first_token_seconds"`

	adapter  string // the request's adapter on this backend, or ""
	slotWait bool   // the adapter may wait for a slot here (Work.SlotWait)
}

// FirstToken is the estimate of the time to the request's first token
// on the candidate, in seconds, which deadlines are judged by: First, the
// backend's learned model's ([FirstTokenModel]), when the scorer set it,
// else the cost's prefill, queue wait and adapter load. The cost's TTFT
// adds two terms that are not times to the first token, the decode the
// request loses to a busier batch and the penalty of a full KV cache.
func (c *Candidate) FirstToken() float64 {
	if c.First > 0 {
		return c.First
	}
	return c.Prefill + c.QueueWait + c.LoRAPenalty
}

// filter is the first stage: the backends that may take the request, in
// snapshot order, as p.Cands, and the tier they came from (fresh, stale or
// unknown) with the reason that tier gives.
func (b *Balancer) filter(s *scratch, p *PickInfo, ex *Explanation) (tier string, reason Reason, err error) {
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
		if !be.Role.takes(req.Role) {
			ex.skip(be, "role "+be.Role.String())
			continue
		}
		if req.Avoid != "" && be.ID == req.Avoid {
			ex.skip(be, "broke the request's stream")
			continue
		}
		if req.Holder != "" && be.ID != req.Holder {
			ex.skip(be, "does not store the response the request continues")
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
		reason, tier = ReasonStaleMetrics, "stale"
	} else {
		for _, i := range s.stale {
			ex.skip(snap.Backends[i], "stale metrics")
		}
	}
	if len(cands) == 0 {
		for _, i := range unknownIdx {
			cands = b.appendCandidate(cands, snap.Backends[i], req, now)
		}
		reason, tier = ReasonFallback, "unknown"
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
// ([ReasonSaturated]). A preset whose peer has no saturation filter keeps
// every candidate.
//
// The bound is relative so that a fleet saturated as a whole keeps its
// prompts where they are, and a holder whose queue runs far ahead of the
// others' does not: kept with no bound, a holder is often the only
// candidate left, and takes every request on its prompts while the others
// are full too. See docs/design/ttft.md#holder-bound.
func (b *Balancer) saturation(p *PickInfo, tier string, ex *Explanation) (Reason, error) {
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
		return ReasonSaturated, nil
	case free < len(cands):
		for i := range cands {
			if cands[i].Saturated {
				ex.add(&cands[i], 0, "saturated")
			}
		}
		p.Cands = slices.DeleteFunc(cands, func(c Candidate) bool { return c.Saturated })
	}
	b.full(p, ex)
	return "", nil
}

// full drops the candidates that are full while another is not, holders
// of the prompt too:
//
//   - Its slots are all taken ([Candidate.SlotsFull]): a request there
//     waits for a whole request to finish, and the requests on its prompt
//     that follow it wait longer still, where a copy's prefill on a server
//     with a free slot is paid once and its prompt's next requests start at
//     once. See docs/design/ttft.md#slots.
//   - It has more requests in flight, running and queued, than LoadFactor
//     times the candidates' mean plus LoadSlack: consistent hashing with
//     bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018) for the
//     prefix index's placements, so that a prompt's holder does not take a
//     burst of it alone while its slots are not known. See
//     docs/design/ttft.md#load-bound.
func (b *Balancer) full(p *PickInfo, ex *Explanation) {
	sat := &b.cfg.Saturation
	slots := !b.cfg.TTFT.Off.has(ruleSlots)
	bound := math.Inf(1)
	if sat.LoadFactor > 0 && len(p.Cands) > 1 {
		mean := 0.0
		for i := range p.Cands {
			mean += p.Cands[i].Running + p.Cands[i].Queued
		}
		bound = sat.LoadFactor*mean/float64(len(p.Cands)) + sat.LoadSlack
	}
	// why is the reason c is full, or "".
	why := func(c *Candidate) string {
		switch {
		case c.SlotsFull && slots:
			return "slots full"
		case c.Running+c.Queued > bound:
			return "load bound"
		}
		return ""
	}
	n := 0
	for i := range p.Cands {
		if why(&p.Cands[i]) != "" {
			n++
		}
	}
	if n == 0 || n == len(p.Cands) {
		return
	}
	for i := range p.Cands {
		if r := why(&p.Cands[i]); r != "" {
			ex.add(&p.Cands[i], 0, r)
		}
	}
	p.Cands = slices.DeleteFunc(p.Cands, func(c Candidate) bool { return why(&c) != "" })
}

// appendCandidate appends be's Candidate to cands, filled in place: a
// Candidate is some 200 bytes, and returned by value it was copied twice
// per backend per pick.
func (b *Balancer) appendCandidate(cands []Candidate, be *Backend, req *Request, now time.Time) []Candidate {
	cands = append(cands, Candidate{})
	b.fill(&cands[len(cands)-1], be, req, now)
	return cands
}

// fill reads be's scraped values and ledger into c, which is zero. The
// work of the replicas sharing the ledger counts as running and in the
// KV cache ([Ledger.SetPeers]).
func (b *Balancer) fill(c *Candidate, be *Backend, req *Request, now time.Time) {
	l, m, mk := be.Ledger, &be.Metrics, be.mark
	peers := l.Peers()
	inFlight := l.InFlight()
	pending, pendingTok := l.Pending()
	c.Backend, c.InFlight, c.PendingTokens = be, inFlight+peers.InFlight, pendingTok
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
		c.Running = max(0, m.Running.V+sincePrefilled-sinceFinished+float64(peers.InFlight-mk.peers.InFlight))
	} else {
		c.Running = float64(inFlight - pending + peers.InFlight)
	}
	if scraped && m.KVUsage.Known {
		kv := m.KVUsage.V
		if capTok := m.BlockSize.V * m.NumBlocks.V; m.BlockSize.Known && m.NumBlocks.Known && capTok > 0 {
			kv += float64(l.openTokens.Load()-mk.openTokens+peers.OpenTokens-mk.peers.OpenTokens) / capTok
		}
		c.KVUsage = Known(min(max(kv, 0), 1))
	}
	c.LoRA, c.adapter, c.slotWait = loraState(be, req.Model)
	// Only a queue the server reports saturates it: our own pending
	// requests alone may all be prefilling on a server with room.
	sat := b.cfg.Saturation
	c.Saturated = (sat.Queue > 0 && scraped && m.Queued.Known && c.Queued >= float64(sat.Queue)) ||
		(sat.KV > 0 && c.KVUsage.Known && c.KVUsage.V >= sat.KV)
	if n := l.Slots(); n > 0 && c.Running+c.Queued >= float64(n) {
		c.SlotsFull = true
	}
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
