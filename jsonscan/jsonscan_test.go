package jsonscan

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzObject: Object accepts exactly the objects encoding/json accepts
// (it may leave any input to encoding/json, but never one it would take
// as an object) and splits them into the same members, the last of a
// repeated key winning; Array likewise for arrays. On input that Object
// or Array took, in valid UTF-8, ValidObject and ValidArray find the same
// members; on any input they do not panic.
func FuzzObject(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { "a" : 1 } `, `{"model":"m","prompt":"hi","stream":true,"max_tokens":16}`,
		`{"a":[1,2,{"b":null}],"c":{"d":[]},"e":-0.5e+10,"f":false}`, `{"a":1,"a":2}`,
		`{"mod\u0065l":"x"}`, `{"s":"tab\tinside"}`, `{"s":"\ud800"}`, `{"a":01}`, `{"a":1.}`,
		`{"a":1}x`, `{"a" 1}`, `{"a":1,}`, `[1]`, `null`, `{"a":"\x"}`, `{"a":tru}`, `{"a":"unterminated`,
		`{"a":"é"}`, "{\"a\":\"\xff\"}", `{"a":[1 2]}`, `{"a":1e}`, `{"a":-}`, `{"\u00":1}`,
		`{"a":"x\\\\","b":"\\\"q\\\\\"","c":["\\\\\\\"",{"d\\\"":"\\\\"}]}`, `["a\\\\",1,"b"]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := map[string]string{}
		ok := Object(b, func(k, v []byte) bool { got[string(k)] = string(v); return true })
		var want map[string]json.RawMessage
		err := json.Unmarshal(b, &want)
		trimmed := bytes.TrimLeft(b, " \t\r\n")
		switch {
		case ok && err != nil:
			t.Fatalf("splitObject took %q, encoding/json refuses it: %v", b, err)
		case !ok && err == nil && len(trimmed) > 0 && trimmed[0] == '{':
			t.Fatalf("splitObject refused the object %q", b)
		case ok && utf8.Valid(b):
			if len(got) != len(want) {
				t.Fatalf("%q: members %v, encoding/json %v", b, got, want)
			}
			for k, v := range want {
				if got[k] != string(v) {
					t.Fatalf("%q: %q = %q, encoding/json %q", b, k, got[k], v)
				}
			}
		}
		vgot := map[string]string{}
		vok := ValidObject(b, func(k, v []byte) bool { vgot[string(k)] = string(v); return true })
		if ok && utf8.Valid(b) && (!vok || !maps.Equal(got, vgot)) {
			t.Fatalf("%q: ValidObject %v %v, Object %v", b, vok, vgot, got)
		}
		var elems []string
		aok := Array(b, func(v []byte) bool { elems = append(elems, string(v)); return true })
		var velems []string
		vaok := ValidArray(b, func(v []byte) bool { velems = append(velems, string(v)); return true })
		if aok && utf8.Valid(b) && (!vaok || !slices.Equal(elems, velems)) {
			t.Fatalf("%q: ValidArray %v %q, Array %q", b, vaok, velems, elems)
		}
		var wantElems []json.RawMessage
		aerr := json.Unmarshal(b, &wantElems)
		switch {
		case aok && aerr != nil:
			t.Fatalf("Array took %q, encoding/json refuses it: %v", b, aerr)
		case !aok && aerr == nil && len(trimmed) > 0 && trimmed[0] == '[':
			t.Fatalf("Array refused the array %q", b)
		case aok:
			if len(elems) != len(wantElems) {
				t.Fatalf("%q: elements %q, encoding/json %q", b, elems, wantElems)
			}
			for i := range elems {
				if elems[i] != string(wantElems[i]) {
					t.Fatalf("%q: element %d = %q, encoding/json %q", b, i, elems[i], wantElems[i])
				}
			}
		}
	})
}

// TestDeepNesting: nesting past encoding/json's limit is left to it.
func TestDeepNesting(t *testing.T) {
	deep := `{"a":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`
	if Object([]byte(deep), func(_, _ []byte) bool { return true }) {
		t.Fatal("took nesting past encoding/json's limit")
	}
	if json.Unmarshal([]byte(deep), new(any)) == nil {
		t.Fatal("encoding/json took it too")
	}
}

// TestMemberRefusal: a member function that says no stops the scan.
func TestMemberRefusal(t *testing.T) {
	n := 0
	if Object([]byte(`{"a":1,"b":2,"c":3}`), func(k, _ []byte) bool { n++; return string(k) != "b" }) || n != 2 {
		t.Fatalf("went on after a refusal: %d calls", n)
	}
}

// FuzzPlainString: where PlainString reads a JSON string without decoding
// it, encoding/json decodes it to the same text; ValidPlainString agrees
// with PlainString on valid strings in valid UTF-8.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`"hello"`, `""`, `"a\"b"`, `"tab	"`, "\"\xff\"", `"é"`, `"unterminated`, `x`, `"a"b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, ok := PlainString(raw)
		if vp, vok := ValidPlainString(raw); json.Valid(raw) && utf8.Valid(raw) && len(raw) > 0 && raw[0] == '"' && (vok != ok || !bytes.Equal(vp, p)) {
			t.Fatalf("ValidPlainString(%q) = %q %v, PlainString %q %v", raw, vp, vok, p, ok)
		}
		if !ok {
			return
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || s != string(p) {
			t.Fatalf("PlainString(%q) = %q, encoding/json %q (%v)", raw, p, s, err)
		}
	})
}

// TestHasControlIsExact: hasControl finds a control byte at every
// position of a slice of up to 40 bytes (so in every lane of the 32-byte
// and 8-byte loops and in the tail), whatever the other bytes, and
// nothing in a slice without one.
func TestHasControlIsExact(t *testing.T) {
	for _, fill := range []byte{'a', ' ', '!', '"', '\\', 0x7f, 0x80, 0xff} {
		for n := range 41 {
			b := bytes.Repeat([]byte{fill}, n)
			if hasControl(b) {
				t.Fatalf("hasControl(%q) = true", b)
			}
			for c := range 256 {
				for pos := range n {
					b[pos] = byte(c)
					if got, want := hasControl(b), c < 0x20; got != want {
						t.Fatalf("hasControl(%q) = %v, want %v", b, got, want)
					}
					b[pos] = fill
				}
			}
		}
	}
}

// BenchmarkObject: splitting a 220 KB chat request, issue 19's agent
// prompt, as text with a newline (an escape) every 60 bytes and as one
// plain run.
func BenchmarkObject(b *testing.B) {
	line := strings.Repeat("word ", 12)
	for _, tc := range []struct{ name, text string }{
		{"lines", strings.Repeat(line+"\n", 220<<10/61)},
		{"plain", strings.Repeat("word ", 220<<10/5)},
	} {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": tc.text}}})
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if !Object(body, func(k, v []byte) bool { return true }) {
					b.Fatal("refused")
				}
			}
		})
	}
}
