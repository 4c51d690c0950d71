package serve

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// newInstrumentedBalancer builds the balancer for cfg's policy with the prefix index or
// tree its preset needs, and registers the index's size metrics on reg.
func newInstrumentedBalancer(cfg config.Config, kv *kvevents.Store, reg prometheus.Registerer, logger *slog.Logger) (*balancer.Balancer, error) {
	var deps balancer.Deps
	if kv != nil {
		deps.Events = kv
	}
	b, idx, err := NewBalancer(cfg.Balancer, cfg.Prefix, deps, cfg.Models, logger)
	if err != nil {
		return nil, err
	}
	if reg != nil {
		// A preset without a block index reports an empty one.
		stats := func() (int, int64) {
			if idx == nil {
				return 0, 0
			}
			return idx.Stats()
		}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmlb_prefix_index_entries", Help: "Prompt blocks the prefix-cache index remembers, over all backends."},
				func() float64 { n, _ := stats(); return float64(n) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmlb_prefix_index_bytes", Help: "Estimated memory of the prefix-cache index (entries × prefix.EntryBytes)."},
				func() float64 { _, b := stats(); return float64(b) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmlb_prefix_block_bytes", Help: "Bytes of canonical prompt per hashed block (auto-tuned from the engines' cache block size unless set; 0 when the policy keeps no block index)."},
				func() float64 {
					if idx == nil {
						return 0
					}
					return float64(idx.BlockBytes())
				}),
		)
	}
	return b, nil
}

// IndexConfig is the prefix index configuration of preset pr: the
// `prefix:` section for llmlb's own index, the peer's sizes otherwise.
func IndexConfig(pr balancer.Preset, own prefix.Config) prefix.Config {
	s := pr.Index
	if s == nil || s.Own {
		return own
	}
	return prefix.Config{BlockBytes: s.BlockBytes, MaxBlocks: s.MaxBlocks, FallbackEntries: s.Entries,
		Partial: s.Partial, EntriesPerEngineBlock: s.EntriesPerEngineBlock, HeadFirst: s.HeadFirst, TTL: s.TTL}
}

// NewBalancer builds a balancer running cfg's policy, the same way for
// `llmlb serve` and the routing benchmark. deps supplies the
// clock, randomness and, for presets that need it, the true caches; the
// index and tree are made here. The index is returned (nil when the
// preset has none) for its size metrics.
func NewBalancer(cfg balancer.Config, own prefix.Config, deps balancer.Deps, models []balancer.ModelRoute, logger *slog.Logger) (*balancer.Balancer, *prefix.Index, error) {
	pr, err := balancer.LookupPreset(cfg.Policy)
	if err != nil {
		return nil, nil, err
	}
	var idx *prefix.Index
	if pr.Index != nil {
		ic := IndexConfig(pr, own)
		ic.Now = deps.Now // a TTL runs on the balancer's clock, virtual in bench
		idx = prefix.NewIndex(ic)
		deps.Index = idx
	}
	if pr.Tree {
		deps.Tree = prefix.NewTree(cfg.SGLang.MaxTreeBytes)
	}
	b, err := balancer.New(cfg, deps, models, logger)
	return b, idx, err
}
