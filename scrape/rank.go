package scrape

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmlb/llmlb/balancer"
)

// pageRanks returns the distinct ranks the series in fams carry in e's
// rank label, sorted; nil when none does.
func (e *Engine) pageRanks(fams map[string]*dto.MetricFamily) []int {
	if e.RankLabel == "" {
		return nil
	}
	seen := map[int]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if r, ok := seriesRank(m, e.RankLabel); ok {
				seen[r] = true
			}
		}
	}
	if len(seen) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(seen))
}

// seriesRank returns the rank a series carries in label, if it carries
// one that is a non-negative integer.
func seriesRank(m *dto.Metric, label string) (int, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == label {
			r, err := strconv.Atoi(lp.GetValue())
			return r, err == nil && r >= 0
		}
	}
	return 0, false
}

// readRanks reads each rank's own metrics from fams: the series labelled
// with that rank, and the series that carry no rank (an info gauge such
// as vllm:lora_requests_info, which is the server's, not an engine's).
func (e *Engine) readRanks(fams map[string]*dto.MetricFamily, ranks []int, r *Reading) {
	if len(ranks) == 0 {
		return
	}
	r.Ranks = make(map[int]balancer.Metrics, len(ranks))
	for _, rank := range ranks {
		keep := func(m *dto.Metric) bool {
			got, ok := seriesRank(m, e.RankLabel)
			return !ok || got == rank
		}
		r.Ranks[rank] = e.read(fams, r.Metrics.At, keep).Metrics
	}
}

// rankRange returns the ranks start to start+size-1; nil for size 0.
func rankRange(start, size int) []int {
	if size <= 0 {
		return nil
	}
	out := make([]int, size)
	for i := range out {
		out[i] = start + i
	}
	return out
}

// RankEndpoint returns where data-parallel rank rank publishes its KV
// events when its server was given endpoint: vLLM's ZmqEventPublisher
// offsets the port of both the endpoint and the replay endpoint by the
// rank (offset_endpoint_port in vllm/distributed/kv_events.py at
// 0181ea31), the global rank its scheduler is given, so rank 0 keeps the
// port and rank 5 of tcp://h:5557 publishes on tcp://h:5562. An ipc
// endpoint has no port to offset (vLLM refuses one for a rank other than
// 0), so it gives "" for those: no subscription.
func RankEndpoint(endpoint string, rank int) string {
	if endpoint == "" || rank == 0 {
		return endpoint
	}
	if !strings.HasPrefix(endpoint, "tcp://") {
		return ""
	}
	i := strings.LastIndexByte(endpoint, ':')
	port, err := strconv.Atoi(endpoint[i+1:])
	if i < len("tcp://") || err != nil || port+rank > 65535 {
		return ""
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank)
}

// specs returns what the target publishes: its backend's spec, or, for a
// server with data-parallel ranks, one spec per rank, each with that
// rank's metrics (a rank the page does not show has unknown ones) and
// named after the server: name/r<rank>.
func (t *Target) specs() []balancer.Spec {
	if len(t.ranks) == 0 {
		return []balancer.Spec{t.spec}
	}
	out := make([]balancer.Spec, 0, len(t.ranks))
	for _, r := range t.ranks {
		s := t.spec
		s.ID = balancer.RankID(t.spec.ID, r)
		if s.Name != "" {
			s.Name += "/r" + strconv.Itoa(r)
		}
		s.Ranked, s.Rank = true, r
		m, ok := t.rankMetrics[r]
		if !ok {
			m = balancer.Metrics{At: t.spec.Metrics.At}
		}
		s.Metrics = m
		out = append(out, s)
	}
	return out
}

// setRanks makes ranks the ranks the target publishes, removing from the
// balancer the backends that no longer exist: the whole server's when it
// turns out to have ranks, a rank's when the page stops showing it.
func (t *Target) setRanks(ranks []int) {
	if slices.Equal(ranks, t.ranks) {
		return
	}
	before := t.specs()
	t.ranks = ranks
	keep := map[string]bool{}
	for _, s := range t.specs() {
		keep[s.ID] = true
	}
	var gone []string
	for _, s := range before {
		if !keep[s.ID] {
			gone = append(gone, s.ID)
			delete(t.ledgers, s.ID)
		}
	}
	t.logger.Info("backend data-parallel ranks", "backend", t.spec.ID, "ranks", ranks)
	t.bal.Remove(gone...)
}

// ledgerOf returns the ledger of the published backend id.
func (t *Target) ledgerOf(id string) *balancer.Ledger {
	l := t.ledgers[id]
	if l == nil {
		l = t.bal.Ledger(id)
		t.ledgers[id] = l
	}
	return l
}

// syncKVEvents keeps one KV-event subscription per published backend, at
// the endpoint its rank publishes on, and ends those of backends gone.
func (t *Target) syncKVEvents(ctx context.Context) {
	if t.kv == nil || t.kvEndpoint == "" {
		return
	}
	want := map[string]bool{}
	for _, s := range t.specs() {
		want[s.ID] = true
		if t.kvSubs[s.ID] != nil {
			continue
		}
		ep, rp := t.kvEndpoint, t.kvReplay
		if s.Ranked {
			ep, rp = RankEndpoint(ep, s.Rank), RankEndpoint(rp, s.Rank)
		}
		if ep == "" {
			t.logger.Warn("kv events: no endpoint for this rank; vLLM offsets only tcp ports by the rank", "backend", s.ID, "endpoint", t.kvEndpoint)
			t.kvSubs[s.ID] = func() {}
			continue
		}
		t.kvSubs[s.ID] = t.followKVEvents(ctx, s.ID, ep, rp)
	}
	for id, stop := range t.kvSubs {
		if !want[id] {
			stop()
			delete(t.kvSubs, id)
		}
	}
}

// stopKVEvents ends every KV-event subscription.
func (t *Target) stopKVEvents() {
	for id, stop := range t.kvSubs {
		stop()
		delete(t.kvSubs, id)
	}
}
