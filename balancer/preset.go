package balancer

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// Preset is what one policy name means, defined once for `llmlb serve` and
// `llmlb bench` alike: its scorers and picker (built by [New]), the prefix
// index it matches with, how often the peer it follows reads its servers'
// metrics, and whether llmlb's saturation filter and admission queue stand
// in front of it. A peer that has neither runs without them, as it does in
// production.
type Preset struct {
	Name string
	// Index says how the preset's approximate prefix index cuts prompts and
	// how much it remembers; nil means the preset matches no blocks.
	Index *IndexSpec
	// Tree: the preset matches prompt text in a character radix tree
	// (sglang-cache-aware).
	Tree bool
	// TrueCache: the preset's prefix match is what each server's cache
	// really holds (llm-d's KV-event index, or llmlb's scorer fed the
	// truth). Only the simulator can tell it, so serve refuses the preset.
	TrueCache bool
	// BenchOnly: the preset reproduces a published experiment's router as
	// it was then configured, for `llmlb bench --scenario` (whose
	// experiments name it), not for serve.
	BenchOnly bool
	// Unlisted: serve does not offer the preset yet ([PolicyNames] leaves
	// it out, and config.yaml's list of policies need not name it),
	// though the benchmark runs it with the others. Dropping it offers
	// the preset to serve, once config.yaml and docs/configuration.md
	// describe it.
	Unlisted bool
	// ScrapeInterval is the peer's metrics refresh; 0 keeps scrape.interval.
	ScrapeInterval time.Duration
	// Admission: llmlb's saturation filter and admission queue apply.
	Admission bool
	// FollowsStored: the preset is llmlb's own, so a stored follow-up
	// (a Responses request naming its previous response) goes to the
	// server storing that response whatever the policy says
	// ([Request.Holder]). A peer's preset stands for the peer deployed on
	// its own, which routes a follow-up by its policy on the body it sees,
	// the new input alone; the server it picks answers 404 unless it is
	// the one storing the response. `llmlb serve` pins follow-ups under
	// every preset, so only the benchmark reads this.
	FollowsStored bool
	// UserKeyed: the preset keys requests on the first user message
	// ([Request.UserText]), or on the prompt's bytes when a request has
	// none, so the proxy fills UserText for a chat and passes the prompt
	// whole, never in parts ([Balancer.PromptInParts]).
	UserKeyed bool
	// Follows cites the code the preset follows: repository, file and
	// commit.
	Follows string

	// build returns the preset's scorers and picker, once per balancer,
	// so that they may keep state for its life.
	build func(cfg Config, d Deps) *policy
}

// IndexSpec sizes a preset's approximate prefix index.
type IndexSpec struct {
	// Own: the index is llmlb's own, configured by the `prefix:` section;
	// the fields below are then unused.
	Own bool
	// BlockBytes is the bytes of canonical prompt a block covers.
	BlockBytes int
	// MaxBlocks caps the blocks matched per prompt.
	MaxBlocks int
	// Partial: a trailing block shorter than BlockBytes is hashed too.
	Partial bool
	// EntriesPerEngineBlock: each server's LRU holds as many entries as
	// the server reports KV blocks (the endpoint picker's autoTune),
	// whatever the block sizes.
	EntriesPerEngineBlock bool
	// HeadFirst: a prompt's blocks are marked used in order, so its first
	// block is evicted first (the endpoint picker's indexer).
	HeadFirst bool
	// Entries is the LRU size per server until the server reports its KV
	// blocks.
	Entries int
	// FixedEntries: each server's LRU holds Entries whatever KV capacity
	// the server reports.
	FixedEntries bool
	// TTL forgets a block this long after it was last sent; 0 never.
	TTL time.Duration
}

