package balancer

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// clock is a settable time for passive-health tests.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func withClock(c *clock) func(*Config, *Deps) {
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return func(_ *Config, d *Deps) { d.Now = c.now }
}

func fleet(b *Balancer, n int) {
	for i := range n {
		b.Update(spec(fmt.Sprintf("b%d", i), StateReady, "m"))
	}
}

func TestPickSkipsEjected(t *testing.T) {
	b := newBal(t, "round-robin")
	fleet(b, 3)
	for range 5 {
		b.Failed(backend(t, b, "b1"), FailCut)
	}
	if !backend(t, b, "b1").Ledger.Ejected() {
		t.Fatal("b1 not ejected after 5 cut streams in a row")
	}
	for range 20 {
		d, err := b.Pick(&Request{Model: "m"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, be := range d.Candidates {
			if be.ID == "b1" {
				t.Fatalf("Pick = %v, want no ejected b1 among the candidates", ids(d.Candidates))
			}
		}
	}
	ex := b.Explain(&Request{Model: "m"})
	found := false
	for _, bb := range ex.Backends {
		if bb.ID == "b1" && bb.Excluded == "ejected" {
			found = true
		}
	}
	if !found {
		t.Errorf("Explain does not say b1 is ejected: %+v", ex.Backends)
	}
	byReason, _ := b.Ejections()
	if byReason[FailCut] != 1 {
		t.Errorf("ejections by reason = %v, want one stream-cut", byReason)
	}
}

func TestEjectionCap(t *testing.T) {
	tests := []struct {
		name    string
		fleet   int
		percent int
		want    int // ejected when every backend fails
	}{
		{name: "half of four", fleet: 4, percent: 50, want: 2},
		{name: "half of three", fleet: 3, percent: 50, want: 1},
		{name: "one always may", fleet: 3, percent: 0, want: 1},
		{name: "all", fleet: 3, percent: 100, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBal(t, "round-robin", func(c *Config, _ *Deps) { c.Passive.MaxEjectionPercent = tt.percent })
			fleet(b, tt.fleet)
			for _, be := range b.Snapshot().Backends {
				for range 10 {
					b.Failed(be, FailConnect)
				}
			}
			got := 0
			for _, be := range b.Snapshot().Backends {
				if be.Ledger.Ejected() {
					got++
				}
			}
			if got != tt.want {
				t.Errorf("ejected %d of %d at max_ejection_percent %d, want %d", got, tt.fleet, tt.percent, tt.want)
			}
			if _, capped := b.Ejections(); (capped > 0) != (tt.want < tt.fleet) {
				t.Errorf("capped = %d", capped)
			}
		})
	}
}

// TestEveryAnswer5xxStaysOutLonger: a backend that fails every request is
// out for 1s, 2s, 4s...: readmitted only when its time is over, however
// often its health check answers, and ejected again by one failure.
func TestEveryAnswer5xxStaysOutLonger(t *testing.T) {
	var c clock
	b := newBal(t, "round-robin", withClock(&c))
	fleet(b, 3)
	be := backend(t, b, "b0")
	for range 5 {
		b.Failed(be, FailStatus)
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second} {
		if !be.Ledger.Ejected() {
			t.Fatalf("ejection %d: not ejected", i+1)
		}
		c.add(want - time.Millisecond)
		if be.Ledger.ReadmitDue(c.now()) {
			t.Fatalf("ejection %d: readmission due before %s", i+1, want)
		}
		b.Probed("b0", true) // a health check answering early changes nothing
		if !be.Ledger.Ejected() {
			t.Fatalf("ejection %d: readmitted by a health check before %s", i+1, want)
		}
		c.add(time.Millisecond)
		if !be.Ledger.ReadmitDue(c.now()) {
			t.Fatalf("ejection %d: readmission not due at %s", i+1, want)
		}
		b.Probed("b0", true)
		if be.Ledger.Ejected() {
			t.Fatalf("ejection %d: not readmitted at %s", i+1, want)
		}
		b.Failed(be, FailStatus) // its first answer back: 5xx again
	}
	// Readmitted and then good for longer than the longest ejection: the
	// next one starts short again.
	c.add(8 * time.Second)
	b.Probed("b0", true)
	b.Succeeded(be)
	c.add(31 * time.Second)
	for range 5 {
		b.Failed(be, FailStatus)
	}
	c.add(time.Second)
	if !be.Ledger.ReadmitDue(c.now()) {
		t.Errorf("after a good spell, the next ejection lasts more than eject_backoff")
	}
}

// TestTTFTOutlierEjected: a backend whose first tokens come far later than
// the fleet's for prompts of the same size is ejected once it has enough
// samples; one a little slower, or slow only on longer prompts the others
// have not answered, is not.
func TestTTFTOutlierEjected(t *testing.T) {
	var c clock
	b := newBal(t, "round-robin", withClock(&c), func(cfg *Config, _ *Deps) {
		cfg.Passive.OutlierMinSamples = 5
		cfg.Passive.OutlierMinExcess = 100 * time.Millisecond
	})
	fleet(b, 4)
	first := func(id string, tokens int, d time.Duration) {
		g := b.NewGuard()
		g.Stream()
		be := backend(t, b, id)
		g.Attach(be, Work{UncachedTokens: tokens}, c.now())
		g.FirstByte(c.now().Add(d))
		g.Release()
		c.add(200 * time.Millisecond) // past the fleet median's cache
	}
	for range 10 {
		first("b0", 100, 50*time.Millisecond)
		first("b1", 100, 60*time.Millisecond)
		first("b2", 100, 120*time.Millisecond) // twice as slow: not an outlier
		first("b3", 4000, 2*time.Second)       // slow, but on long prompts only it answered
	}
	for _, be := range b.Snapshot().Backends {
		if be.Ledger.Ejected() {
			t.Fatalf("%s ejected: %+v", be.ID, be.Ledger.Ejection())
		}
	}
	for i := range 5 {
		first("b3", 100, 2*time.Second)
		if got := backend(t, b, "b3").Ledger.Ejected(); got != (i == 4) {
			t.Fatalf("after %d slow short prompts: ejected %v, want %v (5 samples needed)", i+1, got, i == 4)
		}
	}
	if byReason, _ := b.Ejections(); byReason[reasonOutlier] != 1 {
		t.Errorf("ejections by reason = %v, want one ttft-outlier", byReason)
	}
	// Non-streaming answers do not count: their time is their length.
	g := b.NewGuard()
	be := backend(t, b, "b2")
	for range 10 {
		g.Attach(be, Work{UncachedTokens: 100}, c.now())
		g.FirstByte(c.now().Add(10 * time.Second))
		c.add(200 * time.Millisecond)
	}
	g.Release()
	if be.Ledger.Ejected() {
		t.Errorf("slow non-streaming answers ejected b2")
	}
}

func TestPassiveConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Passive = PassiveConfig{EjectAfter: -1, EjectBackoff: 0, EjectBackoffMax: -1, MaxEjectionPercent: 101, OutlierTTFTFactor: 0.5,
		OutlierMinExcess: -1, OutlierMinSamples: 0, OutlierMinBackends: 1}
	err := c.Validate()
	for _, f := range []string{"eject_after", "eject_backoff:", "eject_backoff_max", "max_ejection_percent", "outlier_ttft_factor", "outlier_min_excess", "outlier_min_samples", "outlier_min_backends"} {
		if err == nil || !strings.Contains(err.Error(), "balancer.passive."+f) {
			t.Errorf("Validate() = %v, want an error for %s", err, f)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
