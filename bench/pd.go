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

// prefillLeg decides, as the proxy's planPD does, whether f, just picked
// onto its decode server dec.Candidates[0], takes a prefill leg, and if
// so picks its prefill server and returns the leg; nil answers f in one
// leg. Only a fleet with declared roles splits, and a stored follow-up
// never does (the proxy pins it to its holder).
func (r *run) prefillLeg(f *flight, dec *balancer.Decision) *pdLeg {
	rep := r.reps[f.rep]
	if !r.roles || f.req.Stored > 0 {
		return nil
	}
	decode := dec.Candidates[0]
	split, _ := rep.bal.Config().PD.Split(decode, dec.Uncached, f.breq.PromptTokens)
	if !split {
		return nil
	}
	pb := f.breq
	pb.Role, pb.Session, pb.MaxTokens = balancer.RolePrefill, "", 1
	pb.NearHost = decode.URL.Hostname()
	pb.Guard = rep.bal.NewGuard()
	pdec, err := rep.bal.Pick(&pb, nil)
	if err != nil || pdec.Candidates[0] == decode {
		pb.Guard.Release()
		return nil
	}
	srv := r.byID[pdec.Candidates[0].ID]
	r.res.Split++
	return &pdLeg{srv: srv, guard: pb.Guard, active: true, work: dec.Work[0], seq: &sim.Seq{
		Hashes:       slices.Clone(r.engineHashes(f.breq.Model, r.servers[srv].block)),
		PromptTokens: r.c.Perturb.engineTokens(f.req.Tokens()),
		MaxTokens:    1,
		Adapter:      f.seq.Adapter,
		Tokens:       f.tokens,
	}}
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
// decode server's work is now a request with nothing to prefill, as the
// proxy's decodeWork makes it, and it enters after the server's intake.
func (r *run) transferred(f *flight) {
	w := f.pd.work
	w.UncachedTokens, w.PrefillSeconds, w.AheadTokens, w.QueuedAhead, w.Remote = 0, 0, 0, 0, true
	f.guard.Rework(w, r.clock())
	r.intake(f, f.srv, f.seq)
}
