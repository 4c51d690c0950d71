package bench

import (
	"slices"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/sim"
)

// pdLeg is the prefill leg of a disaggregated request, as llmlb's proxy
// runs it (proxy/pd.go): a prefill server computes the prompt and one
// token, its KV cache moves to the decode server ([sim.PDConfig.TransferTime]),
// and the decode server, holding the prompt's blocks, generates the answer.
type pdLeg struct {
	srv    int
	guard  *balancer.Guard
	seq    *sim.Seq
	active bool // the leg is running; false once its KV cache is on its way
	// work is the decode server's share as its pick estimated it.
	work balancer.Work
}

// prefillLeg asks f's balancer whether f, just picked onto its decode
// server dec.Candidates[0], takes a prefill leg, as the proxy's planPD
// does ([balancer.Balancer.PlanPrefill]), and if so returns the leg on
// the prefill server it picked. It returns nil for a request answered in
// one leg, with a nil error; an error for one that must split but cannot,
// which the proxy fails. Only a fleet with declared roles splits, and a
// stored follow-up never does (the proxy pins it to its holder).
func (r *run) prefillLeg(f *flight, dec *balancer.Decision) (*pdLeg, error) {
	rep := r.reps[f.rep]
	if !r.roles || f.req.Stored > 0 {
		return nil, nil
	}
	plan, err := rep.bal.PlanPrefill(&f.breq, dec)
	if plan == nil || err != nil {
		return nil, err
	}
	srv := r.byID[plan.Decision.Candidates[0].ID]
	r.res.Split++
	return &pdLeg{srv: srv, guard: plan.Guard, active: true, work: dec.Work[0], seq: &sim.Seq{
		Hashes:       slices.Clone(r.engineHashes(f.breq.Model, r.servers[srv].block)),
		PromptTokens: r.c.Perturb.engineTokens(f.req.Tokens()),
		MaxTokens:    1,
		Adapter:      f.seq.Adapter,
		Tokens:       f.tokens,
	}}, nil
}

// prefilled ends f's prefill leg, whose one token o is: its guard is
// released, and the KV cache sets off for the decode server, where f
// enters when it has arrived. The leg's prompt and cache hit are the
// request's, as the decode server's hit is the transfer's.
func (r *run) prefilled(f *flight, o sim.Output) {
	leg := f.pd
	leg.guard.FirstByte(r.clock())
	leg.guard.Release()
	leg.active = false
	delete(r.flights, o.Seq)
	r.res.PromptTokens += int64(o.Seq.PromptTokens)
	r.res.CachedTokens += int64(o.Seq.CachedTokens)
	r.entering++
	r.push(event{at: r.now + r.c.Transfer.TransferTime(f.seq.PromptTokens), kind: evTransferred, f: f})
}

// transferred starts f's decode leg once its KV cache has arrived: the
// decode server's work is now a request prefilled elsewhere
// ([balancer.Work.Prefilled]), as the proxy's decodeWork makes it, and it
// enters after the server's intake.
func (r *run) transferred(f *flight) {
	f.guard.Rework(f.pd.work.Prefilled(), r.clock())
	r.intake(f, f.srv, f.seq)
}