// eppIndex is the endpoint picker's approximate prefix index: 64-token
// blocks at 4 bytes a token (the picker's own figure, not llmlb's), the
// trailing partial block hashed, and an LRU per server of as many entries
// as the server has KV blocks (llm-d/llm-d-router pkg/epp/.../approximateprefix types.go:115 and
// plugin.go:303-313 at ebab6879), which adds a prompt's blocks to it in
// order (indexer.go Add).
func eppIndex(maxTokens int) *IndexSpec {
	const blockTokens = 64
	return &IndexSpec{BlockBytes: blockTokens * 4, MaxBlocks: maxTokens / blockTokens, Partial: true,
		EntriesPerEngineBlock: true, Entries: 31250, HeadFirst: true}
}

// presets are every policy name, the default first.
var presets = []Preset{
	{
		Name: "ttft", Index: &IndexSpec{Own: true}, Admission: true, FollowsStored: true,
		Follows: "llmlb's own: estimated time to first token ([TTFTScorer])",
		build:   func(cfg Config, d Deps) *policy { return ttftPolicy(cfg.TTFT) },
	},
	{
		Name: "ttft-true-cache", TrueCache: true, Admission: true, FollowsStored: true,
		Follows: "llmlb's ttft policy fed what each server's cache really holds, to measure the index's error; not a bound",
		build:   func(cfg Config, d Deps) *policy { return ttftPolicy(cfg.TTFT) },
	},
	{
		Name:    "round-robin",
		Follows: "nginx's default round-robin, unweighted (nginx/nginx src/http/ngx_http_upstream_round_robin.c at 8f3dfde7), with no queue of its own",
		build: func(cfg Config, d Deps) *policy {
			return &policy{picker: new(RoundRobinPicker)}
		},
	},
	{
		Name:    "random",
		Follows: "the SGLang model gateway's random policy: uniform over healthy workers (smg-project/smg model_gateway/src/policies/random.rs at 50899277)",
		build:   func(cfg Config, d Deps) *policy { return &policy{picker: &RandomPicker{rand: d.Rand}} },
	},
	{
		Name:    "least-request",
		Follows: "nginx's least_conn, unweighted (nginx/nginx src/http/modules/ngx_http_upstream_least_conn_module.c at dc0e4989)",
		build:   func(cfg Config, d Deps) *policy { return &policy{picker: LeastRequestPicker{}} },
	},
	{
		Name:    "power-of-two",
		Follows: "grpc-go's least-request balancer with choiceCount 2 (grpc/grpc-go balancer/leastrequest/leastrequest.go at d49b2141)",
		build: func(cfg Config, d Deps) *policy {
			return &policy{picker: &PowerOfTwoPicker{rand: d.Rand}}
		},
	},
	{
		// The endpoint picker's default profile: no flow control (off by
		// default, cmd/epp/runner/runner.go:754) and no saturation filter
		// in the profile, so prefix weight 3 over queue weight 2 keeps a
		// hot prefix on one server however long its queue.
		Name: "epp", Index: eppIndex(131072), ScrapeInterval: 50 * time.Millisecond,
		Follows: "llm-d/llm-d-router at ebab6879: default profile (pkg/epp/config/loader/defaults.go:47-91) queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score-picker; approximateprefix plugin types.go:115, plugin.go:303-313",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{QueueScorer{}, 2}, {KVScorer{}, 2}, {PrefixScorer{}, 3}}, picker: &MaxScorePicker{rand: d.Rand}}
		},
	},
	{
		// llm-d's precise prefix-cache profile: the index is fed by the
		// engines' KV events (ZMQ), so it knows what each server holds, a
		// moment late.
		Name: "llm-d-precise", TrueCache: true, ScrapeInterval: 50 * time.Millisecond,
		Follows: "llm-d/llm-d guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml at 955190d9: precise-prefix-cache-scorer 2, kv-cache-utilization-scorer 1, queue-scorer 1, max-score-picker",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{PrefixScorer{}, 2}, {KVScorer{}, 1}, {QueueScorer{}, 1}}, picker: &MaxScorePicker{rand: d.Rand}}
		},
	},
	{
		Name: "llm-d-load", Index: eppIndex(100000), ScrapeInterval: 50 * time.Millisecond,
		Follows: "llm-d/llm-d-router test/perf/config/router-configs/optimized-baseline.yaml at ebab6879: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3 (100,000-token match cap), no-hit-lru-scorer 2, max-score-picker",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{QueueScorer{}, 2}, {KVScorer{}, 2}, {PrefixScorer{}, 3}, {new(NoHitLRUScorer), 2}},
				picker: &MaxScorePicker{rand: d.Rand}}
		},
	},
	{
		// llm-d's "sticky until saturated", which its guides now deploy
		// (llm-d.ai blog, 2026-08-17): no saturation filter, no queue.
		Name: "llm-d-optimized", Index: eppIndex(131072), ScrapeInterval: 50 * time.Millisecond,
		Follows: "llm-d/llm-d guides/optimized-baseline/router/optimized-baseline.values.yaml (prefix-cache-affinity-filter, token-load-scorer, built-in defaults) on llm-d/llm-d-router at ebab6879: " +
			"filter/prefixcacheaffinity/plugin.go (affinityThreshold 0.8, maxTTFTPenaltyMs 18000, peakPrefillThroughput 15928, explorationProbability 0), " +
			"dataproducer/inflightload/producer.go (uncached prompt tokens until the first chunk), scorer/tokenload/token_load.go (queueThresholdTokens 4194304), " +
			"max-score picker added by config/loader/defaults.go; llm-d/llm-d.github.io blog/2026-08-17_bottleneck-aware-scheduling-for-llm-inference.mdx at 25e593b2",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{TokenLoadScorer{}, 1}}, picker: &PrefixAffinityPicker{rand: d.Rand}}
		},
	},
	{
		// llm-d's predicted-latency profile, the one that reads
		// x-slo-ttft-ms: its SLO headroom tier filter and latency SLO
		// admitter on llmlb's TTFT estimate in place of llm-d's trained
		// predictor ([SLOHeadroomPicker], [SLOAdmitter]); no flow control.
		Name: "llm-d-slo", Index: eppIndex(131072), ScrapeInterval: 50 * time.Millisecond, Unlisted: true,
		Follows: "llm-d/llm-d-router at ebab6879: config/charts/routerlib/templates/_config.yaml (latencyPredictor.enabled profile: strict prefix-cache-affinity-filter 0.99, slo-headroom-tier-filter, loose prefix-cache-affinity-filter 0.80, both maxTTFTPenaltyMs 5000 with ttftSource latencyPredictor, latency-scorer, weighted-random-picker, latency-slo-admitter); " +
			"scheduling/filter/sloheadroomtier/plugin.go (epsilonExploreNeg 0.01), requestcontrol/admitter/latencyslo/plugin.go, scheduling/scorer/latency/plugin.go (strategy least, wMax 100), " +
			"requestcontrol/dataproducer/predictedlatency/prediction.go (TPOT headroom 0 when not streaming), under pkg/epp/framework/plugins/",
		build: func(cfg Config, d Deps) *policy {
			est := TTFTScorer{cfg: cfg.TTFT}
			return &policy{scorers: []weighted{{&SLOAdmitter{est: est, now: d.Now}, 1}}, picker: &SLOHeadroomPicker{est: est, now: d.Now, rand: d.Rand}}
		},
	},
	{
		// NVIDIA Dynamo's KV router without KV events (--no-router-kv-events):
		// it matches prompts against its own routing decisions, 16-token
		// blocks (vLLM's), full blocks only, each forgotten 120 s after it
		// was last sent (router_ttl_secs). Its tree is pruned at 2^20
		// blocks in all; here that bounds each server's LRU. Its router
		// queue is off by default.
		Name: "dynamo-kv", Index: &IndexSpec{BlockBytes: 16 * 4, MaxBlocks: 131072 / 16, Entries: 1 << 20, FixedEntries: true, TTL: 120 * time.Second},
		Follows: "ai-dynamo/dynamo lib/llm/src/kv_router/scheduler.rs DefaultWorkerSelector at db19bd2a (overlap_score_weight 1, router_temperature 0, ties by tree size then random), " +
			"lib/llm/src/kv_router/sequence.rs ActiveSequences at 581ee33e, lib/llm/src/kv_router/approx.rs at 17cf2360; " +
			"docs/components/router/router-configuration.md at 057096c3 (router_ttl_secs 120 without KV events, queue off by default)",
		build: func(cfg Config, d Deps) *policy {
			return &policy{picker: &DynamoPicker{index: d.Index, rand: d.Rand}}
		},
	},
	{
		Name: "sglang-cache-aware", Tree: true,
		Follows: "the SGLang model gateway's cache_aware (smg-project/smg model_gateway/src/policies/cache_aware.rs at f8daa883; sglang PR #14650, 2025-12-08: a miss goes to the least loaded worker)",
		build: func(cfg Config, d Deps) *policy {
			return &policy{tree: d.Tree, picker: &SGLangPicker{cfg: cfg.SGLang, tree: d.Tree, rand: d.Rand}}
		},
	},
	{
		Name: "sglang-v04-cache-aware", Tree: true, BenchOnly: true,
		Follows: "sglang-router as SGLang v0.4 shipped it (lmsys.org/blog/2024-12-04-sglang-v0-4): cache_threshold 0.5, balance_abs_threshold 32, balance_rel_threshold 1.0001, a miss to the smallest tree",
		build: func(cfg Config, d Deps) *policy {
			c := cfg.SGLang
			c.CacheThreshold, c.BalanceAbsThreshold, c.BalanceRelThreshold = 0.5, 32, 1.0001
			return &policy{tree: d.Tree, picker: &SGLangPicker{cfg: c, tree: d.Tree, rand: d.Rand, legacy: true}}
		},
	},
	{
		// llm-d's "KV-cache wins you can see" as it ran (73-capacity
		// README at d070ea60): the endpoint picker's prefix scorer of
		// the time (64-byte blocks, at most 256, 31,250 entries a server)
		// with the queue and KV scorers, each weight 1.
		Name: "llm-d-2025-approximate", Index: &IndexSpec{BlockBytes: 64, MaxBlocks: 256, Entries: 31250, HeadFirst: true}, ScrapeInterval: 50 * time.Millisecond,
		BenchOnly: true,
		Follows:   "llm-d/llm-d-kv-cache-manager benchmarking/73-capacity/README.md at d070ea60: estimated-scheduling, prefix 1, kv 1, queue 1",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{PrefixScorer{}, 1}, {KVScorer{}, 1}, {QueueScorer{}, 1}}, picker: &MaxScorePicker{rand: d.Rand}}
		},
	},
	{
		Name: "llm-d-2025-precise", TrueCache: true, ScrapeInterval: 50 * time.Millisecond, BenchOnly: true,
		Follows: "llm-d/llm-d-kv-cache-manager benchmarking/73-capacity/README.md at d070ea60: precise-scheduling, prefix (KV events) 3, kv 2, queue 2",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{PrefixScorer{}, 3}, {KVScorer{}, 2}, {QueueScorer{}, 2}}, picker: &MaxScorePicker{rand: d.Rand}}
		},
	},
	{
		Name: "llm-d-2025-load", ScrapeInterval: 50 * time.Millisecond, BenchOnly: true,
		Follows: "llm-d/llm-d-kv-cache-manager benchmarking/73-capacity/README.md at d070ea60: load-scheduling, queue 1, kv 1",
		build: func(cfg Config, d Deps) *policy {
			return &policy{scorers: []weighted{{QueueScorer{}, 1}, {KVScorer{}, 1}}, picker: &MaxScorePicker{rand: d.Rand}}
		},
	},
	{
		Name: "consistent-hash", UserKeyed: true,
		Follows: "KubeAI's CHWBL (kubeai-project/kubeai internal/loadbalancer and api/openai/v1/chat_completions.go at f442a2cd)",
		build: func(cfg Config, d Deps) *policy {
			return &policy{picker: &RingPicker{cfg: cfg.ConsistentHash}}
		},
	},
}

