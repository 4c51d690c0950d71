package balancer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config is the `balancer:` section of config.yaml.
type Config struct {
	// Policy chooses the routing algorithm: ttft (llmlb's own),
	// round-robin, random, least-request, power-of-two, epp, llm-d-load,
	// llm-d-optimized, dynamo-kv, sglang-cache-aware or consistent-hash
	// ([Presets]). (default ttft)
	Policy string `mapstructure:"policy"`
	// MaxCandidates is how many backends a pick returns, best first: the
	// primary and the fallbacks the proxy retries on. Set from
	// proxy.max_attempts; [New] clamps it to 1..[CandidateLimit].
	// (default 3)
	MaxCandidates int `mapstructure:"-"`
	// TTFT tunes the default policy's time-to-first-token estimate.
	TTFT TTFTConfig `mapstructure:"ttft"`
	// Saturation says when a backend takes no new requests while another
	// can.
	Saturation SaturationConfig `mapstructure:"saturation"`
	// Admission is the queue requests wait in when every backend is
	// saturated.
	Admission AdmissionConfig `mapstructure:"admission"`
	// Session keeps requests with the same session header on one backend.
	Session SessionConfig `mapstructure:"session"`
	// ConsistentHash tunes the consistent-hash preset.
	ConsistentHash ConsistentHashConfig `mapstructure:"consistent_hash"`
	// SGLang tunes the sglang-cache-aware preset.
	SGLang SGLangConfig `mapstructure:"sglang"`
	// Passive is passive health: ejection on failed requests and TTFT
	// outliers (passive.go).
	Passive PassiveConfig `mapstructure:"passive"`
	// PD is disaggregated prefill/decode: when a request takes a prefill
	// leg on a prefill server before its decode (role.go).
	PD PDConfig `mapstructure:"pd"`
}

