package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// TestAgenticBuildsFromItsSeed: the same seed builds the same sessions,
// another seed others; each session is 4-10 turns on one API, each turn
// resending the last one's prompt with an answer and a tool's result
// appended, and in the stored third every follow-up carries only that
// result.
func TestAgenticBuildsFromItsSeed(t *testing.T) {
	p := Params{Scale: 0.05, Seed: 11}
	a, err := Build("agentic", p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Build("agentic", p)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed built two different workloads")
	}
	p.Seed = 12
	if c, _ := Build("agentic", p); reflect.DeepEqual(a.Requests, c.Requests) {
		t.Fatal("seeds 11 and 12 built the same workload")
	}
	sessions := map[uint64][]Request{}
	for _, q := range a.Requests {
		sessions[q.Session] = append(sessions[q.Session], q)
	}
	if len(sessions) != 60 {
		t.Fatalf("%d sessions at scale 0.05, want 60", len(sessions))
	}
	byAPI := map[string]int{}
	for s, turns := range sessions {
		if n := len(turns); n < 4 || n > 10 {
			t.Errorf("session %d has %d turns, want 4-10", s, n)
		}
		first := turns[0]
		stored := len(turns) > 1 && turns[1].Stored > 0
		kind := first.API.String()
		if stored {
			kind += "-stored"
		}
		byAPI[kind]++
		if sys := first.Parts[0].Tokens; first.System != 1 || sys < 1800 || sys > 2400 || first.Stored != 0 || first.Think != 0 {
			t.Errorf("session %d's first turn: %+v", s, first)
		}
		for k, q := range turns {
			if q.Turn != k || q.At != first.At || q.API != first.API || q.MaxTokens < 50 || q.MaxTokens > 300 {
				t.Errorf("session %d turn %d: %+v", s, k, q)
			}
			if k == 0 {
				continue
			}
			prev := turns[k-1]
			if len(q.Parts) != len(prev.Parts)+2 || !slices.Equal(q.Parts[:len(prev.Parts)], prev.Parts) {
				t.Errorf("session %d turn %d does not resend turn %d's prompt and append two parts", s, k, k-1)
			}
			answer, tool := q.Parts[len(prev.Parts)], q.Parts[len(prev.Parts)+1]
			if answer.Tokens != prev.MaxTokens || tool.Tokens < 200 || tool.Tokens > 2000 || q.Think < time.Second || q.Think >= 5*time.Second {
				t.Errorf("session %d turn %d: answer %d tokens after %d asked, tool %d tokens, think %s", s, k, answer.Tokens, prev.MaxTokens, tool.Tokens, q.Think)
			}
			if want := map[bool]int{true: len(q.Parts) - 1, false: 0}[stored]; q.Stored != want {
				t.Errorf("session %d turn %d: Stored %d, want %d", s, k, q.Stored, want)
			}
			if stored && q.NewTokens() != tool.Tokens {
				t.Errorf("session %d turn %d carries %d new tokens, want the tool's %d", s, k, q.NewTokens(), tool.Tokens)
			}
		}
	}
	if want := map[string]int{"responses-stored": 20, "responses": 20, "messages": 20}; !reflect.DeepEqual(byAPI, want) {
		t.Errorf("sessions by API %v, want %v", byAPI, want)
	}
}

// accountFor checks that every request of w was served, refused, failed,
// failed as a follow-up or never sent, and that no ledger holds one.
func accountFor(t *testing.T, name string, w *Workload, res Result, bals []*balancer.Balancer) {
	t.Helper()
	if got := len(res.TTFT) + res.Refused + res.Failed + res.FailedFollowUps + res.Unsent; got != len(w.Requests) {
		t.Errorf("%s: served %d + refused %d + failed %d + failed follow-ups %d + unsent %d = %d, want %d requests",
			name, len(res.TTFT), res.Refused, res.Failed, res.FailedFollowUps, res.Unsent, got, len(w.Requests))
	}
	for _, bal := range bals {
		for _, be := range bal.Snapshot().Backends {
			if n := be.Ledger.InFlight(); n != 0 {
				t.Errorf("%s: %s still has %d in flight", name, be.ID, n)
			}
		}
	}
}

