package bench

import (
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// TestSharedPrefixStaysThenSpills is the affinity test in virtual
// time, on four emulated H100s behind the default policy. Ten requests
// share a 4,000-token system prompt, one every half second: each goes to
// the server holding the prompt (the first one's). Then thirty arrive at
// once. The holder takes the first of them, and more than the others,
// until its queue and batch make prefilling the whole prompt elsewhere
// cheaper by the copy margin (copy_margin); then one second server
// takes the overflow, and with it the prompt: the burst is not all on
// the holder, and the prompt stays on those two.
func TestSharedPrefixStaysThenSpills(t *testing.T) {
	w := &Workload{}
	for i := range 40 {
		at := time.Duration(i) * 500 * time.Millisecond
		if i >= 10 {
			at = 5 * time.Second
		}
		w.Requests = append(w.Requests, Request{At: at, Parts: []Part{{ID: 1, Tokens: 4000}, {ID: 1000 + uint64(i), Tokens: 30}},
			System: 1, MaxTokens: 100})
	}
	bc := balancer.DefaultConfig()
	res, err := Run(Cluster{Presets: Presets(4, -1), Balancer: &bc, Seed: 1, Trace: true}, w)
	if err != nil {
		t.Fatal(err)
	}
	trace := slices.Clone(res.Trace)
	slices.SortFunc(trace, func(a, b TraceRecord) int { return a.Request - b.Request })
	if len(trace) != 40 {
		t.Fatalf("%d of 40 requests served", len(trace))
	}
	holder := trace[0].Server
	for _, r := range trace[1:10] {
		if r.Server != holder || r.HeldTokens < 4000-16 {
			t.Errorf("one at a time, request %d went to %s holding %d tokens of its prompt, want %s, which holds the 4,000 shared", r.Request, r.Server, r.HeldTokens, holder)
		}
	}
	burst := map[string]int{}
	for _, r := range trace[10:] {
		burst[r.Server]++
	}
	t.Logf("30 at once after %s took 10: %v", holder, burst)
	if trace[10].Server != holder {
		t.Errorf("the burst's first request went to %s, want the holder %s", trace[10].Server, holder)
	}
	if burst[holder] == 30 {
		t.Errorf("the holder took all 30 at once; want the overflow on a second server")
	}
	if len(burst) > 2 {
		t.Errorf("the burst went to %d servers %v; want the holder and one copy", len(burst), burst)
	}
	for id, n := range burst {
		if id != holder && n >= burst[holder] {
			t.Errorf("%s took %d of the burst, the holder %s %d; want the holder the most", id, n, holder, burst[holder])
		}
	}
}
