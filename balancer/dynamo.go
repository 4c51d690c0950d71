package balancer

// DynamoPicker is NVIDIA Dynamo's KV router with its default cost and
// router_temperature 0 (ai-dynamo/dynamo lib/llm/src/kv_router/scheduler.rs
// DefaultWorkerSelector at db19bd2a, over the loads of sequence.rs
// ActiveSequences at 581ee33e). The candidate with the lowest
//
//	overlap_weight × prefill blocks + decode blocks
//
// wins, overlap_weight 1; ties go to the one whose prefix index holds the
// fewest blocks, then at random. Prefill blocks are the prompt tokens the
// backend would still have to prefill: those of the requests this
// balancer sent it that have no first token yet ([Candidate.PendingTokens],
// Dynamo's active prefill tokens, released at the first token) plus this
// prompt's uncached tokens there. Decode blocks are the prompt blocks of
// the requests in flight there, each distinct block once: the ledger's
// uncached prompt tokens in flight ([Ledger.OpenPrompt]) stand for them,
// since a block a request found held brought nothing new; plus this
// prompt's blocks, all of them (Dynamo leaves out those an active request
// there already holds, which the ledger cannot tell). Output blocks do
// not count, as router_track_output_blocks is off by default. Both terms
// are counted in tokens here: in blocks of any one size the order is the
// same.
type DynamoPicker struct {
	index PrefixIndex // for the tie-break; nil: ties at random
	rand  func() uint64
}

var _ Picker = (*DynamoPicker)(nil)

// dynamoOverlapWeight is Dynamo's overlap_score_weight default.
const dynamoOverlapWeight = 1

// Choose implements [Picker].
func (d *DynamoPicker) Choose(p *PickInfo, _ []float64) (int, Reason) {
	best, bestHeld, ties := -1, 0, 0
	var bestCost int64
	for i := range p.Cands {
		c := &p.Cands[i]
		prefill := c.PendingTokens + int64(c.UncachedTokens)
		decode := c.Backend.Ledger.OpenPrompt() + int64(p.Req.PromptTokens)
		cost := dynamoOverlapWeight*prefill + decode
		switch {
		case best < 0 || cost < bestCost:
			best, bestCost, bestHeld, ties = i, cost, -1, 1
		case cost == bestCost:
			if bestHeld < 0 {
				bestHeld = d.held(&p.Cands[best])
			}
			switch h := d.held(c); {
			case h < bestHeld:
				best, bestHeld, ties = i, h, 1
			case h == bestHeld:
				// Reservoir sampling keeps each tie equally likely.
				ties++
				if d.rand()%uint64(ties) == 0 {
					best = i
				}
			}
		}
	}
	return best, reasonFor(p, best)
}

// held returns the blocks the prefix index remembers for c's backend:
// Dynamo's tree size, its first tie-break.
func (d *DynamoPicker) held(c *Candidate) int {
	if d.index == nil {
		return 0
	}
	return d.index.Held(c.Backend.slot)
}
