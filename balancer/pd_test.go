package balancer

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// TestPlanPrefill: a request splits when its decode server lacks enough
// of its prompt and a prefill server of the same engine takes it; else it
// is answered in one leg, unless its decode server must split, when it
// fails. Every plan not taken leaves no request accounted.
func TestPlanPrefill(t *testing.T) {
	for _, tc := range []struct {
		name          string
		decodeEngine  string
		prefill       []string // prefill servers' engines, in order p0, p1, ...
		both          bool     // the decode server is of role both, the only prefiller
		uncached      int
		wantPrefill   []string // the plan's candidates; nil: one leg
		wantNoBackend bool     // an error wrapping ErrNoBackend
		wantErr       bool
	}{
		{name: "split", decodeEngine: "vllm", prefill: []string{"vllm"}, uncached: 1000, wantPrefill: []string{"p0"}},
		{name: "few uncached", decodeEngine: "vllm", prefill: []string{"vllm"}, uncached: 255},
		{name: "other engine only", decodeEngine: "vllm", prefill: []string{"sglang"}, uncached: 1000},
		{name: "same engine kept", decodeEngine: "vllm", prefill: []string{"vllm", "vllm"}, uncached: 1000, wantPrefill: []string{"p0", "p1"}},
		{name: "decode is its own prefill pick", decodeEngine: "vllm", both: true, uncached: 1000},
		{name: "sglang must split", decodeEngine: "sglang", prefill: []string{"sglang"}, uncached: 10, wantPrefill: []string{"p0"}},
		{name: "sglang with no prefill server", decodeEngine: "sglang", uncached: 10, wantNoBackend: true, wantErr: true},
		{name: "sglang with another engine's", decodeEngine: "sglang", prefill: []string{"vllm"}, uncached: 10, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBal(t, DefaultConfig().Policy)
			d := ready("d", 0, 0, 0)
			d.Engine, d.Role = tc.decodeEngine, RoleDecode
			if tc.both {
				d.Role = RoleBoth
			}
			specs := []Spec{d}
			for i, e := range tc.prefill {
				// p0 idle, later ones busier, so that the pick's order is known.
				p := ready("p"+string(rune('0'+i)), float64(4*i), float64(i), 0.1*float64(i))
				p.Engine, p.Role = e, RolePrefill
				specs = append(specs, p)
			}
			b.Update(specs...)
			dec := Decision{Candidates: []*Backend{backend(t, b, "d")}, Uncached: tc.uncached}
			plan, err := b.PlanPrefill(&Request{Model: "m", PromptTokens: 1000}, &dec)
			if (err != nil) != tc.wantErr || errors.Is(err, ErrNoBackend) != tc.wantNoBackend {
				t.Fatalf("PlanPrefill = %v, want error %v (no backend %v)", err, tc.wantErr, tc.wantNoBackend)
			}
			var got []string
			if plan != nil {
				got = ids(plan.Decision.Candidates)
				if g := plan.Guard.Backend(); g != plan.Decision.Candidates[0] {
					t.Errorf("plan's guard on %v, want %s", g, got[0])
				}
				plan.Guard.Release()
			}
			if !slices.Equal(got, tc.wantPrefill) {
				t.Errorf("PlanPrefill's prefill candidates = %v, want %v", got, tc.wantPrefill)
			}
			for _, be := range b.Snapshot().Backends {
				if n := be.Ledger.InFlight(); n != 0 {
					t.Errorf("%s has %d in flight after the plan's guard was released", be.ID, n)
				}
			}
		})
	}
}