// Presets returns every preset, the default first.
func Presets() []Preset { return slices.Clone(presets) }

// LookupPreset returns the preset of a policy name; "" is the default.
func LookupPreset(name string) (Preset, error) {
	if name == "" {
		return presets[0], nil
	}
	for _, p := range presets {
		if p.Name == name {
			return p, nil
		}
	}
	return Preset{}, fmt.Errorf("unknown policy %q (have %v)", name, PolicyNames())
}

// PolicyNames returns the policy names config accepts, the default first:
// every preset `llmlb serve` can run (not those that need the simulator's
// true caches, reproduce an experiment, or are [Preset.Unlisted]).
func PolicyNames() []string {
	var out []string
	for _, p := range presets {
		if !p.TrueCache && !p.BenchOnly && !p.Unlisted {
			out = append(out, p.Name)
		}
	}
	return out
}

// newPolicy builds cfg's preset, once per balancer: the policy's scorers
// and picker keep their state (a round-robin position, a ring, an LRU)
// for the balancer's life.
func newPolicy(cfg Config, d Deps) (*policy, error) {
	pr, err := LookupPreset(cfg.Policy)
	if err != nil {
		return nil, err
	}
	switch {
	case pr.TrueCache && d.Oracle == nil:
		return nil, fmt.Errorf("policy %s: needs each server's true cache, which only the simulator has", pr.Name)
	case pr.Tree && d.Tree == nil:
		return nil, fmt.Errorf("policy %s: needs a prefix tree", pr.Name)
	}
	pol := pr.build(cfg, d)
	pol.name = pr.Name
	pol.admission = pr.Admission
	pol.userKeyed = pr.UserKeyed
	if pr.Index != nil {
		pol.index = d.Index
		pol.sizeIndex = d.Index != nil && !pr.Index.FixedEntries
		pol.learnTokens = d.Index != nil && pr.Index.Own
	}
	if pr.TrueCache {
		pol.oracle = d.Oracle
	} else if pr.Index != nil && pr.Index.Own {
		pol.events = d.Events
	}
	return pol, nil
}

