package balancer

// Reason says why a pick chose its first candidate. The proxy sends it as
// the x-llmlb-reason header and counts it in llmlb_picks_total's reason
// label, so its values are part of the interface and never change.
type Reason string

// The reasons a pick gives, and the proxy's ReasonRetry, one place for all.
const (
	// ReasonPrefixHit: the backend holds part of the prompt.
	ReasonPrefixHit Reason = "prefix-hit"
	// ReasonLeastLoad: the backend is the least loaded, or the cheapest by
	// load alone.
	ReasonLeastLoad Reason = "least-load"
	// ReasonLoRA: the backend runs the requested adapter and another does
	// not.
	ReasonLoRA Reason = "lora"
	// ReasonAffinity: the session header's backend.
	ReasonAffinity Reason = "affinity"
	// ReasonRoundRobin, ReasonRandom and ReasonConsistentHash name the
	// pickers that choose by nothing else.
	ReasonRoundRobin     Reason = "round-robin"
	ReasonRandom         Reason = "random"
	ReasonConsistentHash Reason = "consistent-hash"
	// ReasonCacheSpace: sglang v0.4's miss, to the backend holding the
	// smallest tree.
	ReasonCacheSpace Reason = "cache-space"
	// ReasonStaleMetrics: no backend had fresh metrics.
	ReasonStaleMetrics Reason = "stale-metrics"
	// ReasonFallback: only backends not yet probed could take the request.
	ReasonFallback Reason = "fallback"
	// ReasonSaturated: every backend is saturated and the admission queue
	// is off (or the pick is a dry run).
	ReasonSaturated Reason = "saturated"
	// ReasonStored: the backend stores the response the request names
	// (a Responses follow-up, or a look-up by id); no other may take it.
	ReasonStored Reason = "stored"
	// ReasonDeadline: no backend's estimate met the request's TTFT
	// deadline, and this one misses it by least.
	ReasonDeadline Reason = "deadline"
	// ReasonRetry: the proxy's, for a request its first candidate failed
	// and a later one answered.
	ReasonRetry Reason = "retry"
)

// reasonFor names why candidate i of a scored pick won: the adapter when
// it runs there and not everywhere, else a prefix hit, else load.
func reasonFor(p *PickInfo, i int) Reason {
	c := &p.Cands[i]
	if c.LoRA == LoRARunning {
		for j := range p.Cands {
			if p.Cands[j].LoRA != LoRARunning {
				return ReasonLoRA
			}
		}
	}
	if c.MatchedBlocks > 0 {
		return ReasonPrefixHit
	}
	return ReasonLeastLoad
}
