package balancer

import "fmt"

// Prefill is the prefill leg of a disaggregated request, as
// [Balancer.PlanPrefill] plans it.
type Prefill struct {
	// Decision holds the prefill candidates, best first: backends of the
	// decode server's engine (the KV transfer's protocol is the engine's),
	// never the decode server itself. Its Work is theirs.
	Decision Decision
	// Guard accounts the leg on Decision.Candidates[0]; the caller
	// attaches it to any other candidate it tries and releases it when
	// the leg ends.
	Guard *Guard
}

// PlanPrefill decides whether req, picked onto dec.Candidates[0] (its
// decode server, which lacks dec.Uncached of the prompt's tokens), takes
// a prefill leg on another server, and if so picks that server. The proxy
// and the benchmark both ask it, so a benchmark's split is the product's.
//
// [PDConfig.Split] decides: vLLM router's P/D bypass chooses the decode
// worker first and skips the prefill stage when its uncached tokens are
// few, where a KV transfer would cost more than prefilling in place. A
// request with no prefill server to take it, whose prefill pick is its
// decode server (role both) or runs another engine, is answered in one
// leg: PlanPrefill returns nil and a nil error. When Split says the
// request must split (an SGLang decode server takes no request without a
// bootstrap room), that is an error instead, wrapping the pick's error or
// [ErrNoBackend].
//
// The caller has decided that req may split at all: its fleet declares
// roles ([Snapshot.Disaggregated]), its API is one the engines
// disaggregate, and no stored response pins it to one server.
// PlanPrefill is safe for concurrent use, as Pick is.
func (b *Balancer) PlanPrefill(req *Request, dec *Decision) (*Prefill, error) {
	decode := dec.Candidates[0]
	split, must := b.Config().PD.Split(decode, dec.Uncached, req.PromptTokens)
	if !split {
		return nil, nil
	}
	pb := req.PrefillLeg(decode)
	pb.Guard = b.NewGuard()
	pdec, err := b.Pick(&pb, nil)
	if err == nil {
		primary := pdec.Candidates[0]
		switch {
		case primary == decode:
			err = ErrNoBackend
		case !samePair(&pdec, decode):
			err = fmt.Errorf("prefill server %s runs %s, decode server %s %s", primary.ID, primary.Engine, decode.ID, decode.Engine)
		}
	}
	if err != nil {
		pb.Guard.Release()
		if must {
			return nil, fmt.Errorf("prefill leg for decode server %s: %w", decode.ID, err)
		}
		return nil, nil
	}
	return &Prefill{Decision: pdec, Guard: pb.Guard}, nil
}

// PrefillLeg returns the request of r's prefill leg for the decode server
// decode: role prefill, one output token, no session (the session's
// server is the decode server), and among ties a server on decode's host
// ([Request.NearHost]). Its Guard is r's; PlanPrefill gives it its own.
func (r *Request) PrefillLeg(decode *Backend) Request {
	pb := *r
	pb.Role, pb.Session, pb.MaxTokens = RolePrefill, "", 1
	pb.NearHost = decode.URL.Hostname()
	return pb
}

// samePair keeps, of a prefill pick's candidates, those that can pair
// with decode: the same engine (the protocol is the engine's), and not
// decode itself, and reports whether the first is still the pick's
// primary, the one its guard is attached to.
func samePair(dec *Decision, decode *Backend) bool {
	primary := dec.Candidates[0]
	n := 0
	for i, be := range dec.Candidates {
		if be.Engine == decode.Engine && be != decode {
			dec.Candidates[n], dec.Work[n] = be, dec.Work[i]
			n++
		}
	}
	dec.Candidates = dec.Candidates[:n]
	return n > 0 && dec.Candidates[0] == primary
}

// Prefilled returns w as the work of a decode leg whose prompt a prefill
// server took: no prompt tokens to prefill and none ahead of it, and a
// first byte (which waits on the prefill leg and the KV transfer) that
// teaches no estimate ([Work.Remote]).
func (w Work) Prefilled() Work {
	w.UncachedTokens, w.PrefillSeconds, w.AheadTokens, w.QueuedAhead, w.Remote = 0, 0, 0, 0, true
	return w
}
