package prefix

import (
	"encoding/json"
	"slices"
	"testing"
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

// FuzzPlainString: where plainString reads a JSON string without decoding
// it, encoding/json decodes it to the same text.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`"hello"`, `""`, `"a\"b"`, `"tab	"`, "\"\xff\"", `"é"`, `"unterminated`, `x`, `"a"b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, ok := plainString(raw)
		if !ok {
			return
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || s != string(p) {
			t.Fatalf("plainString(%q) = %q, encoding/json %q (%v)", raw, p, s, err)
		}
	})
}