// TTFTConfig tunes the ttft policy. Six fields are knobs, read from
// config.yaml: PrefillRate, LoRALoadDelay, LoRASlotWait, CopyMargin,
// StepTokens and DefaultMaxTokens. The others are fixed at
// [DefaultConfig]'s values, which need no tuning (docs/design/ablation.md);
// the benchmark's ablations change them. A backend's learned rate and base
// replace PrefillRate and BaseLatency once it has answered a few requests.
type TTFTConfig struct {
	// PrefillRate is the prefill throughput assumed, in tokens per second,
	// until a backend's own is learned from the times to first token the
	// proxy measures. (default 10000: an 8B model on one H100 prefills
	// well above that; slower GPUs are learned)
	PrefillRate float64 `mapstructure:"prefill_rate"`
	// BaseLatency is the fixed part of a first token's time assumed until
	// learned (scheduling, one decode step, the network). (default 20ms)
	BaseLatency time.Duration `mapstructure:"-"`
	// KVSoft is the KV-cache use, 0..1, above which a backend is penalised
	// in proportion, up to KVPenalty at full. (default 0.5)
	KVSoft float64 `mapstructure:"-"`
	// KVPenalty is the time added for a full KV cache, and again when this
	// request's tokens do not fit in what is free (it would wait or preempt
	// others). (default 1s)
	KVPenalty time.Duration `mapstructure:"-"`
	// LoRALoadDelay is the time to load an adapter into a free slot: a
	// copy from host memory, tens of milliseconds for a rank-16 adapter of
	// an 8B model. (default 25ms)
	LoRALoadDelay time.Duration `mapstructure:"lora_load_delay"`
	// LoRASlotWait is the time a request waits for an adapter slot on a
	// backend where requests for its adapter already wait; twice that
	// where every slot holds another adapter. A slot frees only when the
	// requests of the adapter in it have all finished, so this is of the
	// order of a request's decode, not of a load. A free slot for an
	// adapter another backend runs costs LoRALoadDelay plus this times the
	// share of backends whose slots are all in use: such a copy keeps a
	// slot the next adapter may wait for. (default 500ms)
	LoRASlotWait time.Duration `mapstructure:"lora_slot_wait"`
	// TieTolerance makes estimates within this fraction of the best a tie,
	// broken by a hash of the prompt's first block and the backend, so that
	// balancer replicas that do not share state choose alike. (default 0.05)
	TieTolerance float64 `mapstructure:"-"`
	// CopyMargin is how much cheaper a backend holding less of a prompt
	// than another must be to take it: a copy fills a second cache while
	// the prompt's requests keep coming. A new prompt goes by rendezvous
	// hash among the backends whose class is within this fraction of the
	// fastest ([TTFTPicker.place]). (default 0.5)
	CopyMargin float64 `mapstructure:"copy_margin"`
	// ColdRoom is the share of the most KV tokens free among a cold
	// request's tied candidates (at the last scrape) that a candidate
	// needs to be chosen: new prompts go where the cache has room, and
	// the rendezvous hash chooses among those. 0 leaves it to the hash
	// alone. (default 0.5)
	ColdRoom float64 `mapstructure:"-"`
	// ColdBacklog bounds the work a backend may have queued, as a share
	// of the cold prompt's first token time on the fastest idle backend,
	// for it to take the prompt by rendezvous hash among the backends as
	// fast as the fastest (see [TTFTPicker]). Replicas then place a new
	// prompt alike as long as the loads they see are under the bound,
	// however much they differ below it. 0 turns it off: the tie window
	// alone decides. (default 1)
	ColdBacklog float64 `mapstructure:"-"`
	// Replicated says other balancers route to the same backends without
	// sharing this one's state (cluster.stateless_replicas): new prompts
	// and conversations are then placed by a hash every replica computes
	// alike, rather than where this balancer's own view of load and cache
	// says ([TTFTPicker.place]). (default false: one balancer alone)
	Replicated bool `mapstructure:"-"`
	// MissWeight scales what a candidate's uncached tokens cost the
	// requests that share its GPU (TTFTScorer): 1 counts each such request
	// once, 0 scores each request by its own first token time alone.
	// (default 1)
	MissWeight float64 `mapstructure:"-"`
	// StepTokens is the prompt tokens a backend prefills in one engine
	// step (vLLM's max_num_batched_tokens, SGLang's chunked_prefill_size,
	// TensorRT-LLM's max_num_tokens). The miss cost charges each request
	// queued on a backend at most one step of a new prompt's prefill,
	// since the scheduler serves the queue in order and the queued
	// requests are ahead of it (TTFTScorer). (default 8192, vLLM's
	// OpenAI-server default on GPUs with at least 70 GiB:
	// EngineArgs.get_batch_defaults)
	StepTokens int `mapstructure:"step_tokens"`
	// DefaultMaxTokens is the decode length assumed for a request that sets
	// no max_tokens, for KV accounting. (default 256)
	DefaultMaxTokens int `mapstructure:"default_max_tokens"`
	// DecodeCost is what one more running request costs each decode step of
	// a backend: the estimate adds DecodeCost × running requests × the
	// request's output tokens, the time its decode loses to a busier batch,
	// so that a backend holding the prompt is not piled on until its
	// batch is slow. 0 makes the estimate time to first token alone.
	// (default 50µs, about a third of what a running request with a few
	// thousand tokens of context costs a step on an H100 with an 8B model)
	DecodeCost time.Duration `mapstructure:"-"`
	// Off turns rules of the policy off for an ablation in the benchmark
	// ([Config.Without]); config files cannot set it, since a rule off is
	// an experiment, not a setting. Zero leaves every rule on.
	Off Rules `mapstructure:"-"`
}

