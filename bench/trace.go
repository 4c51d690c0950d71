package bench

import (
	"math"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// TraceRecord is one served request of an emulated run, for `llmlb bench
// --record`: where it went and why, what the servers' prefix caches held
// of its prompt when it was picked, how much prefill work was queued
// where it went and where its prompt was, and how long its first token
// took. The held and left figures are read from the emulated engines at
// the pick, which no balancer can see, so a trace tells whether a request
// that left the server holding its prompt was right to: a balancer
// charged with keeping the cache's hit rate leaves a holder only for a
// wait, and the trace says whether that wait was there.
type TraceRecord struct {
	// Request is the request's index in the workload, Replica the
	// balancer that picked for it (0 with one).
	Request int `json:"request"`
	Replica int `json:"replica"`
	// Server is where it went; Reason is the pick's x-llmlb-reason.
	Server string `json:"server"`
	Reason string `json:"reason"`
	// ArrivedS is its arrival in seconds from the run's start, TTFTS its
	// time to first token.
	ArrivedS float64 `json:"arrived_s"`
	TTFTS    float64 `json:"ttft_s"`
	// PromptTokens is its prompt, CachedTokens what the server's prefix
	// cache served of it when the server scheduled it.
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	// HeldTokens is how much of the prompt the chosen server's cache held
	// at the pick; BestHeldTokens the most any server's held, on
	// BestServer (the chosen one when it ties).
	HeldTokens     int    `json:"held_tokens"`
	BestHeldTokens int    `json:"best_held_tokens"`
	BestServer     string `json:"best_server"`
	// AheadTokens is the prefill work the balancer estimated queued ahead
	// of the request on the chosen server ([balancer.Work]; 0 for the
	// policies that estimate none).
	AheadTokens float64 `json:"ahead_tokens_estimated"`
	// UncachedTokens is the prefill the balancer estimated the request
	// leaves the chosen server ([balancer.Work]), in that server's tokens
	// as the balancer counts them.
	UncachedTokens int `json:"uncached_tokens_estimated"`
	// LeftTokens and BestLeftTokens are the prefill work truly left at the
	// pick on the chosen server and on BestServer ([sim.Engine.PrefillLeft];
	// requests still in a server's intake are not in it yet).
	LeftTokens     int `json:"prefill_left_tokens"`
	BestLeftTokens int `json:"best_prefill_left_tokens"`
	// LeastLeftTokens is the least prefill work left on any server then,
	// on LeastServer (the chosen one when it ties): whether a server with
	// less queued was there to go to.
	LeastLeftTokens int    `json:"least_prefill_left_tokens"`
	LeastServer     string `json:"least_server"`
	// EstimatedTTFTS is the first token's time the pick estimated on the
	// chosen server (0 for the policies that estimate none), and
	// QueuedEstimated and RunningEstimated the requests it saw waiting and
	// running there.
	EstimatedTTFTS   float64 `json:"ttft_estimated_s"`
	QueuedEstimated  float64 `json:"queued_estimated"`
	RunningEstimated float64 `json:"running_estimated"`
}

// tracePick fills in what the servers held and had left when f was
// picked for server f.srv.
func (r *run) tracePick(f *flight, dec *balancer.Decision) {
	t := &TraceRecord{Request: f.idx, Replica: f.rep, Server: r.servers[f.srv].id, Reason: string(dec.Reason),
		ArrivedS: f.arrived.Seconds(), AheadTokens: dec.Work[0].AheadTokens, UncachedTokens: dec.Work[0].UncachedTokens,
		EstimatedTTFTS: dec.TTFT, QueuedEstimated: dec.Work[0].QueuedAhead, RunningEstimated: dec.Work[0].Running}
	best, least := f.srv, f.srv
	t.LeastLeftTokens = math.MaxInt
	for i, s := range r.servers {
		held, left := s.eng.Holds(r.engineHashes(f.breq.Model, s.block)), s.eng.PrefillLeft()
		if i == f.srv {
			t.HeldTokens, t.LeftTokens = held, left
		}
		// A tie goes to the chosen server.
		if held > t.BestHeldTokens || held == t.BestHeldTokens && i == f.srv {
			t.BestHeldTokens, t.BestLeftTokens, best = held, left, i
		}
		if left < t.LeastLeftTokens || left == t.LeastLeftTokens && i == f.srv {
			t.LeastLeftTokens, least = left, i
		}
	}
	t.BestServer, t.LeastServer = r.servers[best].id, r.servers[least].id
	f.trace = t
}

// traceFirst records f's first token, after ttft, with cached prompt
// tokens served from the cache.
func (r *run) traceFirst(f *flight, ttft time.Duration, cached int) {
	if f.trace == nil {
		return
	}
	f.trace.TTFTS = ttft.Seconds()
	f.trace.PromptTokens = f.seq.PromptTokens
	f.trace.CachedTokens = cached
	r.res.Trace = append(r.res.Trace, *f.trace)
	f.trace = nil
}
