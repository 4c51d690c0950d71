package bench

import (
	"errors"
	"slices"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/sim"
)

// flight is one request on its way through the cluster.
type flight struct {
	req     *Request
	idx     int
	rep     int
	breq    balancer.Request
	guard   *balancer.Guard
	ticket  *balancer.Ticket // its place in the replica's admission queue
	seq     *sim.Seq
	srv     int
	arrived time.Duration
	tokens  []uint32     // the prompt's token ids, when its replica reads KV events
	trace   *TraceRecord // when the run is traced: the pick's record, until the first token
	holder  int          // a stored follow-up's: the server storing its previous response
	pd      *pdLeg       // a disaggregated request's prefill leg; nil for one leg
	// estimate is the first token's time the pick estimated (seconds, 0
	// for a policy that estimates none), from pickedAt.
	estimate float64
	pickedAt time.Duration
}

func (r *run) arrive(i int) {
	rep := 0
	if len(r.reps) > 1 {
		rep = r.rng.IntN(len(r.reps))
	}
	req := &r.w.Requests[i]
	model := req.Model
	if model == "" {
		model = Model
	}
	f := &flight{req: req, idx: i, rep: rep, arrived: r.now}
	f.breq = balancer.Request{Model: model, Seed: prefix.Seed(model, ""), PromptTokens: r.c.Perturb.tokens(req.Tokens()), MaxTokens: req.MaxTokens,
		UserText: req.AppendUserText(nil, r.reps[rep].bal.Config().ConsistentHash.PrefixBytes)}
	f.breq.FirstUser, f.breq.FirstTurn = req.FirstTurn()
	f.breq.Session = req.Affinity
	if id, ok := r.pinned[req.Backend]; ok {
		f.breq.Holder = id // the balancer's admission and ledger, on that server alone
	}
	if !r.c.HideTargets {
		// As the proxy reads X-Llmlb-Priority and x-slo-ttft-ms.
		f.breq.Priority = req.Priority
		if req.SLO.TTFT > 0 {
			f.breq.TTFTDeadline, f.breq.Arrived = req.SLO.TTFT, r.clock()
		}
	}
	if req.SLO.set() {
		r.res.Targeted++
	}
	if req.Stored > 0 {
		r.res.FollowUps++
		r.storedFollowUp(f)
	}
	if r.kv != nil && r.reps[rep].bal.ReadsCacheEvents() {
		r.text = req.AppendText(r.text[:0])
		f.tokens = sim.Tokens(r.text) // the engine's own, for its KV events
		if f.breq.Holder != "" {
			r.dispatch(f) // the proxy tokenizes no pinned request
			return
		}
		// Tokenized first, as the proxy asks /tokenize, then picked.
		bs := r.servers[0].blockTokens
		f.breq.TokenBlocks, f.breq.TokenBlockSize = kvevents.Blocks(nil, f.tokens, bs, req.Model), bs
		base, per := r.c.TokenizeBase, r.c.TokenizePerByte
		if base == 0 && per == 0 {
			base, per = 2*time.Millisecond, 80*time.Nanosecond
		}
		r.entering++
		r.push(event{at: r.now + base + time.Duration(len(r.text))*per, kind: evTokenized, f: f})
		return
	}
	r.dispatch(f)
}

// storedFollowUp sets up the pick of f, a stored follow-up, as its
// balancer sees it: the body holds only the new input, with no user
// message, and names the previous response. llmlb's proxy pins it to the
// server storing that response, with no prompt to match; a peer routes
// it on the new input ([balancer.Preset.FollowsStored]).
func (r *run) storedFollowUp(f *flight) {
	f.holder = r.answeredBy[r.before[f.idx]]
	f.breq.PromptTokens = r.c.Perturb.tokens(f.req.NewTokens())
	f.breq.UserText, f.breq.FirstUser, f.breq.FirstTurn = nil, 0, 0
	if r.followsStored {
		f.breq.Holder = r.servers[f.holder].id
	}
}