// SaturationConfig says when a backend is saturated, for the presets that
// have llmlb's saturation filter and admission queue ([Preset.Admission]:
// ttft): the queue it reports
// or its KV use is at a threshold, counting what the balancer sent since
// the last scrape. A backend that reports no queue (no metrics, or an
// engine without the signal) is not saturated by queue: our own requests
// pending there may all be prefilling on a server with room. A backend whose metrics are stale is passed over while any has
// fresh ones; when all are stale they are used on load alone rather than
// not at all.
type SaturationConfig struct {
	// Queue is the waiting-request count at which a backend is saturated;
	// 0 disables the check. (default 16)
	Queue int `mapstructure:"queue"`
	// KV is the KV-cache use, 0..1, at which a backend is saturated; 0
	// disables the check. (default 0.95)
	KV float64 `mapstructure:"kv"`
	// KeepHolders keeps a saturated backend that holds part of the
	// request's prompt among the candidates, for the scorer to weigh its
	// queue against what a miss elsewhere costs: under overload, dropping
	// the holders sends every request to a server that must prefill it
	// all, and the misses' prefill is what overloads the fleet.
	// (default true)
	KeepHolders bool `mapstructure:"-"`
	// HolderQueue bounds KeepHolders: a holder whose queue is past this
	// many times the shortest queue among the candidates (or Queue, if
	// more) is saturated like any other; 0 keeps holders whatever their
	// queue, as does Queue 0. (default 4)
	HolderQueue float64 `mapstructure:"-"`
	// LoadFactor and LoadSlack bound the requests in flight on one backend
	// (running and queued) to LoadFactor times the candidates' mean plus
	// LoadSlack: a backend past the bound is passed over while another is
	// within it, holders of the prompt too. LoadFactor 0 turns the bound
	// off. (default 2 and 8)
	LoadFactor float64 `mapstructure:"-"`
	LoadSlack  float64 `mapstructure:"-"`
}

// AdmissionConfig is the bounded queue inside the balancer.
type AdmissionConfig struct {
	// MaxQueue is how many requests may wait; a request that finds it full
	// gets 429. 0 disables queueing: when every backend is saturated the
	// least loaded one gets the request anyway. (default 1024)
	MaxQueue int `mapstructure:"max_queue"`
	// Timeout is the longest a request waits; past it, 503. (default 30s)
	Timeout time.Duration `mapstructure:"timeout"`
	// PriorityHeader carries a request's priority, an integer: higher is
	// served first, negative is sheddable (refused with 429 as the queue
	// fills: ShedAt). Models may set a default priority.
	// (default X-Llmlb-Priority)
	PriorityHeader string `mapstructure:"priority_header"`
	// Fairness orders the waiting requests of one priority by tenant
	// ([Request.Tenant]), so that one tenant's burst does not hold back
	// another's requests: round-robin gives the waiting tenants one
	// admission each in turn; tokens admits the tenant with the least
	// weighted tokens admitted (prompt tokens plus twice max_tokens, or
	// ttft.default_max_tokens when unset), a virtual token counter as in
	// VTC; off is FIFO, tenants ignored. Each tenant's own requests stay
	// FIFO. (default round-robin)
	Fairness string `mapstructure:"fairness"`
	// ShedAt is the queue length, as a share of MaxQueue (0..1), at which
	// a sheddable request (negative priority) that meets saturation is
	// always refused (429); below it, one is refused with probability
	// length / (ShedAt × MaxQueue). Sheddable traffic thins as the queue
	// fills and holds at most this share of it. 0 refuses sheddable
	// requests at once whenever every backend is saturated. (default 0.5)
	ShedAt float64 `mapstructure:"shed_at"`
	// TenantHeader names the request header whose value is the tenant for
	// Fairness when no API keys are configured; empty makes every request
	// one anonymous tenant. With keys the key's name is the tenant and the
	// header is ignored: a client is not trusted to choose its share.
	// (default "")
	TenantHeader string `mapstructure:"tenant_header"`
	// EvictAfter turns eviction on: a request of priority 0 or more that
	// has waited this long in the queue ends the sheddable request in
	// flight (negative priority) of lowest priority, newest first among
	// equals, on a backend that could serve it, and again each time it
	// waits this long more. The evicted request's client gets an error in
	// its API's shape (an error event mid-stream, else a 429), and its
	// backend request is cancelled. Must be below Timeout. 0 is off.
	// (default 0)
	EvictAfter time.Duration `mapstructure:"evict_after"`
}

