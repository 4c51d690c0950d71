package bench

import (
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// tracePrefix starts the name of a workload replayed from trace files:
// "trace:" and their paths, comma-separated ([TraceWorkload]).
const tracePrefix = "trace:"

// TraceWorkload names the workload that replays the given trace files,
// read as one trace ([Build]): a capture (`capture:` in llmlb's config),
// its rotated files, or any trace in the Mooncake format.
func TraceWorkload(files ...string) string { return tracePrefix + strings.Join(files, ",") }

// traceFiles returns the files a workload name replays, if it names any.
func traceFiles(name string) ([]string, bool) {
	rest, ok := strings.CutPrefix(name, tracePrefix)
	if !ok {
		return nil, false
	}
	return split(rest), true
}

// split returns the non-empty comma-separated fields of s.
func split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// fileTrace is a trace read from files: its lines in arrival order, and the
// tokens each of its hash ids stands for.
type fileTrace struct {
	lines []traceLine
	block int
}

// first returns the trace's first share of lines, as --scale cuts it (0:
// all of them).
func (ft *fileTrace) first(scale float64) []traceLine {
	if scale > 0 && scale < 1 {
		return ft.lines[:max(1, int(float64(len(ft.lines))*scale))]
	}
	return ft.lines
}

// loadFiles returns the lines of the trace files, parsed once per ts.
func (ts *Traces) loadFiles(files []string) (*fileTrace, error) {
	key := strings.Join(files, "\x00")
	if ts == nil {
		return readTraceFiles(files)
	}
	v, _ := ts.m.LoadOrStore("file\x00"+key, new(parsedFiles))
	pf := v.(*parsedFiles)
	pf.once.Do(func() { pf.t, pf.err = readTraceFiles(files) })
	return pf.t, pf.err
}

type parsedFiles struct {
	once sync.Once
	t    *fileTrace
	err  error
}

// readTraceFiles reads and merges trace files. A capture writes each line
// when its request ends, so lines are sorted by their timestamps (stably:
// lines of one millisecond keep their order). A file ending in .gz is
// read through gzip.
func readTraceFiles(files []string) (*fileTrace, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("bench: %s names no file", tracePrefix)
	}
	var lines []traceLine
	for _, file := range files {
		var err error
		if lines, err = readTraceFile(file, lines); err != nil {
			return nil, err
		}
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("bench: %s: no requests", strings.Join(files, ", "))
	}
	nominal := lines[0].BlockTokens
	for _, t := range lines {
		if t.BlockTokens != nominal {
			return nil, fmt.Errorf("bench: --trace: lines of %d and of %d tokens a block (block_tokens; none is 512): files of two captures", cmp.Or(nominal, 512), cmp.Or(t.BlockTokens, 512))
		}
	}
	slices.SortStableFunc(lines, func(a, b traceLine) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
	return &fileTrace{lines: lines, block: blockTokens(lines, cmp.Or(nominal, 512))}, nil
}

func readTraceFile(file string, lines []traceLine) ([]traceLine, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("bench: --trace reads a trace, and %w (--record FILE writes one line a served request)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("bench: --trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(file, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("bench: --trace: %s: %w", file, err)
		}
		r = zr
	}
	lines, err = scanTrace(r, file, lines)
	if err != nil {
		return nil, fmt.Errorf("bench: --trace: %w", err)
	}
	return lines, nil
}

// blockTokens is the prompt tokens a trace's hash id stands for: the
// nominal block (512 in the Mooncake traces, a capture's block_tokens)
// when nine lines in ten fit their ids so; else the median over the lines
// of several ids of input length over ids, the last taken as half full (a
// capture's id is 4 bytes of prompt a nominal token, so a tokenizer that
// reads fewer bytes a token counts more tokens an id).
func blockTokens(lines []traceLine, nominal int) int {
	mooncake := nominal
	fit, with := 0, 0
	var per []float64
	for _, t := range lines {
		n := len(t.HashIDs)
		if n == 0 {
			continue
		}
		with++
		if t.InputLength > mooncake*(n-1) && t.InputLength <= mooncake*n {
			fit++
		}
		if n > 1 {
			per = append(per, float64(t.InputLength)/(float64(n)-0.5))
		}
	}
	if 10*fit >= 9*with || len(per) == 0 {
		return mooncake
	}
	slices.Sort(per)
	return max(1, int(math.Round(per[len(per)/2])))
}

// fromFiles replays trace files: each hash id a block of the trace's block
// tokens of text of its own, the last cut to the input length and any
// length past the ids a tail no other request shares. The capture's
// fields beyond the Mooncake format are kept: the priority, the session
// header's key (for affinity), the conversation (lines of one conversation
// share their first turn, the leading ids all its lines share), and the
// API. Every line is replayed as one base model.
func fromFiles(name string, files []string, p Params) (*Workload, error) {
	ft, err := p.Traces.loadFiles(files)
	if err != nil {
		return nil, err
	}
	lines := ft.first(p.Scale)
	turns := firstTurns(lines)
	r := rate(name, p)
	w := &Workload{Rate: r}
	for i, t := range lines {
		out := t.OutputLength
		if out <= 0 {
			out = t.MaxTokens
		}
		req := Request{At: time.Duration(float64(t.Timestamp) / r * float64(time.Millisecond)), MaxTokens: max(1, out),
			Priority: t.Priority, API: traceAPI(t.API)}
		if t.Session != 0 {
			req.Affinity = strconv.FormatUint(t.Session, 36)
		}
		req.Backend = t.Backend
		left := t.InputLength
		for _, id := range t.HashIDs {
			n := min(ft.block, left)
			if n <= 0 {
				break
			}
			req.Parts = append(req.Parts, Part{ID: id + 1<<60, Tokens: n})
			left -= n
		}
		if left > 0 { // a prompt longer than its ids, or with none
			req.Parts = append(req.Parts, Part{ID: uint64(i) + 1<<61, Tokens: left})
		}
		if k := turns[t.Conversation]; t.Conversation != 0 && k > 0 {
			req.FirstParts = min(k, len(req.Parts))
		}
		w.Requests = append(w.Requests, req)
	}
	return w, nil
}

// firstTurns returns, for each conversation of two lines or more, the
// leading ids all its lines share: the first turn's whole blocks.
func firstTurns(lines []traceLine) map[uint64]int {
	first := map[uint64]int{} // conversation -> the index of its first line
	turns := map[uint64]int{}
	for i, t := range lines {
		if t.Conversation == 0 {
			continue
		}
		j, seen := first[t.Conversation]
		if !seen {
			first[t.Conversation] = i
			continue
		}
		shared := commonPrefix(lines[j].HashIDs, t.HashIDs)
		if k, ok := turns[t.Conversation]; ok {
			shared = min(shared, k)
		}
		turns[t.Conversation] = shared
	}
	return turns
}

func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// traceAPI is the bench's API for a capture's api field: a completion is
// replayed as a chat, which the emulation routes alike.
func traceAPI(api string) API {
	switch api {
	case "responses":
		return APIResponses
	case "messages":
		return APIMessages
	}
	return APIChat
}

// Captured is what a trace recorded of its own requests, as the servers
// and llmlb saw them live: its row ([Row], policy "captured") beside the
// replay's at the capture's own rate. Its TTFT is from sending each request
// to a backend, without the time it waited in llmlb's admission queue; its
// hit rate is the servers' reported cached prompt tokens over their prompt
// tokens, over the lines that report both.
func Captured(name string, p Params) (Row, bool, error) {
	files, ok := traceFiles(name)
	if !ok {
		return Row{}, false, nil
	}
	ft, err := p.Traces.loadFiles(files)
	if err != nil {
		return Row{}, false, err
	}
	lines := ft.first(p.Scale)
	res := Result{Policy: "captured"}
	perBE := map[string]int{}
	var first, last time.Duration
	known := false
	for i, t := range lines {
		at := time.Duration(t.Timestamp) * time.Millisecond
		if i == 0 {
			first = at
		}
		if t.Status == 0 && t.TTFTms == 0 {
			continue // a trace that is not a capture
		}
		known = true
		switch {
		case t.Status == 429 || t.Status == 503:
			res.Refused++
			continue
		case t.Status != 200 && t.Status != 0:
			res.Failed++
			continue
		}
		if t.TTFTms > 0 {
			res.TTFT = append(res.TTFT, time.Duration(t.TTFTms*float64(time.Millisecond)))
		}
		if t.DurationMs > 0 {
			res.E2E = append(res.E2E, time.Duration(t.DurationMs*float64(time.Millisecond)))
			last = max(last, at+time.Duration(t.DurationMs*float64(time.Millisecond)))
		}
		res.OutputTokens += int64(t.OutputLength)
		if t.PromptTokens != nil && t.CachedTokens != nil {
			res.PromptTokens += int64(*t.PromptTokens)
			res.CachedTokens += int64(*t.CachedTokens)
		}
		if t.Backend != "" {
			perBE[t.Backend]++
		}
	}
	if !known {
		return Row{}, false, nil
	}
	res.Duration = last - first
	for _, n := range perBE {
		res.PerBackend = append(res.PerBackend, n)
	}
	return Summarize(res), true, nil
}