// TestStoredFollowUpsStayOnTheirServer: under llmlb's own policies every
// stored follow-up goes to the server that answered its previous turn,
// for the reason "stored", and none fails; open loop and closed.
func TestStoredFollowUpsStayOnTheirServer(t *testing.T) {
	w, err := Build("agentic", Params{Scale: 0.05, Rate: 2, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	prev := map[int]int{} // request -> its session's previous turn
	last := map[uint64]int{}
	for i, q := range w.Requests {
		if q.Turn > 0 {
			prev[i] = last[q.Session]
		}
		last[q.Session] = i
	}
	for _, policy := range []string{"default", "ttft-true-cache"} {
		for _, clients := range []int{0, 12} {
			res, bals, err := runAll(Cluster{Presets: Presets(4, -1), Policy: policy, Seed: 5, Clients: clients, Trace: clients == 0}, w)
			if err != nil {
				t.Fatal(err)
			}
			name := policy + map[bool]string{true: ", closed loop", false: ""}[clients > 0]
			accountFor(t, name, w, res, bals)
			if res.FollowUps == 0 || res.FailedFollowUps != 0 || res.Unsent != 0 {
				t.Errorf("%s: %d of %d stored follow-ups failed, %d turns unsent; want some sent and none failed", name, res.FailedFollowUps, res.FollowUps, res.Unsent)
			}
			if clients > 0 {
				continue
			}
			server := map[int]TraceRecord{}
			for _, rec := range res.Trace {
				server[rec.Request] = rec
			}
			checked := 0
			for i, q := range w.Requests {
				if q.Stored == 0 {
					continue
				}
				got, before := server[i], server[prev[i]]
				if got.Server != before.Server || got.Reason != string(balancer.ReasonStored) {
					t.Errorf("%s: stored follow-up %d went to %s (%s), its previous turn %d was answered by %s", name, i, got.Server, got.Reason, prev[i], before.Server)
				}
				checked++
			}
			if checked != res.FollowUps {
				t.Errorf("%s: %d stored follow-ups in the workload, %d sent", name, checked, res.FollowUps)
			}
		}
	}
}

// TestPeerFollowUpsFail: the endpoint picker's preset (epp), emulating the
// peer deployed on its own, routes a stored follow-up on its new input,
// which matches no server's prefix, by load: at this seed some land away
// from the server storing their previous response and fail, and their
// sessions send nothing more.
func TestPeerFollowUpsFail(t *testing.T) {
	w, err := Build("agentic", Params{Scale: 0.05, Rate: 2, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	res, bals, err := runAll(Cluster{Presets: Presets(4, -1), Policy: "epp", Seed: 5}, w)
	if err != nil {
		t.Fatal(err)
	}
	accountFor(t, "epp", w, res, bals)
	if res.FailedFollowUps == 0 || res.Unsent == 0 {
		t.Errorf("epp: %d of %d stored follow-ups failed, %d turns unsent; want some of each", res.FailedFollowUps, res.FollowUps, res.Unsent)
	}
	if res.Failed != 0 || res.Refused != 0 {
		t.Errorf("epp: %d failed, %d refused; want a failed follow-up counted only as one", res.Failed, res.Refused)
	}
	t.Logf("epp: %d of %d stored follow-ups failed, %d turns unsent", res.FailedFollowUps, res.FollowUps, res.Unsent)
}

// TestOwnPoliciesAreLlmlbs: the presets that follow stored responses as
// llmlb's proxy does are those whose Follows says they are llmlb's own, so
// a new one of ours is not taken for a peer.
func TestOwnPoliciesAreLlmlbs(t *testing.T) {
	n := 0
	for _, p := range balancer.Presets() {
		if own := strings.HasPrefix(p.Follows, "llmlb's"); p.FollowsStored != own {
			t.Errorf("preset %s: FollowsStored = %v, but its Follows reads %q", p.Name, p.FollowsStored, p.Follows)
		}
		if p.FollowsStored {
			n++
		}
	}
	if n == 0 {
		t.Error("no preset is llmlb's own")
	}
}

// TestAgenticThroughTheCommand: a short agentic run through `llmlb bench`
// prints the failed follow-ups beside TTFT and throughput, in the table,
// the JSON and a sweep's table, and the HTTP replay refuses the workload.
func TestAgenticThroughTheCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a.json")
	c := Command{Workloads: []string{"agentic"}, Policies: []string{"default", "epp"}, Backends: 4, Clients: 16, Seeds: 1,
		Params: Params{Scale: 0.03, Seed: 2}, JSONFile: file}
	var out strings.Builder
	if err := c.Run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "failed follow-ups") || !strings.Contains(out.String(), "unsent turns") {
		t.Errorf("table lacks the follow-up columns:\n%s", out.String())
	}
	var rep struct {
		Workloads []struct {
			Results []map[string]any `json:"results"`
		} `json:"workloads"`
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Workloads) != 1 {
		t.Fatalf("json %s: %v", b, err)
	}
	for _, r := range rep.Workloads[0].Results {
		for _, k := range []string{"ttft_p90", "output_tokens_per_s", "stored_follow_ups", "failed_follow_ups", "unsent_turns", "saturated_output_tokens_per_s"} {
			if _, ok := r[k]; !ok {
				t.Errorf("%v: JSON row lacks %q", r["policy"], k)
			}
		}
	}
	if r := rep.Workloads[0].Results[0]; r["policy"] != "default" || r["failed_follow_ups"] != 0.0 || !(r["stored_follow_ups"].(float64) > 0) {
		t.Errorf("default's row: %v", r)
	}
	t.Logf("\n%s", out.String())

	c.Sweep, c.Rates, c.JSONFile = true, "1", ""
	out.Reset()
	if err := c.Run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "failed of stored follow-ups") {
		t.Errorf("sweep table lacks the failed follow-ups:\n%s", out.String())
	}

	w, err := Build("agentic", Params{Scale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&HTTPReplay{URL: "http://127.0.0.1:1"}).Replay(context.Background(), w); err == nil || !strings.Contains(err.Error(), "earlier turns' answers") {
		t.Errorf("HTTP replay of agentic: %v, want a refusal", err)
	}
}
