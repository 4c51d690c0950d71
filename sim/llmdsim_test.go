package sim

import (
	"strings"
	"testing"
	"time"
)

// llmdReq is one request of an llmdHarness run and what became of it.
type llmdReq struct {
	at      time.Duration
	seq     *Seq
	tokens  []time.Duration // when each output token came
	refused time.Duration   // when it was refused; -1 if not
}

// llmdHarness drives an LLMDSim in virtual time as the cluster benchmark
// does: it steps the model after every Add and whenever the duration the
// last Step returned has passed.
type llmdHarness struct {
	t     *testing.T
	m     *LLMDSim
	now   time.Duration
	due   time.Duration // the next step; -1 when idle
	bySeq map[*Seq]*llmdReq
	out   []Output
}

func newLLMDHarness(t *testing.T, cfg LLMDSimConfig) *llmdHarness {
	h := &llmdHarness{t: t, due: -1, bySeq: map[*Seq]*llmdReq{}}
	h.m = NewLLMDSim(cfg, func() time.Duration { return h.now })
	return h
}

func (h *llmdHarness) step() {
	var d time.Duration
	h.out, d = h.m.Step(h.out[:0])
	for _, o := range h.out {
		r := h.bySeq[o.Seq]
		switch {
		case o.Refused:
			r.refused = h.now
		default:
			r.tokens = append(r.tokens, h.now)
		}
	}
	h.due = -1
	if d > 0 {
		h.due = h.now + d
	}
}

// until runs the steps due by t and moves the clock to t.
func (h *llmdHarness) until(t time.Duration) {
	for h.due >= 0 && h.due <= t {
		h.now = h.due
		h.step()
	}
	h.now = max(h.now, t)
}

// add adds r at its time.
func (h *llmdHarness) add(r *llmdReq) {
	h.t.Helper()
	h.until(r.at)
	r.refused = -1
	h.bySeq[r.seq] = r
	if err := h.m.Add(r.seq); err != nil {
		h.t.Fatalf("Add(%d tokens) = %v", r.seq.PromptTokens, err)
	}
	h.step()
}

// finish runs until nothing is left.
func (h *llmdHarness) finish() {
	for h.due >= 0 {
		h.until(h.due)
	}
}

// blocks returns n block hashes from base+1 on.
func blocks(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + 1 + uint64(i)
	}
	return out
}

// llmdSeq is a request of the given prompt tokens, whose full blocks
// hash from base on unless hashes are given.
func llmdSeq(base uint64, prompt, maxTokens int, hashes ...uint64) *Seq {
	if hashes == nil {
		hashes = blocks(base, prompt/16)
	}
	return &Seq{Hashes: hashes, PromptTokens: prompt, MaxTokens: maxTokens}
}

// TestLLMDSimPrefillTime: a lone request's first token comes after the
// prefill overhead plus its uncached tokens at the per-token cost, and its
// later tokens 2 ms apart.
func TestLLMDSimPrefillTime(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prompt    int
		wantFirst time.Duration
	}{
		{"one block", 16, 5*time.Millisecond + 16*250*time.Microsecond},
		{"1000 tokens", 1000, 5*time.Millisecond + 1000*250*time.Microsecond},
		{"a partial block", 7, 5*time.Millisecond + 7*250*time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newLLMDHarness(t, DefaultLLMDSimConfig())
			r := &llmdReq{at: 3 * time.Second, seq: llmdSeq(0, tc.prompt, 3)}
			h.add(r)
			h.finish()
			want := []time.Duration{tc.wantFirst, tc.wantFirst + 2*time.Millisecond, tc.wantFirst + 4*time.Millisecond}
			if len(r.tokens) != len(want) {
				t.Fatalf("tokens at %v, want %d tokens", r.tokens, len(want))
			}
			for i, w := range want {
				if got := r.tokens[i] - r.at; got != w {
					t.Errorf("token %d after %v, want %v", i, got, w)
				}
			}
			if st := h.m.Stats(); st.Running != 0 || st.KVUsage != 0 || st.GenerationTokens != 3 || st.PromptTokens != int64(tc.prompt) {
				t.Errorf("Stats() after = %+v, want nothing running, no KV in use, 3 tokens and the prompt counted", st)
			}
		})
	}
}

