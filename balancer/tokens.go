package balancer

import (
	"math"
	"sync"
	"sync/atomic"
)

// tokenRate is what a backend's answers teach about its tokenizer and its
// cache: the canonical prompt bytes one of its tokens covers, from
// usage.prompt_tokens, and how much of what the prefix index remembers
// sending there the backend really keeps, from usage's cached_tokens. A
// tokenizer's rate differs by model, language and content (code, CJK,
// random ids), so no fixed rate converts a server's KV capacity, counted
// in tokens, into the bytes of prompt it holds.
type tokenRate struct {
	bpt   atomic.Uint64 // bytes per token, float64 bits; 0 until learned
	fit   atomic.Uint64 // the index size's correction, float64 bits; 0 means 1
	sized atomic.Uint64 // bytes per token × fit the index slot was last sized at

	mu           sync.Mutex
	bytes, toks  float64 // decayed sums of the prompts' bytes and tokens; guarded by mu
	fitN, fitNet int     // the cached_tokens verdicts since the fit last moved; guarded by mu
}

const (
	// minUsageTokens is the shortest prompt that teaches a rate: a chat
	// template's own tokens weigh too much in a shorter one.
	minUsageTokens = 32
	// rateDecay weighs the sums that make the rate: each answer keeps
	// this share of the ones before, so the rate follows the last few
	// dozen prompts, the longer ones most.
	rateDecay = 0.95
	// minRate and maxRate bound a learned rate: no tokenizer reads less
	// than a byte a token, nor a token id more than 32 bytes.
	minRate, maxRate = 1.0, 32.0
	// fitVotes is how many verdicts the fit waits for before it moves,
	// and fitStep how far it moves at most, either way.
	fitVotes, fitStep = 8, 0.05
	// minFit and maxFit bound the fit.
	minFit, maxFit = 0.25, 4.0
	// resizeSlack is how far bytes per token × fit moves before the
	// backend's index slot is sized again.
	resizeSlack = 0.05
)

func loadFloat(a *atomic.Uint64) float64 { return math.Float64frombits(a.Load()) }

// rate returns the learned bytes per token, or 0 before any answer taught
// one.
func (t *tokenRate) rate() float64 { return loadFloat(&t.bpt) }

// scale returns the bytes per token and fit the index slot is sized at:
// 0 when nothing is learned, which means the index's default.
func (t *tokenRate) scale() float64 {
	r := t.rate()
	if r == 0 {
		return 0
	}
	if f := loadFloat(&t.fit); f > 0 {
		return r * f
	}
	return r
}

// BytesPerToken returns the canonical prompt bytes a token of the backend
// covers, as its answers' usage taught it, or 0 before any did.
func (l *Ledger) BytesPerToken() float64 { return l.tok.rate() }

// IndexFit returns the correction the backend's cached_tokens made to its
// prefix index's size: 1 when none, above 1 when the backend keeps more
// than the index remembered.
func (l *Ledger) IndexFit() float64 {
	if f := loadFloat(&l.tok.fit); f > 0 {
		return f
	}
	return 1
}

// learn adds one answer: bytes of canonical prompt that the backend
// counted as tokens.
func (t *tokenRate) learn(bytes, tokens int) {
	if tokens < minUsageTokens || bytes <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bytes = t.bytes*rateDecay + float64(bytes)
	t.toks = t.toks*rateDecay + float64(tokens)
	t.bpt.Store(math.Float64bits(min(max(t.bytes/t.toks, minRate), maxRate)))
}

// vote counts one answer's verdict on the index's size: +1 when the
// backend held blocks the index had dropped (it keeps more than the
// index does), -1 when it lacked blocks the index said it held (less).
// Every fitVotes answers with a verdict, the fit moves by up to fitStep,
// in proportion to the net vote.
func (t *tokenRate) vote(v int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fitN++
	t.fitNet += v
	if t.fitN < fitVotes {
		return
	}
	f := loadFloat(&t.fit)
	if f == 0 {
		f = 1
	}
	f = min(max(f*(1+fitStep*float64(t.fitNet)/fitVotes), minFit), maxFit)
	t.fit.Store(math.Float64bits(f))
	t.fitN, t.fitNet = 0, 0
}

// resize reports whether the backend's index slot should be sized again
// at s, the current [tokenRate.scale], and takes s as sized if so.
func (t *tokenRate) resize(s float64) bool {
	old := loadFloat(&t.sized)
	if s == 0 || (old > 0 && math.Abs(s-old) <= resizeSlack*old) {
		return false
	}
	return t.sized.CompareAndSwap(math.Float64bits(old), math.Float64bits(s))
}

// Usage is what a backend's answer reported of its prompt: the tokens it
// counted, and, when it said, the tokens its prefix cache served.
type Usage struct {
	PromptTokens int
	CachedTokens int
	CachedKnown  bool
}

// learnUsage teaches be's [tokenRate] from the usage of a request sent
// there with work w, for a policy that sizes llmlb's own index, and sizes
// be's index slot again when the rate or the fit moved.
//
// A cached count short of what the index matched by at least a block is a
// miss it predicted: the backend no longer held blocks the index still
// remembered, so the index is larger than the cache. A cached count past
// the match by a block, where the first block past the match is one the
// index dropped from this backend, is a hit it did not predict: the index
// is smaller. A hit on blocks this balancer never sent there (another
// balancer did) says nothing of the index's size and is not counted.
func (b *Balancer) learnUsage(be *Backend, w Work, u Usage) {
	if !b.pol.learnTokens || w.Remote || w.PromptBytes <= 0 || u.PromptTokens <= 0 {
		return
	}
	t := &be.Ledger.tok
	t.learn(w.PromptBytes, u.PromptTokens)
	if u.CachedKnown && w.Matched {
		// The verdict is in bytes, at the rate just learned.
		block := 16.0
		if m := be.Metrics.BlockSize; m.Known && m.V >= 1 {
			block = m.V
		}
		rate := t.rate()
		cached, block, matched := float64(u.CachedTokens)*rate, block*rate, float64(w.MatchedBytes)
		switch {
		case cached+block <= matched:
			t.vote(-1)
		case cached >= matched+block && w.NextEvicted:
			t.vote(+1)
		}
	}
	if m := be.Metrics; m.BlockSize.Known && m.NumBlocks.Known {
		if s := t.scale(); t.resize(s) {
			// Under b.mu, as Update sizes slots: a backend removed since
			// the pick may have given its slot to another.
			b.mu.Lock()
			if b.ledgers[be.ID] == be.Ledger {
				b.pol.index.Resize(be.slot, int(m.BlockSize.V), int(m.NumBlocks.V), s)
			}
			b.mu.Unlock()
		}
	}
}