// ScrapeEvery returns how often a backend's metrics are read under p: set
// when the operator chose it (explicit), else the peer's own refresh, so
// that a peer's preset sees loads as often as the peer does, else set.
func (p Preset) ScrapeEvery(set time.Duration, explicit bool) time.Duration {
	if explicit || p.ScrapeInterval <= 0 {
		return set
	}
	return p.ScrapeInterval
}

// IndexConfig returns the configuration of p's prefix index: own, the
// `prefix:` section, for llmlb's own index ([IndexSpec.Own]); the peer's
// sizes otherwise. It is meaningless for a preset with no index.
func (p Preset) IndexConfig(own prefix.Config) prefix.Config {
	s := p.Index
	if s == nil || s.Own {
		return own
	}
	return prefix.Config{BlockBytes: s.BlockBytes, MaxBlocks: s.MaxBlocks, FallbackEntries: s.Entries,
		Partial: s.Partial, EntriesPerEngineBlock: s.EntriesPerEngineBlock, HeadFirst: s.HeadFirst, TTL: s.TTL}
}

// Build returns a balancer running cfg's policy with the prefix index or
// tree its preset needs, made here, the same way for `llmlb serve` and
// the routing benchmark. own is the `prefix:` section, for llmlb's own
// index ([Preset.IndexConfig]); deps supplies the clock, randomness and,
// for presets that need them, the true caches and KV events, and its
// Index and Tree are replaced. The index is returned too (nil when the
// preset has none), for its size metrics.
func Build(cfg Config, own prefix.Config, deps Deps, models []ModelRoute, logger *slog.Logger) (*Balancer, *prefix.Index, error) {
	pr, err := LookupPreset(cfg.Policy)
	if err != nil {
		return nil, nil, err
	}
	var idx *prefix.Index
	deps.Index, deps.Tree = nil, nil
	if pr.Index != nil {
		ic := pr.IndexConfig(own)
		ic.Now = deps.Now // a TTL runs on the balancer's clock, virtual in bench
		idx = prefix.NewIndex(ic)
		deps.Index = idx
	}
	if pr.Tree {
		deps.Tree = prefix.NewTree(cfg.SGLang.MaxTreeBytes)
	}
	b, err := New(cfg, deps, models, logger)
	return b, idx, err
}
