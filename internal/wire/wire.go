package wire

import (
	"log/slog"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
)

// IndexConfig is the prefix index configuration of preset pr: the
// `prefix:` section for llmlb's own index, the peer's sizes otherwise.
func IndexConfig(pr balancer.Preset, own prefix.Config) prefix.Config {
	s := pr.Index
	if s == nil || s.Own {
		return own
	}
	return prefix.Config{BlockBytes: s.BlockBytes, MaxBlocks: s.MaxBlocks, FallbackEntries: s.Entries,
		Partial: s.Partial, EntriesPerEngineBlock: s.EntriesPerEngineBlock, HeadFirst: s.HeadFirst}
}

// Balancer builds a balancer running cfg's policy. deps supplies the
// clock, randomness and, for presets that need it, the true caches; the
// index and tree are made here. The index is returned (nil when the
// preset has none) for its size metrics.
func Balancer(cfg balancer.Config, own prefix.Config, deps balancer.Deps, models []balancer.ModelRoute, logger *slog.Logger) (*balancer.Balancer, *prefix.Index, error) {
	pr, err := balancer.LookupPreset(cfg.Policy)
	if err != nil {
		return nil, nil, err
	}
	var idx *prefix.Index
	if pr.Index != nil {
		idx = prefix.NewIndex(IndexConfig(pr, own))
		deps.Index = idx
	}
	if pr.Tree {
		deps.Tree = prefix.NewTree(cfg.SGLang.MaxTreeBytes)
	}
	b, err := balancer.New(cfg, deps, models, logger)
	return b, idx, err
}