// SessionConfig is session affinity.
type SessionConfig struct {
	// Header names the request header whose value identifies a session;
	// empty disables affinity. A session stays on the backend that served
	// it unless that backend is saturated or gone. (default "")
	Header string `mapstructure:"header"`
	// MaxSessions bounds the sessions remembered, least recently used
	// forgotten first. (default 65536)
	MaxSessions int `mapstructure:"max_sessions"`
}

// ConsistentHashConfig tunes the consistent-hash preset.
type ConsistentHashConfig struct {
	// PrefixBytes is how many leading bytes of the first user message (or
	// the prompt) are hashed with the model name. (default 100, KubeAI's)
	PrefixBytes int `mapstructure:"prefix_bytes"`
	// LoadFactor bounds a backend's in-flight requests to this multiple of
	// the average before the ring walks on. (default 1.25)
	LoadFactor float64 `mapstructure:"load_factor"`
	// VirtualNodes is each backend's points on the ring. (default 256,
	// KubeAI's)
	VirtualNodes int `mapstructure:"virtual_nodes"`
}

// SGLangConfig tunes the sglang-cache-aware preset; the defaults are
// sglang-router's command-line defaults.
type SGLangConfig struct {
	// CacheThreshold is the prefix match ratio above which the best match
	// wins. (default 0.3)
	CacheThreshold float64 `mapstructure:"cache_threshold"`
	// BalanceAbsThreshold and BalanceRelThreshold: the load is imbalanced
	// when max-min exceeds the first and max exceeds the second times min.
	// (default 64 and 1.5)
	BalanceAbsThreshold int     `mapstructure:"balance_abs_threshold"`
	BalanceRelThreshold float64 `mapstructure:"balance_rel_threshold"`
	// MaxTreeBytes bounds each backend's share of the prefix tree.
	// (default 67108864)
	MaxTreeBytes int `mapstructure:"max_tree_bytes"`
}

// ModelRoute is one entry of `models:`: a public model name and where its
// requests go.
type ModelRoute struct {
	// Name is the model name clients send.
	Name string `mapstructure:"name"`
	// Targets are the model names backends serve, with weights; a request
	// goes to one of them with probability weight/sum. One target is an
	// alias.
	Targets []ModelTarget `mapstructure:"targets"`
	// Priority is the admission priority of the model's requests when they
	// carry no priority header. (default 0)
	Priority int `mapstructure:"priority"`
	// SLOTTFT and SLOTPOT are the deadlines of the model's requests that
	// set none (x-slo-ttft-ms, x-slo-tpot-ms) and whose key sets none: to
	// the first token, and per later token; 0 is none, at most a day.
	// (default 0)
	SLOTTFT time.Duration `mapstructure:"slo_ttft"`
	SLOTPOT time.Duration `mapstructure:"slo_tpot"`
}

// MaxDeadline bounds a deadline, from config or a header: a day.
const MaxDeadline = 24 * time.Hour

// ModelTarget is a target model and its weight.
type ModelTarget struct {
	Model  string  `mapstructure:"model"`
	Weight float64 `mapstructure:"weight"`
}

