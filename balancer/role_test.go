package balancer

import (
	"testing"
	"time"
)

// TestPickHonoursRoles: a prefill pick goes to a backend that prefills, any
// other pick to one that decodes, whatever the load says.
func TestPickHonoursRoles(t *testing.T) {
	b := newBal(t, DefaultConfig().Policy)
	p, d, both := ready("p", 0, 0, 0), ready("d", 9, 2, 0.3), ready("x", 12, 2, 0.3)
	p.Role, d.Role = RolePrefill, RoleDecode
	b.Update(p, d, both)
	if !b.Snapshot().Disaggregated("m") {
		t.Fatal("Disaggregated(m) = false with declared roles, want true")
	}
	for _, tc := range []struct {
		name string
		role Role
		want []string
	}{
		{"decode", RoleDecode, []string{"d", "x"}},
		{"whole request", RoleBoth, []string{"d", "x"}},
		{"prefill", RolePrefill, []string{"p", "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 4 {
				dec, err := b.Pick(&Request{Model: "m", Role: tc.role, PromptTokens: 100}, nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, be := range dec.Candidates {
					if be.ID != tc.want[0] && be.ID != tc.want[1] {
						t.Errorf("Pick(role %s) candidate %s, want one of %v", tc.role, be.ID, tc.want)
					}
				}
			}
		})
	}
}

// TestFleetWithoutRolesIsNotDisaggregated: backends of role both never
// make a request take a prefill leg.
func TestFleetWithoutRolesIsNotDisaggregated(t *testing.T) {
	b := newBal(t, DefaultConfig().Policy)
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0))
	if b.Snapshot().Disaggregated("m") {
		t.Error("Disaggregated(m) = true for a fleet of role both, want false")
	}
}

func TestParseRole(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Role
		wantErr bool
	}{{"", RoleBoth, false}, {"both", RoleBoth, false}, {"prefill", RolePrefill, false}, {"decode", RoleDecode, false}, {"Prefill", RoleBoth, true}} {
		got, err := ParseRole(tc.in)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseRole(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestPrefillPickPrefersTheDecodeHost: among prefill servers that tie, the
// one on the decode server's host is chosen; a busier one there is not.
func TestPrefillPickPrefersTheDecodeHost(t *testing.T) {
	for _, policy := range []string{DefaultConfig().Policy, "round-robin"} {
		t.Run(policy, func(t *testing.T) {
			b := newBal(t, policy)
			a, c := ready("10.0.0.1:8100", 0, 0, 0), ready("10.0.0.2:8100", 0, 0, 0)
			a.Role, c.Role = RolePrefill, RolePrefill
			b.Update(a, c)
			for range 4 {
				dec, err := b.Pick(&Request{Model: "m", Role: RolePrefill, NearHost: "10.0.0.2", PromptTokens: 1000}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := dec.Candidates[0].ID; got != "10.0.0.2:8100" {
					t.Errorf("Pick(near 10.0.0.2) = %s, want 10.0.0.2:8100", got)
				}
			}
		})
	}
	b := newBal(t, DefaultConfig().Policy)
	a, c := ready("10.0.0.1:8100", 0, 0, 0), ready("10.0.0.2:8100", 12, 4, 0.5)
	a.Role, c.Role = RolePrefill, RolePrefill
	b.Update(a, c)
	dec, err := b.Pick(&Request{Model: "m", Role: RolePrefill, NearHost: "10.0.0.2", PromptTokens: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := dec.Candidates[0].ID; got != "10.0.0.1:8100" {
		t.Errorf("Pick(near a busy 10.0.0.2) = %s, want the idle 10.0.0.1:8100", got)
	}
}

// TestReworkedDecodeLegTeachesNothing: a guard reworked for a decode leg
// counts no prompt tokens pending and no second request, and its first
// byte, which waited on another server's prefill, teaches no estimate.
func TestReworkedDecodeLegTeachesNothing(t *testing.T) {
	b := newBal(t, DefaultConfig().Policy)
	b.Update(ready("d", 0, 0, 0))
	be := b.Snapshot().Backends[0]
	g := b.NewGuard()
	now := time.Now()
	g.Attach(be, Work{UncachedTokens: 4000, DecodeTokens: 16, PrefillSeconds: 0.4}, now)
	g.Rework(Work{DecodeTokens: 16, Remote: true}, now.Add(time.Second))
	if _, tok := be.Ledger.Pending(); tok != 0 {
		t.Errorf("pending tokens after Rework = %d, want 0", tok)
	}
	if n := be.Ledger.Total(); n != 1 {
		t.Errorf("requests after Rework = %d, want 1", n)
	}
	g.FirstByte(now.Add(3 * time.Second))
	g.Release()
	if s := be.Ledger.est.load().Samples; s != 0 {
		t.Errorf("estimate samples after a remote first byte = %d, want 0", s)
	}
	if n := be.Ledger.InFlight(); n != 0 {
		t.Errorf("in flight after Release = %d, want 0", n)
	}
}
