package scrape

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// TestReloadBackends swaps the backends entries of a running manager, in
// virtual time: an unchanged entry keeps running untouched (same ledger,
// still ready), a removed one drains, for the reason that it left the
// config, while its request is in flight and goes once it ends, a
// discovered backend that becomes a static entry with another engine (a
// row of its own that reads the same page, so that no engine mismatch
// switches it back) is restarted under its ID, and a reload naming an
// unknown engine changes nothing.
func TestReloadBackends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bn := newBubbleNet(t)
		ports, _ := hostBackends(t, bn, 3)
		url := func(i int) string { return "http://127.0.0.1:" + strconv.Itoa(ports[i]) }
		d := newFakeDNS()
		d.setA("c.test", "127.0.0.1")
		bal := testBalancer(t)
		engines, err := NewEngineSet(map[string]EngineConfig{"vllm-queue-only": {Queued: ptr("vllm:num_requests_waiting")}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewManager(Setup{Config: dnsConfig(), DefaultEngine: "vllm", Balancer: bal, Resolver: d, Client: bn.client, Engines: engines,
			Backends: []BackendConfig{{URL: url(0)}, {URL: url(1)}, {DNS: "c.test", Ports: ports[2:]}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Reload(nil, engines, "vllm"); err == nil {
			t.Error("Reload before Run accepted")
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(ctx) }()
		defer func() { cancel(); <-done }()
		all := []string{url(0), url(1), url(2)}
		slices.Sort(all)
		waitFor(t, "three ready backends", func() bool { return slices.Equal(ids(bal, balancer.StateReady), all) })

		byID := func(id string) *balancer.Backend {
			for _, be := range bal.Snapshot().Backends {
				if be.ID == id {
					return be
				}
			}
			return nil
		}
		a, b := byID(url(0)), byID(url(1))
		guard := balancer.NewGuard()
		guard.Attach(a, balancer.Work{}, time.Now())

		if err := m.Reload([]BackendConfig{{URL: url(1)}, {URL: url(2), Engine: "nosuch"}}, engines, "vllm"); err == nil {
			t.Fatal("unknown engine accepted")
		}
		if got := ids(bal, balancer.StateReady); !slices.Equal(got, all) {
			t.Fatalf("a refused reload changed the backends: %v", got)
		}

		if err := m.Reload([]BackendConfig{{URL: url(1)}, {URL: url(2), Engine: "vllm-queue-only"}}, engines, "vllm"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the removed backend draining, the new entry ready", func() bool {
			c := byID(url(2))
			return slices.Equal(ids(bal, balancer.StateDraining), []string{url(0)}) && c != nil && c.Engine == "vllm-queue-only" && c.State == balancer.StateReady
		})
		// Newcomer trial item 10: a url: entry taken out of the file said
		// "left discovery".
		if r := reasonOf(bal, url(0)); r != reasonLeftConfig {
			t.Errorf("the removed static entry drains for %q, want %q", r, reasonLeftConfig)
		}
		if nb := byID(url(1)); nb.Ledger != b.Ledger || nb.State != balancer.StateReady || !nb.Since.Equal(b.Since) {
			t.Errorf("unchanged entry disturbed: %+v", nb)
		}
		guard.Release()
		waitFor(t, "the drained backend removed", func() bool { return byID(url(0)) == nil })

		// The DNS entry is gone: its name changing no longer matters.
		d.setA("c.test")
		advance(150 * time.Millisecond) // three refresh intervals of the retired entry
		if c := byID(url(2)); c == nil || c.State != balancer.StateReady {
			t.Errorf("the static entry followed a retired DNS entry: %+v", c)
		}
	})
}