// DefaultConfig returns the balancer defaults.
func DefaultConfig() Config {
	return Config{
		Policy:        "ttft",
		MaxCandidates: 3,
		TTFT: TTFTConfig{
			PrefillRate:      10000,
			BaseLatency:      20 * time.Millisecond,
			KVSoft:           0.5,
			KVPenalty:        time.Second,
			LoRALoadDelay:    25 * time.Millisecond,
			LoRASlotWait:     500 * time.Millisecond,
			TieTolerance:     0.05,
			CopyMargin:       0.5,
			ColdRoom:         0.5,
			ColdBacklog:      1,
			MissWeight:       1,
			StepTokens:       8192,
			DefaultMaxTokens: 256,
			DecodeCost:       50 * time.Microsecond,
		},
		Saturation:     SaturationConfig{Queue: 16, KV: 0.95, KeepHolders: true, HolderQueue: 4, LoadFactor: 2, LoadSlack: 8},
		Admission:      AdmissionConfig{MaxQueue: 1024, Timeout: 30 * time.Second, PriorityHeader: "X-Llmlb-Priority", Fairness: FairRoundRobin, ShedAt: 0.5},
		Session:        SessionConfig{MaxSessions: 65536},
		ConsistentHash: ConsistentHashConfig{PrefixBytes: 100, LoadFactor: 1.25, VirtualNodes: 256},
		SGLang:         SGLangConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, MaxTreeBytes: 1 << 26},
		Passive:        DefaultPassiveConfig(),
		PD:             PDConfig{MinUncachedTokens: 256},
	}
}

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("balancer."+field+": "+format, args...))
	}
	if !slices.Contains(PolicyNames(), c.Policy) {
		bad("policy", "unknown policy %q (known: %s)", c.Policy, strings.Join(PolicyNames(), ", "))
	}
	c.Passive.validate(bad)
	if c.PD.MinUncachedTokens < 0 {
		bad("pd.min_uncached_tokens", "must not be negative, got %d", c.PD.MinUncachedTokens)
	}
	if !(c.PD.MinUncachedRatio >= 0 && c.PD.MinUncachedRatio <= 1) {
		bad("pd.min_uncached_ratio", "must be from 0 to 1, got %g", c.PD.MinUncachedRatio)
	}
	t := c.TTFT
	if t.PrefillRate <= 0 {
		bad("ttft.prefill_rate", "must be positive, got %g", t.PrefillRate)
	}
	if t.LoRALoadDelay < 0 {
		bad("ttft.lora_load_delay", "must not be negative, got %s", t.LoRALoadDelay)
	}
	if t.LoRASlotWait < 0 {
		bad("ttft.lora_slot_wait", "must not be negative, got %s", t.LoRASlotWait)
	}
	if t.CopyMargin < 0 || t.CopyMargin >= 1 {
		bad("ttft.copy_margin", "must be in [0, 1), got %g", t.CopyMargin)
	}
	if t.StepTokens < 1 {
		bad("ttft.step_tokens", "must be positive, got %d", t.StepTokens)
	}
	if t.DefaultMaxTokens < 1 {
		bad("ttft.default_max_tokens", "must be at least 1, got %d", t.DefaultMaxTokens)
	}
	if c.Saturation.Queue < 0 {
		bad("saturation.queue", "must not be negative, got %d", c.Saturation.Queue)
	}
	if c.Saturation.KV < 0 || c.Saturation.KV > 1 {
		bad("saturation.kv", "must be in [0, 1], got %g", c.Saturation.KV)
	}
	if c.Admission.MaxQueue < 0 {
		bad("admission.max_queue", "must not be negative, got %d", c.Admission.MaxQueue)
	}
	if c.Admission.Timeout <= 0 {
		bad("admission.timeout", "must be positive, got %s", c.Admission.Timeout)
	}
	if c.Admission.PriorityHeader == "" {
		bad("admission.priority_header", "must not be empty")
	}
	if !slices.Contains(FairnessNames(), c.Admission.Fairness) {
		bad("admission.fairness", "unknown rule %q (known: %s)", c.Admission.Fairness, strings.Join(FairnessNames(), ", "))
	}
	if c.Admission.ShedAt < 0 || c.Admission.ShedAt > 1 {
		bad("admission.shed_at", "must be in [0, 1], got %g", c.Admission.ShedAt)
	}
	switch e := c.Admission.EvictAfter; {
	case e < 0:
		bad("admission.evict_after", "must not be negative (0 is off), got %s", e)
	case e > 0 && e >= c.Admission.Timeout:
		bad("admission.evict_after", "must be below admission.timeout (%s), which no request waits past, or 0 (off); got %s", c.Admission.Timeout, e)
	case e > 0 && c.Admission.MaxQueue == 0:
		bad("admission.evict_after", "needs admission.max_queue above 0: no request waits with the queue off, got %s", e)
	case e > 0:
		if pr, err := LookupPreset(c.Policy); err == nil && !pr.Admission {
			bad("admission.evict_after", "policy %q has no admission queue, so no request waits to evict, got %s", c.Policy, e)
		}
	}
	if c.Session.MaxSessions < 1 {
		bad("session.max_sessions", "must be at least 1, got %d", c.Session.MaxSessions)
	}
	if c.ConsistentHash.PrefixBytes < 1 {
		bad("consistent_hash.prefix_bytes", "must be at least 1, got %d", c.ConsistentHash.PrefixBytes)
	}
	if c.ConsistentHash.LoadFactor < 1 {
		bad("consistent_hash.load_factor", "must be at least 1, got %g", c.ConsistentHash.LoadFactor)
	}
	if c.ConsistentHash.VirtualNodes < 1 {
		bad("consistent_hash.virtual_nodes", "must be at least 1, got %d", c.ConsistentHash.VirtualNodes)
	}
	if s := c.SGLang; s.CacheThreshold < 0 || s.CacheThreshold > 1 {
		bad("sglang.cache_threshold", "must be in [0, 1], got %g", s.CacheThreshold)
	}
	if c.SGLang.BalanceAbsThreshold < 0 {
		bad("sglang.balance_abs_threshold", "must not be negative, got %d", c.SGLang.BalanceAbsThreshold)
	}
	if c.SGLang.BalanceRelThreshold < 1 {
		bad("sglang.balance_rel_threshold", "must be at least 1, got %g", c.SGLang.BalanceRelThreshold)
	}
	if c.SGLang.MaxTreeBytes < 0 {
		bad("sglang.max_tree_bytes", "must not be negative, got %d", c.SGLang.MaxTreeBytes)
	}
	return errors.Join(errs...)
}

