package balancer

import "slices"

// ModelSaturation is how saturated a model's fleet is now: the mean, over
// the ready backends serving it, of each one's fill toward the saturation
// thresholds, max(queued / saturation.queue, KV use / saturation.kv),
// capped at 1, as a pick counts them. It comes from what the servers
// report, so every replica reads about the same, as an autoscaler needs
// (docs/operations.md#scaling).
type ModelSaturation struct {
	Model string
	Level float64
}

// Saturation returns every served model's [ModelSaturation], by model name.
func (b *Balancer) Saturation() []ModelSaturation {
	sat := b.cfg.Saturation
	if sat.Queue <= 0 && sat.KV <= 0 {
		return nil
	}
	snap := b.snap.Load()
	now := b.now()
	sum, n := map[string]float64{}, map[string]int{}
	for _, be := range snap.Backends {
		if be.State != StateReady {
			continue
		}
		var c Candidate
		b.fill(&c, be, &Request{}, now)
		level := 0.0
		if sat.Queue > 0 {
			level = c.Queued / float64(sat.Queue)
		}
		if sat.KV > 0 && c.KVUsage.Known {
			level = max(level, c.KVUsage.V/sat.KV)
		}
		level = min(max(level, 0), 1)
		for _, m := range be.Models {
			sum[m] += level
			n[m]++
		}
	}
	out := make([]ModelSaturation, 0, len(sum))
	for m, s := range sum {
		out = append(out, ModelSaturation{Model: m, Level: s / float64(n[m])})
	}
	slices.SortFunc(out, func(a, b ModelSaturation) int {
		switch {
		case a.Model < b.Model:
			return -1
		case a.Model > b.Model:
			return 1
		}
		return 0
	})
	return out
}
