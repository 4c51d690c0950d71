package proxy

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/prefix"
)

// llmlb_backend_slots shows what the balancer learned of how many requests
// each backend runs at once: absent while not known, then the count a
// plateau in the readings proposed and the first tokens confirmed, on the
// backend and on another of its engine and KV size.
func TestSlotsMetric(t *testing.T) {
	cfg := balancer.DefaultConfig()
	bal, err := balancer.New(cfg, balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig()), Tree: prefix.NewTree(1 << 20)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	spec := func(id string, running, waiting float64, at time.Time) balancer.Spec {
		u, _ := url.Parse("http://" + id)
		return balancer.Spec{ID: id, URL: u, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady,
			Metrics: balancer.Metrics{Running: balancer.Known(running), Queued: balancer.Known(waiting), KVUsage: balancer.Known(0.3),
				BlockSize: balancer.Known(16), NumBlocks: balancer.Known(2048), At: at}}
	}
	bal.Update(spec("a", 2, 0, now), spec("b", 1, 0, now))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&inFlightCollector{bal: bal})
	if n, err := testutil.GatherAndCount(reg, "llmlb_backend_slots"); err != nil || n != 0 {
		t.Fatalf("slots not learned: %d series (%v), want none", n, err)
	}
	// a shows 8 running with requests waiting twice: it proposes 8.
	for i := range 2 {
		bal.Update(spec("a", 8, 3, now.Add(time.Duration(i+1)*100*time.Millisecond)))
	}
	var a *balancer.Backend
	for _, be := range bal.Snapshot().Backends {
		if be.ID == "a" {
			a = be
		}
	}
	// Requests picked below 8 take their estimate; at 8, ten times it.
	firstByte := func(running float64, took time.Duration) {
		g := bal.NewGuard()
		g.Attach(a, balancer.Work{UncachedTokens: 100, Running: running, Estimate: 0.05}, now)
		g.FirstByte(now.Add(took))
		g.Release()
	}
	for range 3 {
		firstByte(3, 50*time.Millisecond)
		firstByte(9, 500*time.Millisecond)
	}
	bal.Update(spec("a", 8, 3, now.Add(time.Second))) // lends the count to b
	want := `
# HELP llmlb_backend_slots Requests each backend runs at once as llmlb learned them (balancer.Ledger.Slots): confirmed on the backend, or by another of its engine and KV size; absent while not known.
# TYPE llmlb_backend_slots gauge
llmlb_backend_slots{backend="a"} 8
llmlb_backend_slots{backend="b"} 8
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "llmlb_backend_slots"); err != nil {
		t.Error(err)
	}
}