// ValidateModels checks the `models:` section.
func ValidateModels(routes []ModelRoute) error {
	var errs []error
	seen := map[string]bool{}
	for i, r := range routes {
		at := fmt.Sprintf("models[%d]", i)
		if r.Name == "" {
			errs = append(errs, fmt.Errorf("%s.name: must not be empty", at))
		} else if seen[r.Name] {
			errs = append(errs, fmt.Errorf("%s.name: %q is listed twice", at, r.Name))
		}
		seen[r.Name] = true
		if len(r.Targets) == 0 {
			errs = append(errs, fmt.Errorf("%s.targets: at least one target is required", at))
		}
		sum := 0.0
		for j, t := range r.Targets {
			if t.Model == "" {
				errs = append(errs, fmt.Errorf("%s.targets[%d].model: must not be empty", at, j))
			}
			if t.Weight < 0 {
				errs = append(errs, fmt.Errorf("%s.targets[%d].weight: must not be negative, got %g", at, j, t.Weight))
			}
			sum += t.Weight
		}
		if len(r.Targets) > 1 && sum <= 0 {
			errs = append(errs, fmt.Errorf("%s.targets: weights must not all be 0", at))
		}
		for _, d := range []struct {
			key string
			v   time.Duration
		}{{"slo_ttft", r.SLOTTFT}, {"slo_tpot", r.SLOTPOT}} {
			if d.v < 0 || d.v > MaxDeadline {
				errs = append(errs, fmt.Errorf("%s.%s: must be 0 (none) to 24h, got %s", at, d.key, d.v))
			}
		}
	}
	return errors.Join(errs...)
}
