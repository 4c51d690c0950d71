package bench

import (
	"strings"
	"testing"
)

// TestTraceRecordsEveryServedRequest: a traced run has one record a served
// request, whose prompt and cached tokens add up to the run's; what a
// server held at the pick is never more than the most any held; tracing
// reads the engines without changing the run; and on shared-prefix, where
// a group's later requests find their prefix cached, the picks' records
// show it held.
func TestTraceRecordsEveryServedRequest(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	c := Cluster{Presets: Presets(4, 1), Policy: "default", Seed: 3, Replicas: 2}
	plain, _, err := runWith(c, w)
	if err != nil {
		t.Fatal(err)
	}
	c.Trace = true
	res, _, err := runWith(c, w)
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Trace) != 0 {
		t.Errorf("untraced run has %d records", len(plain.Trace))
	}
	if len(res.Trace) != len(res.TTFT) || len(res.TTFT) != len(plain.TTFT) {
		t.Fatalf("%d records for %d served requests (%d untraced)", len(res.Trace), len(res.TTFT), len(plain.TTFT))
	}
	for i := range res.TTFT {
		if res.TTFT[i] != plain.TTFT[i] {
			t.Fatalf("request %d: TTFT %v traced, %v not: tracing changed the run", i, res.TTFT[i], plain.TTFT[i])
		}
	}
	var prompt, cached int64
	held, replicas := 0, map[int]bool{}
	seen := map[int]bool{}
	for _, r := range res.Trace {
		prompt += int64(r.PromptTokens)
		cached += int64(r.CachedTokens)
		if seen[r.Request] || r.Request < 0 || r.Request >= len(w.Requests) {
			t.Fatalf("record for request %d twice or out of range", r.Request)
		}
		seen[r.Request] = true
		replicas[r.Replica] = true
		if r.HeldTokens > r.BestHeldTokens || r.BestServer == "" || !strings.HasPrefix(r.Server, "sim-") || r.Reason == "" ||
			r.TTFTS <= 0 || r.LeftTokens < 0 || r.BestLeftTokens < 0 || r.CachedTokens > r.PromptTokens {
			t.Fatalf("record %+v", r)
		}
		if r.LeastLeftTokens > r.LeftTokens || r.LeastLeftTokens > r.BestLeftTokens || r.LeastServer == "" ||
			r.LeastLeftTokens == r.LeftTokens && r.LeastServer != r.Server {
			t.Fatalf("least prefill left: %+v", r)
		}
		if r.HeldTokens == r.BestHeldTokens && r.BestServer != r.Server {
			t.Fatalf("a tie names another server as best: %+v", r)
		}
		if r.HeldTokens > 0 {
			held++
		}
	}
	if prompt != res.PromptTokens || cached != res.CachedTokens {
		t.Errorf("records add to %d prompt / %d cached tokens, the run to %d / %d", prompt, cached, res.PromptTokens, res.CachedTokens)
	}
	if held < len(res.Trace)/2 || len(replicas) != 2 {
		t.Errorf("%d of %d picks found their prefix held; replicas %v", held, len(res.Trace), replicas)
	}
}