// TestLLMDSimSlowsWithRunning: with k requests running, a token takes 2 ms
// × (1 + (k−1)/63): 2 ms alone, 4 ms at 64, linear between; a prefill
// started with k running is slowed by the same factor.
func TestLLMDSimSlowsWithRunning(t *testing.T) {
	for _, tc := range []struct {
		k           int
		wantITL     time.Duration
		wantLastTTF time.Duration // the k-th request's, started with k running
	}{
		{1, 2 * time.Millisecond, 9 * time.Millisecond},
		{33, 3015873 * time.Nanosecond, 7539682*time.Nanosecond + 16*376984*time.Nanosecond},
		{64, 4 * time.Millisecond, 10*time.Millisecond + 16*500*time.Microsecond},
	} {
		h := newLLMDHarness(t, DefaultLLMDSimConfig())
		var reqs []*llmdReq
		for i := range tc.k {
			r := &llmdReq{seq: llmdSeq(uint64(i)*100, 16, 50)}
			reqs = append(reqs, r)
			h.add(r)
		}
		if st := h.m.Stats(); st.Running != tc.k || st.Waiting != 0 {
			t.Errorf("k=%d: Stats() = %d running, %d waiting, want %d and 0", tc.k, st.Running, st.Waiting, tc.k)
		}
		h.finish()
		last := reqs[tc.k-1]
		if len(last.tokens) != 50 {
			t.Fatalf("k=%d: %d tokens, want 50", tc.k, len(last.tokens))
		}
		// Its second token was timed when its first came, all k running.
		if got := last.tokens[1] - last.tokens[0]; got != tc.wantITL {
			t.Errorf("k=%d: inter-token time %v, want %v", tc.k, got, tc.wantITL)
		}
		if got := last.tokens[0]; got != tc.wantLastTTF {
			t.Errorf("k=%d: last request's first token after %v, want %v", tc.k, got, tc.wantLastTTF)
		}
	}
}

// TestLLMDSimRefusesWhatDoesNotFit: a request whose blocks exceed the free
// and idle ones is refused at once, neither queued nor preempting; once
// the blocks are released, the same size fits, evicting idle blocks.
func TestLLMDSimRefusesWhatDoesNotFit(t *testing.T) {
	h := newLLMDHarness(t, DefaultLLMDSimConfig())
	huge := &llmdReq{seq: llmdSeq(0, 2049*16, 1)}
	h.add(huge)
	if huge.refused != 0 || len(huge.tokens) != 0 {
		t.Errorf("2,049 blocks: refused at %v with %d tokens, want refused at 0 with none", huge.refused, len(huge.tokens))
	}
	a := &llmdReq{at: time.Second, seq: llmdSeq(10000, 1500*16, 100)}
	b := &llmdReq{at: time.Second + time.Millisecond, seq: llmdSeq(20000, 600*16, 10)}
	h.add(a)
	h.add(b)
	if b.refused != b.at {
		t.Errorf("600 blocks beside 1,500 in use: refused at %v, want at its arrival %v", b.refused, b.at)
	}
	if st := h.m.Stats(); st.Running != 1 || st.Waiting != 0 || st.KVUsage != 1500.0/2048 {
		t.Errorf("Stats() = %d running, %d waiting, KV %v; want 1, 0, %v", st.Running, st.Waiting, st.KVUsage, 1500.0/2048)
	}
	h.finish()
	if len(a.tokens) != 100 {
		t.Errorf("the request holding the blocks made %d tokens, want 100 (no preemption)", len(a.tokens))
	}
	c := &llmdReq{at: h.now + time.Second, seq: llmdSeq(30000, 600*16, 10)}
	h.add(c)
	h.finish()
	if c.refused >= 0 || len(c.tokens) != 10 {
		t.Errorf("600 blocks with 1,500 idle: refused at %v, %d tokens; want served", c.refused, len(c.tokens))
	}
	if st := h.m.Stats(); st.CachedBlocks != 2048 || st.KVUsage != 0 {
		t.Errorf("Stats() after = %d cached blocks, KV %v; want 2048 and 0", st.CachedBlocks, st.KVUsage)
	}
}

