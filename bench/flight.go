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
		UserText: req.AppendUserText(nil, 100)}
	f.breq.FirstUser, f.breq.FirstTurn = req.FirstTurn()
	if r.kv != nil && r.reps[rep].bal.ReadsCacheEvents() {
		// Tokenized first, as the proxy asks /tokenize, then picked.
		r.text = req.AppendText(r.text[:0])
		f.tokens = sim.Tokens(r.text)
		bs := r.servers[0].eng.Config().BlockSize
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

// dispatch picks a server for f through its replica's balancer, the
// product's own admission queue included, and sends it there. It reports
// whether f left the queue (sent, refused or failed).
func (r *run) dispatch(f *flight) bool {
	rep := r.reps[f.rep]
	r.text = f.req.AppendText(r.text[:0])
	r.hashBlock = 0
	f.breq.Prompt = r.text
	f.breq.Guard = rep.bal.NewGuard()
	var dec balancer.Decision
	var err error
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
	r.dst = dec.Candidates
	switch {
	case errors.Is(err, balancer.ErrQueueFull), errors.Is(err, balancer.ErrShed):
		r.res.Refused++
		r.ended()
		return true
	case err != nil:
		r.res.Failed++
		r.ended()
		return true
	}
	f.srv = r.byID[dec.Candidates[0].ID]
	s := r.servers[f.srv]
	if r.c.Trace {
		r.tracePick(f, &dec)
	}
	f.seq = &sim.Seq{
		Hashes:       slices.Clone(r.engineHashes(f.breq.Model, s.block)),
		PromptTokens: f.req.Tokens(),
		MaxTokens:    f.req.MaxTokens,
	}
	if f.req.Model != "" {
		f.seq.Adapter = f.req.Model
	}
	f.seq.Tokens = f.tokens // the engine records KV events of what it has tokens of
	f.guard = f.breq.Guard
	f.breq.Prompt = nil // r.text is reused by the next request
	// The server's own per-request work (parsing, tokenising, scheduling)
	// comes before its scheduler sees the request.
	if d := s.eng.Config().Cost.Intake(f.seq.PromptTokens); d > 0 {
		r.entering++
		r.push(event{at: r.now + d, kind: evEnter, f: f})
	} else {
		r.enter(f)
	}
	return true
}

// enter hands a picked request to its server's scheduler.
func (r *run) enter(f *flight) {
	s := r.servers[f.srv]
	if err := s.eng.Add(f.seq); err != nil {
		f.guard.Release()
		r.res.Failed++
		r.ended()
		return
	}
	r.flights[f.seq] = f
	s.served++
	if !s.busy {
		r.step(f.srv)
	}
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
			r.ended()
			continue
		}
		if !r.dispatch(f) {
			return
		}
		rp.waiting = rp.waiting[1:]
		r.queued--
	}
}

// ended is called as each request leaves the cluster; in a closed-loop run
// its client sends the next request now.
func (r *run) ended() {
	if r.c.Clients > 0 && r.next < len(r.w.Requests) {
		r.push(event{at: r.now, kind: evArrival, i: r.next})
		r.next++
	}
}
