package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// writeFile writes lines to a file of their own in a test directory.
func writeFile(t *testing.T, name string, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTraceFileReplaysACapture: a capture's lines, written in the order
// their requests ended, replay in arrival order with the block structure,
// priority, session and conversation they recorded; the rotated file and
// the current one read as one trace.
func TestTraceFileReplaysACapture(t *testing.T) {
	older := writeFile(t, "capture.jsonl.1",
		`{"timestamp":40,"input_length":1100,"output_length":7,"hash_ids":[11,12,13],"model":"m","api":"chat","priority":-1,"session":77,"conversation":5,"status":200,"ttft_ms":30,"duration_ms":90,"prompt_tokens":1100,"cached_tokens":1024,"backend":"a"}`)
	current := writeFile(t, "capture.jsonl",
		`{"timestamp":20,"input_length":700,"output_length":0,"max_tokens":9,"hash_ids":[11,14],"api":"messages","conversation":5,"status":200,"ttft_ms":10,"duration_ms":50,"prompt_tokens":700,"cached_tokens":512,"backend":"b"}`,
		``,
		`{"timestamp":10,"input_length":1300,"output_length":3,"hash_ids":[21,22,23],"api":"responses","status":429}`)
	w, err := Build(TraceWorkload(older, current), Params{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 3 {
		t.Fatalf("%d requests, want 3", len(w.Requests))
	}
	r0, r1, r2 := w.Requests[0], w.Requests[1], w.Requests[2]
	if r0.At != 10e6 || r1.At != 20e6 || r2.At != 40e6 {
		t.Errorf("arrivals %v %v %v, want 10ms, 20ms, 40ms", r0.At, r1.At, r2.At)
	}
	if len(r0.Parts) != 3 || r0.Parts[0].Tokens != 512 || r0.Parts[2].Tokens != 276 || r0.API != APIResponses {
		t.Errorf("request 0: %+v, want 512, 512 and 276 tokens, the Responses API", r0)
	}
	if r1.Parts[0] != r2.Parts[0] || r1.Parts[1] == r2.Parts[1] || r1.Tokens() != 700 || r2.Tokens() != 1100 {
		t.Errorf("requests 1 and 2 share id 11 only: %+v and %+v", r1.Parts, r2.Parts)
	}
	if r1.MaxTokens != 9 || r2.MaxTokens != 7 || r0.MaxTokens != 3 {
		t.Errorf("output tokens %d %d %d, want 3, 9 (max_tokens when none was reported), 7", r0.MaxTokens, r1.MaxTokens, r2.MaxTokens)
	}
	if r2.Priority != -1 || r2.Affinity == "" || r1.Affinity != "" || r1.API != APIMessages {
		t.Errorf("request 2: priority %d, affinity %q; request 1: affinity %q, api %v", r2.Priority, r2.Affinity, r1.Affinity, r1.API)
	}
	// Conversation 5's lines share one leading id: their first turn.
	if u1, e1 := r1.FirstTurn(); u1 != 0 || e1 != 4*512 {
		t.Errorf("request 1's first turn: %d-%d, want 0-2048", u1, e1)
	}
	if _, e2 := r2.FirstTurn(); e2 != 4*512 {
		t.Errorf("request 2's first turn ends at %d, want 2048", e2)
	}
	if _, e0 := r0.FirstTurn(); e0 != 0 {
		t.Errorf("request 0 has no conversation, yet a first turn to %d", e0)
	}
	row, ok, err := Captured(TraceWorkload(older, current), Params{})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if row.Policy != "captured" || row.Refused != 1 || row.TTFTP50 != 0.01 || row.TTFTP90 != 0.03 || row.HitRate != float64(1536)/1800 {
		t.Errorf("captured row %+v: want 1 refused, TTFT 10 and 30 ms, hit rate 1536/1800", row)
	}
}

// TestTraceFileBlockTokens: ids stand for 512 tokens when nine lines in
// ten fit that, as in the Mooncake traces; a capture from a server whose tokenizer
// reads fewer bytes a token has more tokens an id, found from its lines.
func TestTraceFileBlockTokens(t *testing.T) {
	mooncake := []traceLine{{InputLength: 1000, HashIDs: []uint64{1, 2}}, {InputLength: 512, HashIDs: []uint64{1}}}
	if b := blockTokens(mooncake, 512); b != 512 {
		t.Errorf("Mooncake-shaped lines: %d tokens an id, want 512", b)
	}
	// 2,048 bytes an id at 2 bytes a token: 1,024 tokens.
	dense := []traceLine{{InputLength: 1536, HashIDs: []uint64{1, 2}}, {InputLength: 2560, HashIDs: []uint64{1, 3, 4}}, {InputLength: 3584, HashIDs: []uint64{5, 6, 7, 8}}}
	if b := blockTokens(dense, 512); b != 1024 {
		t.Errorf("2 bytes a token: %d tokens an id, want 1024", b)
	}
	// A line with more tokens than its ids, among nine that fit: a tail no
	// other request shares.
	var lines []string
	for i := range 9 {
		lines = append(lines, `{"timestamp":`+strconv.Itoa(i)+`,"input_length":600,"output_length":1,"hash_ids":[1,2]}`)
	}
	lines = append(lines, `{"timestamp":9,"input_length":1300,"output_length":1,"hash_ids":[1]}`)
	w, err := Build(TraceWorkload(writeFile(t, "tail.jsonl", lines...)), Params{})
	if err != nil {
		t.Fatal(err)
	}
	if r := w.Requests[9]; len(r.Parts) != 2 || r.Parts[0] != w.Requests[0].Parts[0] || r.Parts[1].Tokens != 788 || r.Parts[1].ID == w.Requests[0].Parts[1].ID {
		t.Errorf("1,300 tokens on one id: %+v, want its 512 tokens and a tail of 788 of its own", r.Parts)
	}
	// A capture of 64-token blocks.
	w, err = Build(TraceWorkload(writeFile(t, "64.jsonl",
		`{"timestamp":0,"input_length":100,"output_length":1,"hash_ids":[1,2],"block_tokens":64}`,
		`{"timestamp":1,"input_length":70,"output_length":1,"hash_ids":[1,3],"block_tokens":64}`)), Params{})
	if err != nil {
		t.Fatal(err)
	}
	if p := w.Requests[0].Parts; len(p) != 2 || p[0].Tokens != 64 || p[1].Tokens != 36 || w.Requests[1].Parts[0] != p[0] {
		t.Errorf("64-token blocks: %+v", p)
	}
	if _, err := Build(TraceWorkload(writeFile(t, "mixed.jsonl",
		`{"timestamp":0,"input_length":100,"output_length":1,"hash_ids":[1,2],"block_tokens":64}`,
		`{"timestamp":1,"input_length":70,"output_length":1,"hash_ids":[1]}`)), Params{}); err == nil || !strings.Contains(err.Error(), "lines of 64 and of 512 tokens a block") {
		t.Errorf("lines of two blocks: %v", err)
	}
	w, err = Build(TraceWorkload(writeFile(t, "t.jsonl",
		`{"timestamp":0,"input_length":1536,"output_length":1,"hash_ids":[1,2]}`,
		`{"timestamp":1,"input_length":2560,"output_length":1,"hash_ids":[1,3,4]}`,
		`{"timestamp":2,"input_length":3584,"output_length":1,"hash_ids":[5,6,7,8]}`)), Params{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range w.Requests {
		if r.Tokens() != dense[i].InputLength || r.Parts[0].Tokens != 1024 {
			t.Errorf("request %d: %+v, want %d tokens in blocks of 1024", i, r.Parts, dense[i].InputLength)
		}
	}
}

// TestTraceFileErrors: a bad line is an error naming its file and line;
// nothing is replayed of a trace with one.
func TestTraceFileErrors(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"timestamp":1,"input_length":0,"hash_ids":[1]}`, "input_length 0"},
		{`{"timestamp":-5,"input_length":3,"hash_ids":[1]}`, "timestamp -5"},
		{`{"timestamp":1,"input_length":3,"output_length":-1,"hash_ids":[1]}`, "output_length -1"},
		{`{"timestamp":1,"input_length":3,`, "unexpected end of JSON input"},
		{`{"timestamp":"soon","input_length":3}`, "cannot unmarshal"},
	} {
		file := writeFile(t, "bad.jsonl", `{"timestamp":0,"input_length":1,"hash_ids":[1]}`, tc.line)
		_, err := Build(TraceWorkload(file), Params{})
		if err == nil || !strings.Contains(err.Error(), file+":2:") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error at %s:2 saying %q", tc.line, err, file, tc.want)
		}
	}
	if _, err := Build(TraceWorkload(filepath.Join(t.TempDir(), "missing.jsonl")), Params{}); err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("a missing file: %v, want a --trace error", err)
	}
	if _, err := Build(TraceWorkload(writeFile(t, "empty.jsonl", "")), Params{}); err == nil || !strings.Contains(err.Error(), "no requests") {
		t.Errorf("an empty file: %v, want an error saying it has no requests", err)
	}
}

// TestTraceCommandAddsCapturedRow: `llmlb bench --trace FILE` replays the
// file alone; at its own rate its table ends with the captured row, at
// another it does not, the live run having been at its own.
func TestTraceCommandAddsCapturedRow(t *testing.T) {
	var lines []string
	for i := range 40 {
		lines = append(lines, `{"timestamp":`+strconv.Itoa(i*50)+`,"input_length":900,"output_length":20,"hash_ids":[1,`+strconv.Itoa(100+i)+`],"status":200,"ttft_ms":40,"duration_ms":400,"prompt_tokens":900,"cached_tokens":512,"backend":"a"}`)
	}
	file := writeFile(t, "capture.jsonl", lines...)
	for _, rate := range []float64{1, 2} {
		var out bytes.Buffer
		c := Command{TraceFiles: []string{file}, Policies: []string{"default", "round-robin"}, Backends: 2, Slow: -1, Params: Params{Rate: rate, Seed: 1}, Seeds: 1}
		if err := c.Run(context.Background(), &out); err != nil {
			t.Fatal(err)
		}
		got := out.String()
		if strings.Count(got, "requests, 2 servers") != 1 || !strings.Contains(got, "trace:"+file+": 40 requests") {
			t.Errorf("rate x%g: want the trace's table alone:\n%s", rate, got)
		}
		if has := strings.Contains(got, "\ncaptured "); has != (rate == 1) {
			t.Errorf("rate x%g: captured row shown %v:\n%s", rate, has, got)
		}
	}
}

// FuzzParseTraceLine: no line makes the parser panic, and a line it takes
// has a prompt and a place in time.
func FuzzParseTraceLine(f *testing.F) {
	f.Add([]byte(`{"timestamp":27482,"input_length":6955,"output_length":52,"hash_ids":[46,47,2353]}`))
	f.Add([]byte(`{"timestamp":1,"input_length":3,"hash_ids":[],"session":1,"conversation":2,"prompt_tokens":3,"cached_tokens":null,"ttft_ms":1.5}`))
	f.Add([]byte(`{"timestamp":1e30,"input_length":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := parseTraceLine(b)
		if err == nil && (l.InputLength < 1 || l.Timestamp < 0 || l.OutputLength < 0) {
			t.Errorf("%q parsed to %+v", b, l)
		}
	})
}