// TestLLMDSimPrefixHit: a request sharing a prefix with one before it,
// finished or running, prefills only its uncached tokens.
func TestLLMDSimPrefixHit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration // the second request's arrival after the first's
	}{
		{"first finished", 10 * time.Second},
		{"first running", 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newLLMDHarness(t, DefaultLLMDSimConfig())
			first := &llmdReq{seq: llmdSeq(0, 1600, 200)}
			// 80 blocks shared, 20 its own, and 8 tokens of a partial block.
			second := &llmdReq{at: tc.after, seq: llmdSeq(0, 1608, 1, append(blocks(0, 80), blocks(5000, 20)...)...)}
			h.add(first)
			h.add(second)
			h.finish()
			f := 1.0
			if tc.after < first.tokens[len(first.tokens)-1] {
				f = 1 + 1.0/63 // two running
			}
			want := scaleDuration(5*time.Millisecond, f) + (1608-80*16)*scaleDuration(250*time.Microsecond, f)
			if got := second.tokens[0] - second.at; got != want {
				t.Errorf("second request's first token after %v, want %v", got, want)
			}
			if second.seq.CachedTokens != 1280 {
				t.Errorf("CachedTokens = %d, want 1280", second.seq.CachedTokens)
			}
			if st := h.m.Stats(); st.PrefixHits != 1280 || st.PrefixQueries != 3208 {
				t.Errorf("Stats() prefix hits %d of %d, want 1280 of 3208", st.PrefixHits, st.PrefixQueries)
			}
		})
	}
}

// TestLLMDSimQueuesBeyondMaxNumSeqs: past MaxNumSeqs a request waits and
// starts when a worker frees.
func TestLLMDSimQueuesBeyondMaxNumSeqs(t *testing.T) {
	cfg := DefaultLLMDSimConfig()
	cfg.MaxNumSeqs, cfg.TimeFactorUnderLoad = 2, 1
	h := newLLMDHarness(t, cfg)
	var reqs []*llmdReq
	for i := range 3 {
		r := &llmdReq{seq: llmdSeq(uint64(i)*100, 16, 5)}
		reqs = append(reqs, r)
		h.add(r)
	}
	if st := h.m.Stats(); st.Running != 2 || st.Waiting != 1 {
		t.Errorf("Stats() = %d running, %d waiting; want 2 and 1", st.Running, st.Waiting)
	}
	page := RenderMetrics("vllm", "m", false, h.m.Stats(), time.Unix(0, 0))
	for _, w := range []string{`vllm:num_requests_running{engine="0",model_name="m"} 2.0`, `vllm:num_requests_waiting{engine="0",model_name="m"} 1.0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0009765625`, `block_size="16"`, `num_gpu_blocks="2048"`} {
		if !strings.Contains(page, w) {
			t.Errorf("/metrics lacks %s:\n%s", w, page)
		}
	}
	h.finish()
	ttft := 9 * time.Millisecond
	end := ttft + 4*2*time.Millisecond
	if got := reqs[2].tokens[0]; got != end+ttft {
		t.Errorf("third request's first token at %v, want %v (the first's end %v plus its prefill)", got, end+ttft, end)
	}
}

// TestLLMDSimQueueFull: with every worker busy and the queue full, a
// request is refused on arrival.
func TestLLMDSimQueueFull(t *testing.T) {
	cfg := DefaultLLMDSimConfig()
	cfg.MaxNumSeqs, cfg.MaxWaiting = 1, 1
	h := newLLMDHarness(t, cfg)
	h.add(&llmdReq{seq: llmdSeq(0, 16, 5)})
	h.add(&llmdReq{seq: llmdSeq(100, 16, 5)})
	if err := h.m.Add(llmdSeq(200, 16, 5)); err == nil {
		t.Error("Add to a full queue = nil, want an error")
	}
}
