package e2e

import (
	"context"
	"io"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/bench"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/sim"
)

// TestCaptureReplaysAsTheLiveRun: traffic through `llmlb serve` in front of
// four servers running the vLLM V1 engine model in real time, with capture
// on, replays in the bench on the same engine model and fleet with the same
// request count, the same block structure (each line's ids as many as the
// request's blocks, and as many distinct ids as the traffic has distinct
// blocks), and a prefix-cache hit rate within 0.05 of what the servers
// reported live. The TTFT percentiles of both are logged, not judged: the
// live run's are real time on a shared machine (docs/benchmarks.md holds
// the comparison, measured apart).
func TestCaptureReplaysAsTheLiveRun(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: some 15 s")
	}
	const servers = 4
	cfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range servers {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewLive(cfg, 1))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	lcfg := testConfig(urls)
	lcfg.Capture.Path = filepath.Join(t.TempDir(), "capture.jsonl")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	inst, err := serve.Start(ctx, lcfg, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e2etest.WaitBackends(t, inst.AdminAddr, servers)
	w, err := bench.Build("shared-prefix", bench.Params{Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	live, err := (&bench.HTTPReplay{URL: "http://" + inst.Addr}).Replay(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := inst.Wait(); err != nil { // returns once the capture is written
		t.Fatal(err)
	}
	if live.Failed != 0 || live.Refused != 0 {
		t.Fatalf("live run: %d failed, %d refused", live.Failed, live.Refused)
	}

	name := bench.TraceWorkload(lcfg.Capture.Path)
	replay, err := bench.Build(name, bench.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if len(replay.Requests) != len(w.Requests) {
		t.Fatalf("%d requests replayed, %d sent", len(replay.Requests), len(w.Requests))
	}
	// The block structure: the capture's ids per request, and its distinct
	// ids, are the traffic's blocks of 128 tokens (512 bytes of prompt).
	const blockBytes = 512
	sent, captured := blockCounts(t, w, blockBytes), idCounts(t, lcfg.Capture.Path)
	if !slices.Equal(sent.perRequest, captured.perRequest) || sent.distinct != captured.distinct {
		t.Errorf("blocks sent: %d distinct, per request %v;\ncaptured: %d distinct, per request %v",
			sent.distinct, sent.perRequest, captured.distinct, captured.perRequest)
	}

	res, err := bench.Run(bench.Cluster{Presets: bench.Presets(servers, -1), Policy: bench.DefaultPolicy, Seed: 1}, replay)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := bench.Captured(name, bench.Params{})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	want := bench.Summarize(res)
	t.Logf("live (captured): TTFT p50 %.0f ms, p90 %.0f ms, hit rate %.3f; replayed: p50 %.0f ms, p90 %.0f ms, hit rate %.3f",
		1000*got.TTFTP50, 1000*got.TTFTP90, got.HitRate, 1000*want.TTFTP50, 1000*want.TTFTP90, want.HitRate)
	if len(res.TTFT) != len(w.Requests) || math.Abs(got.HitRate-want.HitRate) > 0.05 {
		t.Errorf("replay served %d of %d, hit rate %.3f; the live run's %.3f: want within 0.05", len(res.TTFT), len(w.Requests), want.HitRate, got.HitRate)
	}
}

// blocks is a trace's block structure: each request's blocks, sorted, and
// how many distinct blocks (prefixes through a block's end) all hold.
type blocks struct {
	perRequest []int
	distinct   int
}

// blockCounts is the block structure of w's prompts, as the proxy sends
// them: completions whose prompt is the request's text.
func blockCounts(t *testing.T, w *bench.Workload, size int) blocks {
	t.Helper()
	var b blocks
	seen := map[uint64]bool{}
	var text []byte
	for i := range w.Requests {
		text = w.Requests[i].AppendText(text[:0])
		n := (len(text) + size - 1) / size
		b.perRequest = append(b.perRequest, n)
		for k := 1; k <= n; k++ {
			seen[xxhash.Sum64(text[:min(len(text), k*size)])] = true
		}
	}
	slices.Sort(b.perRequest)
	b.distinct = len(seen)
	return b
}

// idCounts is the block structure of a capture file.
func idCounts(t *testing.T, path string) blocks {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var b blocks
	seen := map[uint64]bool{}
	for _, l := range parseCapture(t, raw) {
		b.perRequest = append(b.perRequest, len(l.HashIDs))
		for _, id := range l.HashIDs {
			seen[id] = true
		}
	}
	slices.Sort(b.perRequest)
	b.distinct = len(seen)
	return b
}