// dispatch picks a server for f through its replica's balancer, the
// product's own admission queue included, and sends it there. It reports
// whether f left the queue (sent, refused or failed).
func (r *run) dispatch(f *flight) bool {
	rep := r.reps[f.rep]
	r.text = f.req.AppendText(r.text[:0])
	r.hashBlock = 0
	f.breq.Prompt = r.text
	switch {
	case f.breq.Holder != "":
		f.breq.Prompt = nil // the proxy matches a pinned request nowhere
	case f.req.Stored > 0:
		r.newText = f.req.AppendNewText(r.newText[:0])
		f.breq.Prompt = r.newText
	}
	f.breq.Guard = rep.bal.NewGuard()
	var dec balancer.Decision
	var err error
	r.newOnly = f.req.Stored > 0 && f.breq.Holder == ""
	if f.ticket == nil {
		dec, err = rep.bal.Pick(&f.breq, r.dst[:0])
		if errors.Is(err, balancer.ErrSaturated) {
			f.ticket, err = rep.bal.Enqueue(&f.breq)
			if err == nil {
				rep.waiting = append(rep.waiting, f)
				r.queued++
				return false
			}
		}
	} else {
		dec, err = f.ticket.Pick(r.dst[:0])
		if errors.Is(err, balancer.ErrSaturated) {
			return false
		}
	}
	r.newOnly = false
	r.dst = dec.Candidates
	switch {
	case errors.Is(err, balancer.ErrQueueFull), errors.Is(err, balancer.ErrShed), errors.Is(err, balancer.ErrDeadline):
		r.res.Refused++
		r.ended(f.idx, false)
		return true
	case err != nil:
		r.res.Failed++
		r.ended(f.idx, false)
		return true
	}
	f.srv = r.byID[dec.Candidates[0].ID]
	f.estimate, f.pickedAt = dec.TTFT, r.now
	if f.req.Stored > 0 && f.srv != f.holder {
		// The server does not store the response the request names: a
		// 404 at once, and the agent stops.
		f.breq.Guard.Release()
		f.breq.Prompt = nil
		r.res.FailedFollowUps++
		r.ended(f.idx, false)
		return true
	}
	s := r.servers[f.srv]
	if r.c.Trace {
		r.tracePick(f, &dec)
	}
	f.seq = &sim.Seq{
		Hashes:       slices.Clone(r.engineHashes(f.breq.Model, s.block)),
		PromptTokens: r.c.Perturb.engineTokens(f.req.Tokens()),
		MaxTokens:    f.req.MaxTokens,
	}
	if f.req.Model != "" {
		f.seq.Adapter = f.req.Model
	}
	f.seq.Tokens = f.tokens // the engine records KV events of what it has tokens of
	f.guard = f.breq.Guard
	if f.pd, err = r.prefillLeg(f, &dec); err != nil {
		// It must split but cannot: the proxy fails it.
		f.guard.Release()
		f.breq.Prompt = nil
		r.res.Failed++
		r.ended(f.idx, false)
		return true
	}
	if f.pd != nil {
		f.breq.Prompt = nil
		r.intake(f, f.pd.srv, f.pd.seq)
		return true
	}
	f.breq.Prompt = nil // r.text is reused by the next request
	r.intake(f, f.srv, f.seq)
	return true
}

// intake sends seq, f's leg, to server srv: the server's own per-request
// work (parsing, tokenising, scheduling) comes before its scheduler sees
// the request.
func (r *run) intake(f *flight, srv int, seq *sim.Seq) {
	if d := r.servers[srv].intake.Intake(seq.PromptTokens); d > 0 {
		r.entering++
		r.push(event{at: r.now + d, kind: evEnter, f: f})
	} else {
		r.enter(f)
	}
}

// enter hands f's leg in progress to its server's scheduler: the prefill
// leg of a disaggregated request while it runs, else the request itself,
// whose decode server first takes in the KV cache a prefill leg sent.
func (r *run) enter(f *flight) {
	srv, seq, guard := f.srv, f.seq, f.guard
	if f.pd != nil && f.pd.active {
		srv, seq, guard = f.pd.srv, f.pd.seq, f.pd.guard
	}
	s := r.servers[srv]
	if f.pd != nil && !f.pd.active {
		s.eng.Receive(seq.Hashes)
	}
	if err := s.eng.Add(seq); err != nil {
		guard.Release()
		if guard != f.guard {
			f.guard.Release()
		}
		r.res.Failed++
		r.ended(f.idx, false)
		return
	}
	r.flights[seq] = f
	s.served++
	if !s.busy || s.eager {
		r.step(srv)
	}
}

// refused ends f, whose leg seq its server refused when it came to run it
// (its KV blocks did not fit), as enter ends a request refused on
// arrival.
func (r *run) refused(f *flight, seq *sim.Seq) {
	delete(r.flights, seq)
	if f.pd != nil && seq == f.pd.seq {
		f.pd.guard.Release()
	}
	f.guard.Release()
	r.res.Failed++
	r.ended(f.idx, false)
}

// admit moves replica rep's admission queue onto servers while they have
// room; heads that waited past the admission timeout leave, refused.
func (r *run) admit(rep int) {
	rp := r.reps[rep]
	timeout := rp.bal.Config().Admission.Timeout
	for len(rp.waiting) > 0 {
		f := rp.waiting[0]
		if r.now-f.arrived > timeout {
			f.ticket.Leave("timeout")
			r.res.Refused++
			rp.waiting = rp.waiting[1:]
			r.queued--
			r.ended(f.idx, false)
			continue
		}
		if !r.dispatch(f) {
			return
		}
		rp.waiting = rp.waiting[1:]
		r.queued--
	}
}

// ended is called as request i leaves the cluster, answered (ok) or not.
// After an answer, its session's next turn is sent after its think time;
// a session whose turn was not answered ends there, as an agent harness
// stops at an error. In a closed-loop run, a client whose session (or
// lone request) is over sends the next request now.
func (r *run) ended(i int, ok bool) {
	if j := r.after[i]; j >= 0 {
		if ok {
			r.push(event{at: r.now + r.w.Requests[j].Think, kind: evArrival, i: j})
			return
		}
		r.drop(i)
	}
	if r.c.Clients > 0 {
		r.sendNext()
	}
}

// drop counts the later turns of request i's session, which will not be
// sent.
func (r *run) drop(i int) {
	for j := r.after[i]; j >= 0; j = r.after[j] {
		r.res.Unsent++
		r.pending--
	}
}

// sendNext sends the next request of a closed-loop run that is not a
// later turn of a session (those follow their sessions' answers), and
// reports whether there was one.
func (r *run) sendNext() bool {
	for r.next < len(r.w.Requests) && r.w.Requests[r.next].Turn > 0 {
		r.next++
	}
	if r.next >= len(r.w.Requests) {
		return false
	}
	r.push(event{at: r.now, kind: evArrival, i: r.next})
	r.next++
	return true
}
