package proxy

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzSplitObject: splitObject accepts exactly the objects encoding/json
// accepts (it may leave any input to encoding/json, but never one it
// would take as an object) and splits them into the same members, the
// last of a repeated key winning.
func FuzzSplitObject(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { "a" : 1 } `, `{"model":"m","prompt":"hi","stream":true,"max_tokens":16}`,
		`{"a":[1,2,{"b":null}],"c":{"d":[]},"e":-0.5e+10,"f":false}`, `{"a":1,"a":2}`,
		`{"mod\u0065l":"x"}`, `{"s":"tab\tinside"}`, `{"s":"\ud800"}`, `{"a":01}`, `{"a":1.}`,
		`{"a":1}x`, `{"a" 1}`, `{"a":1,}`, `[1]`, `null`, `{"a":"\x"}`, `{"a":tru}`, `{"a":"unterminated`,
		`{"a":"é"}`, "{\"a\":\"\xff\"}", `{"a":[1 2]}`, `{"a":1e}`, `{"a":-}`, `{"\u00":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := map[string]string{}
		ok := splitObject(b, func(k string, v []byte) { got[k] = string(v) })
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
	})
}

// TestSplitObjectDeepNesting: nesting past encoding/json's limit is left
// to it, which refuses it, and the request gets its error.
func TestSplitObjectDeepNesting(t *testing.T) {
	deep := `{"a":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`
	if splitObject([]byte(deep), func(string, []byte) {}) {
		t.Fatal("took nesting past encoding/json's limit")
	}
	_, err := ParseRequest(KindCompletion, []byte(deep))
	if err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("err = %v", err)
	}
}
