package balancer

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Issue 53 part 3: in a soak of four servers under 500 streams, one killed
// with SIGKILL, 3 requests got 502 "connection refused" after one attempt.
// The three live servers' queues (scraped waiting plus what we sent since)
// were past saturation.queue (16), and the killed server's last reading,
// still fresh (until its next scrape; before issue 53 a refused scrape
// kept it for stale_after), said it was idle: the default policy's
// saturation stage dropped the live servers and each pick held the dead
// server alone. A refused attempt leaves its queue estimate as it was, so
// every pick chose it alone again until passive health ejected it, at
// eject_after (5) failures in a row. A refused connection now ejects at
// once.

// TestRefusedConnectionEjectsAtOnce: one refused connection takes the dead
// backend out of every later pick, whether the live backends are
// saturated (the pick then says ErrSaturated, and the request, or the
// proxy's re-pick after the refusal, waits in the admission queue) or have
// room; with eject_after 0 passive ejection stays off, refusals included.
func TestRefusedConnectionEjectsAtOnce(t *testing.T) {
	tests := []struct {
		name        string
		liveQueue   float64 // each live backend's scraped waiting requests
		ejectAfter  int
		firstAlone  bool // the first pick holds the victim alone, the soak's 502s
		wantEjected bool
		wantErr     error // of the picks after the refusal
	}{
		{name: "live backends saturated", liveQueue: 20, ejectAfter: 5, firstAlone: true, wantEjected: true, wantErr: ErrSaturated},
		{name: "live backends with room", liveQueue: 2, ejectAfter: 5, wantEjected: true},
		{name: "ejection off", liveQueue: 2, ejectAfter: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The default policy and config: MaxCandidates 3, saturation.queue 16, admission queue on.
			b := newBal(t, "ttft", func(c *Config, _ *Deps) { c.Passive.EjectAfter = tt.ejectAfter })
			b.Update(ready("live1", tt.liveQueue, 100, 0.3), ready("live2", tt.liveQueue, 100, 0.3),
				ready("live3", tt.liveQueue, 100, 0.3), ready("victim", 0, 0, 0.1))
			victim := backend(t, b, "victim")
			pick := func() (Decision, error) {
				// As the proxy picks: with the request's guard, attached
				// to the primary inside the pick.
				g := b.NewGuard()
				defer g.Release()
				return b.Pick(&Request{Model: "m", PromptTokens: 40, MaxTokens: 16, Guard: g}, nil)
			}

			d, err := pick()
			if err != nil || len(d.Candidates) == 0 || d.Candidates[0] != victim || tt.firstAlone != (len(d.Candidates) == 1) {
				t.Fatalf("first Pick = %v, %v, want the idle victim first (alone: %v): the fleet no longer stands for the soak's", ids(d.Candidates), err, tt.firstAlone)
			}
			b.Failed(victim, FailRefused)

			if got := victim.Ledger.Ejected(); got != tt.wantEjected {
				t.Fatalf("ejected after one refused connection = %v, want %v", got, tt.wantEjected)
			}
			if tt.wantEjected {
				if e := victim.Ledger.Ejection(); !strings.HasPrefix(e.Reason, "refused: ") {
					t.Errorf("ejection reason %q, want refused: ...", e.Reason)
				}
				if byReason, _ := b.Ejections(); byReason[FailRefused] != 1 {
					t.Errorf("ejections by reason = %v, want one refused", byReason)
				}
			}
			for i := range 10 {
				d, err := pick()
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Pick %d after the refusal: err %v, want %v", i, err, tt.wantErr)
				}
				if err != nil || !tt.wantEjected {
					continue
				}
				for _, be := range d.Candidates {
					if be == victim {
						t.Fatalf("Pick %d after the refusal = %v, want no victim among the candidates", i, ids(d.Candidates))
					}
				}
			}
		})
	}
}

// TestRefusedEjectionKeepsTheCap: when every backend refuses (llmlb's own
// network, say), a refusal ejects at once only within
// max_ejection_percent, and the ejections the cap refuses are counted.
func TestRefusedEjectionKeepsTheCap(t *testing.T) {
	tests := []struct {
		name    string
		fleet   int
		percent int
		want    int
	}{
		{name: "half of four", fleet: 4, percent: 50, want: 2},
		{name: "one always may", fleet: 3, percent: 0, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBal(t, "round-robin", func(c *Config, _ *Deps) { c.Passive.MaxEjectionPercent = tt.percent })
			fleet(b, tt.fleet)
			for _, be := range b.Snapshot().Backends {
				b.Failed(be, FailRefused)
			}
			got := 0
			for _, be := range b.Snapshot().Backends {
				if be.Ledger.Ejected() {
					got++
				}
			}
			if got != tt.want {
				t.Errorf("ejected %d of %d, each refused once, at max_ejection_percent %d; want %d", got, tt.fleet, tt.percent, tt.want)
			}
			if _, capped := b.Ejections(); capped != int64(tt.fleet-tt.want) {
				t.Errorf("capped = %d, want %d", capped, tt.fleet-tt.want)
			}
		})
	}
}

// TestRefusedBackendReturnsByProbe: a backend ejected for a refusal follows
// the readmission rules of every ejection: out for eject_backoff whatever
// its health check says, kept out longer while its probe fails, back on
// probation, and ejected again, for twice as long again, by its next
// refusal.
func TestRefusedBackendReturnsByProbe(t *testing.T) {
	var c clock
	b := newBal(t, "round-robin", withClock(&c))
	fleet(b, 3)
	be := backend(t, b, "b0")
	b.Failed(be, FailRefused)
	if !be.Ledger.Ejected() {
		t.Fatal("not ejected by a refused connection")
	}
	c.add(time.Second - time.Millisecond)
	b.Probed("b0", true) // early: changes nothing
	if !be.Ledger.Ejected() || be.Ledger.ReadmitDue(c.now()) {
		t.Fatal("readmitted, or due, before eject_backoff")
	}
	c.add(time.Millisecond)
	b.Probed("b0", false) // the server is still down
	if e := be.Ledger.Ejection(); !e.Ejected || !e.Until.Equal(c.now().Add(2*time.Second)) {
		t.Fatalf("after a failed probe: %+v, want ejected until 2s from now", e)
	}
	c.add(2 * time.Second)
	b.Probed("b0", true)
	if be.Ledger.Ejected() {
		t.Fatal("not readmitted by a good probe after its ejection time")
	}
	b.Failed(be, FailRefused)
	if e := be.Ledger.Ejection(); !e.Ejected || !e.Until.Equal(c.now().Add(4*time.Second)) || e.Total != 2 {
		t.Errorf("refused again after readmission: %+v, want the second ejection, until 4s from now", e)
	}
}