// TestPlanIsTheSameWhoeverAsks: the proxy and the benchmark each build
// their balancer with [Build], serve's on the wall clock and math/rand,
// bench's on a virtual clock and a seeded source, and ask PlanPrefill;
// /debug/route explains the prefill pick of [Request.PrefillLeg]. On the
// same fleet all three name the same prefill server, and the plans the
// same candidates.
func TestPlanIsTheSameWhoeverAsks(t *testing.T) {
	now := time.Now()
	fleet := func() []Spec {
		d1, d2 := ready("10.0.0.1:8200", 0, 0, 0), ready("10.0.0.2:8200", 2, 1, 0.1)
		p1, p2, p3 := ready("10.0.0.1:8100", 6, 2, 0.3), ready("10.0.0.2:8100", 0, 0, 0), ready("10.0.0.3:8100", 3, 1, 0.2)
		d1.Role, d2.Role = RoleDecode, RoleDecode
		p1.Role, p2.Role, p3.Role = RolePrefill, RolePrefill, RolePrefill
		return []Spec{d1, d2, p1, p2, p3}
	}
	cfg := DefaultConfig()
	serve, _, err := Build(cfg, prefix.DefaultConfig(), Deps{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	bench, _, err := Build(cfg, prefix.DefaultConfig(), Deps{Now: func() time.Time { return now }, Rand: rng.Uint64}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []byte("a long document the decode server has never seen, to be prefilled elsewhere")
	var plans [][]string
	for _, b := range []*Balancer{serve, bench} {
		b.Update(fleet()...)
		req := &Request{Model: "m", Prompt: prompt, PromptTokens: 4000, Guard: b.NewGuard()}
		dec, err := b.Pick(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := b.PlanPrefill(req, &dec)
		if err != nil || plan == nil {
			t.Fatalf("PlanPrefill(%d uncached on %s) = %v, %v; want a prefill leg", dec.Uncached, dec.Candidates[0].ID, plan, err)
		}
		pb := req.PrefillLeg(dec.Candidates[0])
		if ex := b.Explain(&pb); len(ex.Chosen) == 0 || ex.Chosen[0] != plan.Decision.Candidates[0].ID {
			t.Errorf("Explain(prefill leg) chose %v, PlanPrefill %s", ex.Chosen, plan.Decision.Candidates[0].ID)
		}
		plans = append(plans, append([]string{dec.Candidates[0].ID}, ids(plan.Decision.Candidates)...))
		plan.Guard.Release()
		req.Guard.Release()
	}
	if !slices.Equal(plans[0], plans[1]) {
		t.Errorf("decode server and prefill candidates: serve's %v, bench's %v", plans[0], plans[1])
	}
	if plans[0][0] != "10.0.0.1:8200" || plans[0][1] != "10.0.0.2:8100" {
		t.Errorf("plan %v, want decode on the idle 10.0.0.1:8200 and prefill on the idle 10.0.0.2:8100", plans[0])
	}
}

// TestPrefilledWork: a decode leg prefilled elsewhere has nothing to
// prefill or wait behind and teaches no estimate; the rest of its work
// is kept.
func TestPrefilledWork(t *testing.T) {
	w := Work{UncachedTokens: 4000, DecodeTokens: 16, Adapter: "a", AheadTokens: 900, QueuedAhead: 2, PrefillSeconds: 0.4, PromptBytes: 16000}
	want := Work{DecodeTokens: 16, Adapter: "a", Remote: true, PromptBytes: 16000}
	if got := w.Prefilled(); got != want {
		t.Errorf("Prefilled() = %+v, want %+v", got, want)
	}
}

// TestBuildMakesThePresetsIndex: Build gives each preset the index or
// tree it names, sized as its [IndexSpec] says, and none to the others.
func TestBuildMakesThePresetsIndex(t *testing.T) {
	own := prefix.DefaultConfig()
	own.MaxBlocks = 77
	for _, tc := range []struct {
		policy        string
		wantIndex     bool
		wantMaxBlocks int
	}{
		{"ttft", true, 77},
		{"epp", true, 131072 / 64},
		{"dynamo-kv", true, 131072 / 16},
		{"round-robin", false, 0},
		{"sglang-cache-aware", false, 0},
	} {
		cfg := DefaultConfig()
		cfg.Policy = tc.policy
		b, idx, err := Build(cfg, own, Deps{}, nil, nil)
		if err != nil {
			t.Fatalf("Build(%s): %v", tc.policy, err)
		}
		if (idx != nil) != tc.wantIndex {
			t.Errorf("Build(%s) index %v, want one: %v", tc.policy, idx, tc.wantIndex)
		}
		pr, _ := LookupPreset(tc.policy)
		if got := pr.IndexConfig(own).MaxBlocks; tc.wantIndex && got != tc.wantMaxBlocks {
			t.Errorf("%s: IndexConfig MaxBlocks = %d, want %d", tc.policy, got, tc.wantMaxBlocks)
		}
		if b.Policy() != tc.policy {
			t.Errorf("Build(%s) runs %s", tc.policy, b.Policy())
		}
	}
}
