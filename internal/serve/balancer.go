package serve

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/kvevents"
)

// newInstrumentedBalancer builds the balancer for cfg's policy with the prefix index or
// tree its preset needs ([balancer.Build]), and registers the index's size metrics on reg.
func newInstrumentedBalancer(cfg config.Config, kv *kvevents.Store, reg prometheus.Registerer, logger *slog.Logger) (*balancer.Balancer, error) {
	var deps balancer.Deps
	if kv != nil {
		deps.Events = kv
	}
	bcfg := cfg.Balancer
	bcfg.TTFT.Replicated = cfg.Cluster.Replicated()
	b, idx, err := balancer.Build(bcfg, cfg.Prefix, deps, cfg.Models, logger)
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
