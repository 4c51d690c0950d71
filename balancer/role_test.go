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

// TestPDSplit: each peer's decision, as PDDecisions configures it, splits
// by the decode server's uncached tokens as its source says; an SGLang
// decode server must always split.
func TestPDSplit(t *testing.T) {
	decisions := map[string]PDConfig{}
	for _, d := range PDDecisions() {
		decisions[d.Name] = d.Config
		if d.Follows == "" {
			t.Errorf("%s cites no source", d.Name)
		}
	}
	vllm := &Backend{Engine: "vllm", Role: RoleDecode}
	for _, tc := range []struct {
		decision         string
		uncached, prompt int
		want             bool
	}{
		{"always", 0, 100, true},
		{"llm-d", 15, 5000, false},
		{"llm-d", 16, 5000, true},
		{"vllm-router", 255, 300, false},
		{"vllm-router", 256, 300, true},
		// Dynamo's isl_bounding: local only when the effective input is
		// under 2048 tokens and under 0.7 of the prompt.
		{"dynamo", 2047, 4000, false},
		{"dynamo", 2048, 4000, true},
		{"dynamo", 69, 100, false},
		{"dynamo", 70, 100, true},
	} {
		if got, must := decisions[tc.decision].Split(vllm, tc.uncached, tc.prompt); got != tc.want || must {
			t.Errorf("%s: Split(%d of %d) = %v, %v; want %v, false", tc.decision, tc.uncached, tc.prompt, got, must, tc.want)
		}
	}
	if split, must := decisions["vllm-router"].Split(&Backend{Engine: "sglang", Role: RoleDecode}, 0, 100); !split || !must {
		t.Errorf("SGLang decode server: Split = %v, %v; want true, true", split, must)
	}
	bad := DefaultConfig()
	bad.PD.MinUncachedRatio = 1.5
	if err := bad.Validate(); err == nil {
		t.Error("min_uncached_ratio 1.5 validated")
	}
}
