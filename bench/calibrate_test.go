package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// captureOf runs w on four h100-8b servers perturbed by p, in virtual time,
// and writes what a capture of 128-token blocks would hold of it: each
// request's blocks as chained ids, its server, TTFT and duration.
func captureOf(t *testing.T, w *Workload, p Perturb) string {
	t.Helper()
	res, err := Run(Cluster{Presets: Presets(4, -1), Policy: DefaultPolicy, Seed: 1, Perturb: p, Pinned: true, Trace: true}, w)
	if err != nil {
		t.Fatal(err)
	}
	server := map[int]string{}
	for _, rec := range res.Trace {
		server[rec.Request] = rec.Server
	}
	var b bytes.Buffer
	var text []byte
	for i := range w.Requests {
		r := &w.Requests[i]
		times := res.ByRequest[i]
		if times.TTFT < 0 {
			t.Fatalf("request %d not served", i)
		}
		text = r.AppendText(text[:0])
		var ids []uint64
		for k := 0; k < len(text); k += 512 {
			ids = append(ids, xxhash.Sum64(text[:min(len(text), k+512)])&(1<<53-1))
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		line, _ := json.Marshal(map[string]any{"timestamp": r.At.Milliseconds(), "input_length": r.Tokens(), "output_length": r.MaxTokens,
			"hash_ids": ids, "block_tokens": 128, "backend": server[i], "status": 200, "ttft_ms": ms(times.TTFT),
			"duration_ms": ms(times.TTFT + times.TPOT*time.Duration(r.MaxTokens-1))})
		b.Write(append(line, '\n'))
	}
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCalibrateRecoversAKnownEngine: servers whose prefill runs at 0.7 times
// the preset's rate and whose steps cost 1.3 times as much answer a
// workload; the fit of their capture says so within 10%, and its TTFT
// percentiles are closer to the capture's than the preset's.
func TestCalibrateRecoversAKnownEngine(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	path := captureOf(t, w, Perturb{Prefill: 1 / 0.7, Decode: 1.3})
	cal, err := Calibrate(context.Background(), CalibrateOptions{Workload: TraceWorkload(path), Backends: 4, Slow: -1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fit %s over %d requests, %d runs", cal.Fit, len(w.Requests), cal.Runs)
	if rate := 1 / cal.Fit.Prefill; math.Abs(rate/0.7-1) > 0.1 {
		t.Errorf("fitted prefill rate %.3fx, want 0.7x within 10%% (fit %s)", rate, cal.Fit)
	}
	if math.Abs(cal.Fit.Decode/1.3-1) > 0.1 {
		t.Errorf("fitted decode cost %.3fx, want 1.3x within 10%% (fit %s)", cal.Fit.Decode, cal.Fit)
	}
	if len(cal.Presets) != 4 || cal.Timed != len(w.Requests) {
		t.Errorf("%d servers, %d timed requests of %d", len(cal.Presets), cal.Timed, len(w.Requests))
	}
	captured, preset, fitted := cal.Rows[0], cal.Rows[1], cal.Rows[2]
	if math.Abs(fitted.TTFTP90-captured.TTFTP90) >= math.Abs(preset.TTFTP90-captured.TTFTP90) || fitted.Error >= preset.Error {
		t.Errorf("the fit is no closer than the preset: captured %+v, preset %+v, fitted %+v", captured, preset, fitted)
	}
	var out bytes.Buffer
	WriteCalibration(&out, cal)
	if !strings.Contains(out.String(), "fitted: prefill rate 0.") || !strings.Contains(out.String(), "\ncaptured ") {
		t.Errorf("report:\n%s", out.String())
	}
}

// TestCalibrateNeedsTimedRequests: a trace without TTFTs (the Mooncake
// format alone) cannot be fitted, and says why.
func TestCalibrateNeedsTimedRequests(t *testing.T) {
	path := writeFile(t, "m.jsonl", `{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[1,2]}`)
	if _, err := Calibrate(context.Background(), CalibrateOptions{Workload: TraceWorkload(path)}); err == nil || !strings.Contains(err.Error(), "have a TTFT") {
		t.Errorf("Calibrate = %v, want an error about TTFTs", err)
	}
	if _, err := Calibrate(context.Background(), CalibrateOptions{Workload: "shared-prefix"}); err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("Calibrate of a built-in workload = %v", err)
	}
}

// TestNelderMead finds the minimum of a narrow valley that a search one
// coordinate at a time crawls along.
func TestNelderMead(t *testing.T) {
	f := func(u []float64) (float64, error) {
		a, b := u[0]+u[1]-1, u[0]-u[1]-0.4 // the minimum at (0.7, 0.3)
		return 100*a*a + b*b, nil
	}
	x, err := nelderMead(f, []float64{0, 0}, 0.5, 1e-9, 400)
	if err != nil || math.Abs(x[0]-0.7) > 0.01 || math.Abs(x[1]-0.3) > 0.01 {
		t.Errorf("nelderMead = %v (%v), want (0.7, 0.3)", x, err)
	}
}
