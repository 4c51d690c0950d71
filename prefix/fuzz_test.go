package prefix

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"unicode/utf8"
)

// FuzzHashPrompt checks the hash chain's properties on any input:
// deterministic, and the hashes of a prefix are a prefix of the hashes.
func FuzzHashPrompt(f *testing.F) {
	f.Add([]byte("hello world, this is a prompt"), 3, 7)
	f.Add([]byte{}, 1, 0)
	f.Fuzz(func(t *testing.T, data []byte, block, cut int) {
		block = 1 + abs(block)%64
		cut = abs(cut) % (len(data) + 1)
		a := AppendHashes(nil, 7, data, block, 1<<20)
		if b := AppendHashes(nil, 7, data, block, 1<<20); !slices.Equal(a, b) {
			t.Fatal("not deterministic")
		}
		if len(a) != len(data)/block {
			t.Fatalf("%d hashes for %d bytes in blocks of %d", len(a), len(data), block)
		}
		p := AppendHashes(nil, 7, data[:cut], block, 1<<20)
		if !slices.Equal(p, a[:len(p)]) {
			t.Fatal("hashes of a prefix are not a prefix of the hashes")
		}
	})
}

// FuzzCanonical feeds arbitrary JSON to both canonicalisers: they never
// panic, and equal input gives equal bytes.
func FuzzCanonical(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":[{"type":"text","text":"x"}],"tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}]`), []byte(`[{"type":"function"}]`))
	f.Add([]byte(`"abc"`), []byte(`null`))
	f.Add([]byte(`[[1,2],[3]]`), []byte(``))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		c1, err1 := AppendChat(nil, json.RawMessage(a), json.RawMessage(b))
		c2, err2 := AppendChat(nil, json.RawMessage(a), json.RawMessage(b))
		if (err1 == nil) != (err2 == nil) || !slices.Equal(c1, c2) {
			t.Fatal("AppendChat not deterministic")
		}
		if u := FirstUserText(json.RawMessage(a), 100); utf8.RuneCount(u) > 100 {
			t.Fatalf("FirstUserText gave %d runes, want at most 100", utf8.RuneCount(u))
		}
		p1, err1 := AppendCompletion(nil, json.RawMessage(a))
		p2, err2 := AppendCompletion(nil, json.RawMessage(a))
		if (err1 == nil) != (err2 == nil) || !slices.Equal(p1, p2) {
			t.Fatal("AppendCompletion not deterministic")
		}
		if err1 == nil && len(p1) == 0 {
			t.Fatal("accepted prompt with no bytes")
		}
	})
}

func abs(n int) int {
	if n < 0 {
		if n == -n { // MinInt
			return 0
		}
		return -n
	}
	return n
}

// FuzzScanMessages: where scanMessages decodes a messages array, it gets
// what encoding/json gets; a plain chat request takes that path.
func FuzzScanMessages(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":"hi"}]`,
		`[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"}],"name":"n"}]`,
		`[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}]`,
		`[{"role":"tool","tool_call_id":"c1","content":"42"},{"role":"assistant","reasoning_content":"hm","content":"x"}]`,
		`[{"Role":"user","content":"x"}]`, `[{"role":5}]`, `[null]`, `[1]`, `[]`, `[{"role":"u","role":null}]`,
		`[{"rol\u0065":"user","content":"e\u0301"}]`, `[{"role":"user","content":"x"}`, `{"role":"user"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := scanMessages(raw)
		if !ok {
			return
		}
		var want []message
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("scanMessages took %q, encoding/json refuses it: %v", raw, err)
		}
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nscan %+v\njson %+v", raw, got, want)
		}
	})
}

func TestScanMessagesTakesPlainChat(t *testing.T) {
	raw := []byte(`[{"role":"system","content":"You are helpful."},{"role":"user","content":"word word"}]`)
	if _, ok := scanMessages(raw); !ok {
		t.Fatal("a plain chat request left to encoding/json")
	}
}
