package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/prefix"
)

// testConfig is a capture of the Mooncake format's 512-token blocks.
func testConfig(t *testing.T) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "capture.jsonl")
	cfg.BlockTokens = BlockTokens // the Mooncake format's, which the tests count in
	return cfg
}

func open(t *testing.T, cfg Config, salt string, o Options) *Writer {
	t.Helper()
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	w, err := Open(cfg, []byte(salt), o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// readLines returns the JSON objects of a capture file, one a line.
func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

const testSalt = "a salt of at least sixteen bytes"

func TestLineFormat(t *testing.T) {
	cfg := testConfig(t)
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := open(t, cfg, testSalt, Options{Start: start})
	w.Add(Line{Arrived: start.Add(1532 * time.Millisecond), InputLength: 1210, OutputLength: 200, HashIDs: []uint64{7, 1<<53 - 1},
		Model: "llama \"3\"\n", Target: "llama-3.1-8b", API: "chat", Stream: true, Priority: -1, MaxTokens: 200,
		Session: 11, Conversation: 12, Usage: true, PromptTokens: 1210, CachedKnown: true, CachedTokens: 1024,
		Backend: "http://10.0.0.5:8000", Status: 200, TTFT: 41200 * time.Microsecond, Duration: 2210500 * time.Microsecond})
	w.Add(Line{Arrived: start.Add(-time.Second), InputLength: 3, HashIDs: []uint64{1}, Model: "m", API: "completions", Status: 503})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"timestamp":1532,"input_length":1210,"output_length":200,"hash_ids":[7,9007199254740991],"model":"llama \"3\"\u000a","target":"llama-3.1-8b","api":"chat","stream":true,"priority":-1,"max_tokens":200,"session":11,"conversation":12,"prompt_tokens":1210,"cached_tokens":1024,"backend":"http://10.0.0.5:8000","status":200,"ttft_ms":41.2,"duration_ms":2210.5}
{"timestamp":0,"input_length":3,"output_length":0,"hash_ids":[1],"model":"m","api":"completions","stream":false,"priority":0,"status":503,"duration_ms":0}
`
	if string(b) != want {
		t.Errorf("capture file:\n%s\nwant:\n%s", b, want)
	}
	readLines(t, cfg.Path) // valid JSON
	st, err := os.Stat(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if got := testutil.ToFloat64(w.m.lines); got != 2 {
		t.Errorf("lines counted %v, want 2", got)
	}
}

// TestTraceReaderReadsALine: a line decodes into the Mooncake fields as the
// bench's trace reader declares them (bench/workload.go traceLine).
func TestTraceReaderReadsALine(t *testing.T) {
	cfg := testConfig(t)
	w := open(t, cfg, testSalt, Options{})
	var l Line
	p := prefix.Parts{Glue: bytes.Repeat([]byte("x"), 5000)}
	w.Hash(&l, &p, 1)
	l.Arrived, l.InputLength = time.Now(), 1250
	w.Add(l)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(cfg.Path)
	var tl struct {
		Timestamp    int64    `json:"timestamp"`
		InputLength  int      `json:"input_length"`
		OutputLength int      `json:"output_length"`
		HashIDs      []uint64 `json:"hash_ids"`
	}
	if err := json.Unmarshal(b, &tl); err != nil {
		t.Fatal(err)
	}
	if tl.InputLength != 1250 || len(tl.HashIDs) != 3 || !slices.Equal(tl.HashIDs, l.HashIDs) {
		t.Errorf("read %+v, want 3 ids %v", tl, l.HashIDs)
	}
}

// TestBlockTokens: a capture of 64-token blocks has an id per 256 bytes,
// a prefix shared to the same whole blocks, and says its block on each
// line; one of the format's 512 does not.
func TestBlockTokens(t *testing.T) {
	for _, bt := range []int{64, 512} {
		cfg := testConfig(t)
		cfg.BlockTokens = bt
		w := open(t, cfg, testSalt, Options{})
		system := strings.Repeat("y", 1000)
		var a, b Line
		w.Hash(&a, &prefix.Parts{Glue: []byte(system + "first question")}, 1)
		w.Hash(&b, &prefix.Parts{Glue: []byte(system + "another one")}, 1)
		bb := 4 * bt
		if want := (1014 + bb - 1) / bb; len(a.HashIDs) != want {
			t.Errorf("%d tokens a block: %d ids for 1,014 bytes, want %d", bt, len(a.HashIDs), want)
		}
		if n := 1000 / bb; !slices.Equal(a.HashIDs[:n], b.HashIDs[:n]) || a.HashIDs[n] == b.HashIDs[n] {
			t.Errorf("%d tokens a block: %v and %v, want the first %d alike, not the next", bt, a.HashIDs, b.HashIDs, n)
		}
		a.Arrived, a.InputLength = time.Now(), 254
		w.Add(a)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		line, _ := os.ReadFile(cfg.Path)
		if has := strings.Contains(string(line), `],"block_tokens":64,"model":`); has != (bt == 64) {
			t.Errorf("%d tokens a block: line %s", bt, line)
		}
	}
}

func TestHashIDs(t *testing.T) {
	w := open(t, testConfig(t), testSalt, Options{})
	defer w.Close()
	other := open(t, testConfig(t), "another salt, sixteen bytes+", Options{})
	defer other.Close()
	system := strings.Repeat("You are a careful assistant. ", 200) // 5,800 bytes: two whole blocks and a part
	first := prefix.Parts{Glue: []byte(system + "Question one about tigers?"), FirstUser: len(system), FirstTurn: len(system) + 26}
	later := prefix.Parts{Glue: []byte(system + "Question one about tigers?" + strings.Repeat(" And more.", 400)), FirstUser: len(system), FirstTurn: len(system) + 26}
	var a, b, c, d Line
	w.Hash(&a, &first, 42)
	w.Hash(&b, &later, 42)
	other.Hash(&c, &first, 42)
	w.Hash(&d, &first, 43) // another model or cache_salt
	if len(a.HashIDs) != 3 || len(b.HashIDs) != 5 {
		t.Fatalf("ids %d and %d, want 3 (5,826 bytes) and 5 (9,826 bytes)", len(a.HashIDs), len(b.HashIDs))
	}
	if !slices.Equal(a.HashIDs[:2], b.HashIDs[:2]) || a.HashIDs[2] == b.HashIDs[2] {
		t.Errorf("shared prefix: %v and %v, want the two whole blocks alike, the partial third not", a.HashIDs, b.HashIDs)
	}
	if a.Conversation == 0 || a.Conversation != b.Conversation {
		t.Errorf("conversation keys %d and %d, want equal and set", a.Conversation, b.Conversation)
	}
	for i := range a.HashIDs {
		if a.HashIDs[i] == c.HashIDs[i] || a.HashIDs[i] == d.HashIDs[i] {
			t.Errorf("id %d: %d under one salt, %d under another, %d for another seed: want all different", i, a.HashIDs[i], c.HashIDs[i], d.HashIDs[i])
		}
		if a.HashIDs[i] > idMask {
			t.Errorf("id %d = %d, beyond 53 bits", i, a.HashIDs[i])
		}
	}
	if a.Conversation == c.Conversation || w.Key("s1") == other.Key("s1") || w.Key("s1") == w.Key("s2") || w.Key("") != 0 {
		t.Error("keys do not follow the salt and the value")
	}
	again := open(t, testConfig(t), testSalt, Options{})
	defer again.Close()
	var e Line
	again.Hash(&e, &first, 42)
	if !slices.Equal(a.HashIDs, e.HashIDs) {
		t.Errorf("the same salt gave %v, then %v", a.HashIDs, e.HashIDs)
	}
}

func TestRotationKeepsMaxFiles(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxBytes, cfg.MaxFiles = minMaxBytes, 2
	w := open(t, cfg, testSalt, Options{})
	ids := make([]uint64, 60) // about 1 KB a line
	for i := range ids {
		ids[i] = 1<<50 + uint64(i)
	}
	const n = 400
	for i := range n {
		w.Add(Line{InputLength: i + 1, HashIDs: slices.Clone(ids), Model: "m", API: "chat"})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var kept []int
	for _, p := range []string{cfg.Path + ".2", cfg.Path + ".1", cfg.Path} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if st.Size() > cfg.MaxBytes || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %d bytes, mode %v; want at most %d, 0600", p, st.Size(), st.Mode().Perm(), cfg.MaxBytes)
		}
		for _, l := range readLines(t, p) {
			kept = append(kept, int(l["input_length"].(float64)))
		}
	}
	if _, err := os.Stat(cfg.Path + ".3"); err == nil {
		t.Error("a third rotated file is kept, want 2")
	}
	// The files hold the last lines, in order, oldest file first.
	if len(kept) == 0 || kept[len(kept)-1] != n || !slices.IsSorted(kept) || kept[len(kept)-1]-kept[0] != len(kept)-1 {
		t.Errorf("kept lines %v..., want the last ones in order", kept[:min(5, len(kept))])
	}
	if got := testutil.ToFloat64(w.m.lines); got != n {
		t.Errorf("lines counted %v, want %d", got, n)
	}
}

// TestOpenRotatesAnOldCapture: a capture starts a file of its own; the
// one there before becomes PATH.1.
func TestOpenRotatesAnOldCapture(t *testing.T) {
	cfg := testConfig(t)
	if err := os.WriteFile(cfg.Path, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := open(t, cfg, testSalt, Options{})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(cfg.Path + ".1"); err != nil || string(b) != "old\n" {
		t.Errorf("PATH.1 = %q, %v; want the old capture", b, err)
	}
	if b, err := os.ReadFile(cfg.Path); err != nil || len(b) != 0 {
		t.Errorf("PATH = %q, %v; want a new, empty file", b, err)
	}
}

func TestSampled(t *testing.T) {
	cfg := testConfig(t)
	draws := []float64{0.1, 0.6, 0.3, 0.9}
	i := 0
	w := open(t, cfg, testSalt, Options{Rand: func() float64 { i++; return draws[(i-1)%len(draws)] }})
	defer w.Close()
	var got []bool
	for range draws {
		got = append(got, w.Sampled())
	}
	if want := []bool{true, true, true, true}; !slices.Equal(got, want) {
		t.Errorf("Sampled at 1 = %v, want every one", got)
	}
	i = 0
	w.SetSample(0.5)
	got = got[:0]
	for range draws {
		got = append(got, w.Sampled())
	}
	if want := []bool{true, false, true, false}; !slices.Equal(got, want) {
		t.Errorf("Sampled at 0.5 = %v, want %v", got, want)
	}
	w.SetSample(0)
	if w.Sampled() {
		t.Error("Sampled at 0 = true")
	}
}

func TestAddAfterCloseDrops(t *testing.T) {
	cfg := testConfig(t)
	w := open(t, cfg, testSalt, Options{})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w.Add(Line{InputLength: 1, HashIDs: []uint64{1}})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(w.m.full); got != 1 {
		t.Errorf("dropped %v, want 1", got)
	}
	if b, _ := os.ReadFile(cfg.Path); len(b) != 0 {
		t.Errorf("file %q, want empty", b)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"sample", func(c *Config) { c.Sample = 1.1 }, "capture.sample: must be a ratio from 0 to 1, got 1.1"},
		{"both salts", func(c *Config) { c.Salt, c.SaltFile = testSalt, "/run/secrets/salt" }, "capture.salt_file: set the salt once"},
		{"short salt", func(c *Config) { c.Salt = "short" }, "capture.salt: must be at least 16 bytes, got 5"},
		{"max bytes", func(c *Config) { c.MaxBytes = 1000 }, "capture.max_bytes: must be at least 65536"},
		{"max files", func(c *Config) { c.MaxFiles = 101 }, "capture.max_files: must be 0 to 100, got 101"},
		{"directory", func(c *Config) { c.Path = "/var/lib/" }, "capture.path: names a directory"},
		{"block tokens 0", func(c *Config) { c.BlockTokens = 0 }, "capture.block_tokens: must be 16 to 512 in steps of 16, got 0"},
		{"block tokens 520", func(c *Config) { c.BlockTokens = 520 }, "capture.block_tokens: must be 16 to 512 in steps of 16, got 520"},
		{"block tokens 100", func(c *Config) { c.BlockTokens = 100 }, "got 100"},
		{"block tokens 64", func(c *Config) { c.BlockTokens = 64 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.cfg(&c)
			err := c.Validate()
			if (tt.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestLoadSalt(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	_ = os.WriteFile(good, []byte(testSalt+"\n"), 0o600)
	_ = os.WriteFile(short, []byte("short\n"), 0o600)
	if s, err := (Config{SaltFile: good}).LoadSalt(); err != nil || string(s) != testSalt {
		t.Errorf("LoadSalt(good) = %q, %v", s, err)
	}
	if _, err := (Config{SaltFile: short}).LoadSalt(); err == nil || !strings.Contains(err.Error(), "capture.salt_file:") {
		t.Errorf("LoadSalt(short) = %v, want an error naming the key", err)
	}
	if _, err := (Config{SaltFile: filepath.Join(dir, "none")}).LoadSalt(); err == nil {
		t.Error("LoadSalt(missing) = nil")
	}
	if s, err := (Config{}).LoadSalt(); s != nil || err != nil {
		t.Errorf("LoadSalt() = %q, %v; want none", s, err)
	}
}
