package balancer

// policy is a preset built for one balancer: weighted scorers and a
// picker, and the prefix index it matches with.
type policy struct {
	name      string
	scorers   []weighted
	picker    Picker
	index     PrefixIndex // nil: no block matching
	sizeIndex bool        // size the index's LRUs from KV capacity
	// learnTokens: llmlb's own index, sized and matched at each backend's
	// learned bytes per token ([tokenRate]).
	learnTokens bool
	tree        TextTree
	oracle      Oracle
	events      CacheEvents // the engines' KV events, for the presets with llmlb's own index
	admission   bool        // llmlb's saturation filter and admission queue apply
	userKeyed   bool        // keyed on Request.UserText, or the prompt's bytes ([Preset.UserKeyed])
}

// weighted is one of a policy's scorers and its weight in the total.
type weighted struct {
	s Scorer
	w float64
}

// forget drops what the policy's index and tree remember of a removed
// backend's slot, which a new backend may take.
func (p *policy) forget(slot int) {
	if p.index != nil {
		p.index.Forget(slot)
	}
	if p.tree != nil {
		p.tree.Forget(slot)
	}
}

// PromptInParts reports whether the policy reads a prompt only through
// its block hashes, so that a request may carry it as [Request.Parts]:
// true for the policies with a prefix index and no text tree, oracle or
// key on the user's text ([Preset.UserKeyed]), which read the prompt's
// bytes.
func (b *Balancer) PromptInParts() bool {
	return b.pol.index != nil && b.pol.tree == nil && b.pol.oracle == nil && !b.pol.userKeyed
}

// ReadsCacheEvents reports whether the policy matches prompts against the
// engines' KV-cache events ([Deps.Events]), so that a request is worth
// tokenizing into [Request.TokenBlocks] before its pick.
func (b *Balancer) ReadsCacheEvents() bool { return b.pol.events != nil }

// mix is the splitmix64 finaliser: a cheap, well-spread 64-bit hash.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
