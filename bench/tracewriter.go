package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

// TraceWriter writes `llmlb bench --record`'s file: one JSON line a served
// request, its run's workload, policy, replicas and seed, then its
// [TraceRecord]. The file is opened at once, so that a path it cannot
// write is refused before any run, but emptied only when the first run's
// records come: a command refused for a bad flag leaves a trace already
// there as it was. A TraceWriter is not safe for concurrent use; [Bench]
// calls [Options].Trace from one goroutine.
type TraceWriter struct {
	f       *os.File
	w       *bufio.Writer
	enc     *json.Encoder
	seed    uint64
	started bool  // the file has been emptied
	err     error // the first error, after which nothing more is written
}

// traceRunLine is one line of the trace: the run, then its request's record.
type traceRunLine struct {
	Workload string `json:"workload"`
	Policy   string `json:"policy"`
	Replicas int    `json:"replicas"`
	Seed     uint64 `json:"seed"`
	TraceRecord
}

// NewTraceWriter opens file for a trace of runs made with seed, creating
// it if need be, without emptying it.
func NewTraceWriter(file string, seed uint64) (*TraceWriter, error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: --record: %w", err)
	}
	w := bufio.NewWriter(f)
	return &TraceWriter{f: f, w: w, enc: json.NewEncoder(w), seed: seed}, nil
}

// WriteRun writes a line for each of run's records, emptying the file
// first if it is the first run. Its signature is [Options].Trace's; an
// error is kept for [TraceWriter.Close] to return.
func (t *TraceWriter) WriteRun(run TraceRun) {
	if !t.started && t.err == nil {
		t.started = true
		t.err = t.f.Truncate(0)
	}
	for _, rec := range run.Records {
		if t.err != nil {
			return
		}
		t.err = t.enc.Encode(traceRunLine{Workload: run.Workload, Policy: run.Policy, Replicas: run.Replicas, Seed: t.seed, TraceRecord: rec})
	}
}

// Close flushes and closes the file and returns the first error of the
// writer's life.
func (t *TraceWriter) Close() error {
	err := t.err
	if ferr := t.w.Flush(); err == nil {
		err = ferr
	}
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: --record: %w", err)
	}
	return nil
}
