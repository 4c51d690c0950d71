package prefix

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
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
// panic, and equal input gives equal bytes; AppendValidChat and
// AppendValidCompletion never panic either, and on valid JSON in valid
// UTF-8 they give what AppendChat and AppendCompletion give.
func FuzzCanonical(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":[{"type":"text","text":"x"}],"tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}]`), []byte(`[{"type":"function"}]`))
	f.Add([]byte(`"abc"`), []byte(`null`))
	f.Add([]byte(`[[1,2],[3]]`), []byte(``))
	f.Add([]byte(`[{"role":"user","content":"a\\\"b\\\\"},{"role":"x","content":[{"type":"text","text":"\\u00e9"}]}]`), []byte(`[]`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		valid := json.Valid(a) && utf8.Valid(a) && (len(b) == 0 || json.Valid(b) && utf8.Valid(b))
		same := func(name string, c1, c2 []byte, err1, err2 error) {
			if valid && (!slices.Equal(c1, c2) || !reflect.DeepEqual(err1, err2)) {
				t.Fatalf("%s(%q, %q) = %q, %v; want %q, %v", name, a, b, c2, err2, c1, err1)
			}
		}
		c, err := AppendChat(nil, json.RawMessage(a), json.RawMessage(b))
		vc, verr := AppendValidChat(nil, json.RawMessage(a), json.RawMessage(b))
		same("AppendValidChat", c, vc, err, verr)
		c, err = AppendCompletion(nil, json.RawMessage(a))
		vc, verr = AppendValidCompletion(nil, json.RawMessage(a))
		same("AppendValidCompletion", c, vc, err, verr)

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
// what encoding/json gets; a plain chat request takes that path. Told the
// array is valid, it decodes a valid one (in valid UTF-8) the same way,
// and it never panics.
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
		got, ok := scanMessages(raw, false)
		vgot, vok := scanMessages(raw, true)
		if json.Valid(raw) && utf8.Valid(raw) && (vok != ok || !reflect.DeepEqual(vgot, got)) {
			t.Fatalf("%q: valid scan %v %+v, scan %v %+v", raw, vok, vgot, ok, got)
		}
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
	if _, ok := scanMessages(raw, false); !ok {
		t.Fatal("a plain chat request left to encoding/json")
	}
}

// chainHashes is the index's hashes by their definition: AppendHashes'
// full blocks, then with partial what is left as one more link.
func chainHashes(seed uint64, data []byte, block, max int, partial bool) []uint64 {
	hs := AppendHashes(nil, seed, data, block, max)
	if rest := data[min(len(data), len(hs)*block):]; partial && len(hs) < max && len(rest) > 0 {
		if len(hs) > 0 {
			seed = hs[len(hs)-1]
		}
		hs = AppendHashes(hs, seed, rest, len(rest), 1)
	}
	return hs
}

// FuzzParts: a prompt in parts is the same canonical bytes as the one
// canonicaliser writes whole, whatever texts are referenced (every one of
// at least min bytes), and its block hashes are the index's hashes of
// those bytes, partial last block or not, at every block size and cap.
func FuzzParts(f *testing.F) {
	f.Add([]byte(`[{"role":"system","content":"You are a careful assistant."},{"role":"user","content":"hello there, how are you today?"}]`), []byte(`"a completion prompt of some length"`), 1, 8, 100, true)
	f.Add([]byte(`[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"assistant","content":"y\\nz"}]`), []byte(`[[1,2],[3]]`), 0, 3, 2, false)
	long := strings.Repeat("a long text ", 400)
	f.Add([]byte(`[{"role":"system","content":"`+long+`"},{"role":"user","content":"`+long+`"}]`), []byte(`"`+long+`"`), 5, 27, 100, true)
	f.Fuzz(func(t *testing.T, msgs, prompt []byte, min, block, max int, partial bool) {
		min, block, max = abs(min)%64, 1+abs(block)%64, abs(max)%200
		if block%7 == 0 { // past the 1 KB a block across pieces is copied into on the stack
			block *= 40
		}
		if !json.Valid(msgs) || !utf8.Valid(msgs) || !json.Valid(prompt) || !utf8.Valid(prompt) {
			return
		}
		var p Parts
		check := func(name string, whole []byte, werr, perr error) {
			if !reflect.DeepEqual(werr, perr) {
				t.Fatalf("%s: error %v in parts, %v whole", name, perr, werr)
			}
			if werr != nil {
				return
			}
			if got := p.AppendTo(nil); !slices.Equal(got, whole) || p.Len() != len(whole) {
				t.Fatalf("%s: parts %q (len %d), whole %q", name, got, p.Len(), whole)
			}
			from, to := block, 3*block+max // min and max are the fuzz's parameters here
			from, to = from%(len(whole)+1), to%(len(whole)+1)
			if from > to {
				from, to = to, from
			}
			if !slices.Equal(p.AppendRange(nil, from, to), whole[from:to]) {
				t.Fatalf("%s: range %d-%d of parts %q, whole %q", name, from, to, p.AppendRange(nil, from, to), whole[from:to])
			}
			x := NewIndex(Config{BlockBytes: block, MaxBlocks: max, Partial: partial})
			bb, mx, pa := x.HashShape()
			if got, want := p.AppendHashes(nil, 7, bb, mx, pa), x.AppendHashes(nil, 7, whole); !slices.Equal(got, want) {
				t.Fatalf("%s: %d hashes in parts, %d whole (block %d, max %d, partial %v)", name, len(got), len(want), bb, mx, pa)
			}
			if got, want := x.AppendHashes(nil, 7, whole), chainHashes(7, whole, bb, mx, pa); !slices.Equal(got, want) {
				t.Fatalf("%s: index %d hashes, the chain %d (block %d, max %d, partial %v)", name, len(got), len(want), bb, mx, pa)
			}
		}
		for _, tools := range []json.RawMessage{nil, json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)} {
			whole, werr := AppendValidChat(nil, msgs, tools)
			check("chat", whole, werr, p.setChat(msgs, tools, min))
			if werr != nil {
				continue
			}
			// The first user message begins and ends message records of the
			// prompt (after the tools), a later turn's before its end, and
			// where does not depend on what is referred to.
			var q Parts
			_ = q.setChat(msgs, tools, 1<<30)
			fu, ft := p.FirstUser, p.FirstTurn
			if fu != q.FirstUser || ft != q.FirstTurn || fu < 0 || (ft > 0 && fu >= ft) || ft > len(whole) ||
				(ft > 0 && (whole[ft-1] != recordSep || whole[fu] != 'm' || (fu > 0 && whole[fu-1] != recordSep))) || p.LaterTurn() != (ft > 0 && ft < len(whole)) {
				t.Fatalf("FirstUser %d, FirstTurn %d (%d, %d copied whole), LaterTurn %v, of %d bytes", fu, ft, q.FirstUser, q.FirstTurn, p.LaterTurn(), len(whole))
			}
		}
		whole, werr := AppendValidCompletion(nil, prompt)
		check("completion", whole, werr, p.setCompletion(prompt, min))
	})
}

// validJSON reports whether each of raws is empty or valid JSON in valid
// UTF-8, as a request parser that checked the body passes fields on.
func validJSON(raws ...[]byte) bool {
	for _, r := range raws {
		if len(r) > 0 && (!json.Valid(r) || !utf8.Valid(r)) {
			return false
		}
	}
	return true
}

// checkCanonical holds a canonicaliser's properties on any input: it
// never panics and is deterministic, the Valid form never panics and on
// valid input gives the same bytes and errors, accepted input has bytes,
// and its Parts, texts of at least min bytes referred to, are the same
// bytes, with a first user message that begins and ends message records
// wherever the texts lie.
func checkCanonical(t *testing.T, name string, min int, valid bool,
	appendAny, appendValid func() ([]byte, error), set func(p *Parts, min int) error) {
	c, err := appendAny()
	vc, verr := appendValid()
	if c2, err2 := appendAny(); !slices.Equal(c, c2) || !reflect.DeepEqual(err, err2) {
		t.Fatalf("%s not deterministic", name)
	}
	if err == nil && len(c) == 0 {
		t.Fatalf("%s accepted a request with no bytes", name)
	}
	if !valid {
		return
	}
	if !slices.Equal(c, vc) || !reflect.DeepEqual(err, verr) {
		t.Fatalf("%s: valid form %q, %v; want %q, %v", name, vc, verr, c, err)
	}
	var p Parts
	if perr := set(&p, min); !reflect.DeepEqual(perr, err) {
		t.Fatalf("%s: error %v in parts, %v whole", name, perr, err)
	}
	if err != nil {
		return
	}
	if got := p.AppendTo(nil); !slices.Equal(got, c) || p.Len() != len(c) {
		t.Fatalf("%s: parts %q (len %d), whole %q", name, got, p.Len(), c)
	}
	var q Parts
	_ = set(&q, 1<<30)
	fu, ft := p.FirstUser, p.FirstTurn
	if fu != q.FirstUser || ft != q.FirstTurn || fu < 0 || (ft > 0 && fu >= ft) || ft > len(c) ||
		(ft > 0 && (c[ft-1] != recordSep || c[fu] != 'm' || (fu > 0 && c[fu-1] != recordSep))) || p.LaterTurn() != (ft > 0 && ft < len(c)) {
		t.Fatalf("%s: FirstUser %d, FirstTurn %d (%d, %d copied whole), LaterTurn %v, of %d bytes", name, fu, ft, q.FirstUser, q.FirstTurn, p.LaterTurn(), len(c))
	}
}

// FuzzResponses: checkCanonical's properties for Responses API requests.
func FuzzResponses(f *testing.F) {
	long := strings.Repeat("a long text ", 400)
	for _, s := range [][3]string{
		{`"be brief"`, `"hello"`, ``},
		{`null`, `[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"},{"type":"input_image","image_url":"http://x/1.png"}]}]`, `[{"type":"function","name":"f","parameters":{"a":1}}]`},
		{``, `[{"role":"user","content":"q"},{"type":"function_call","id":"fc_1","call_id":"c","name":"f","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"r"}]},{"type":"reasoning","id":"rs","summary":[]},{"role":"assistant","content":[{"type":"output_text","text":"a\\u00e9","annotations":[]}]}]`, `[{"type":"web_search"}]`},
		{`"` + long + `"`, `[{"role":"system","content":"` + long + `"},{"role":"user","content":[{"type":"input_text","text":"` + long + `"}]}]`, ``},
		{`7`, `[{"role":"user","content":"x","extra":1},{"type":"item_reference","id":"msg_1"}]`, `{}`},
		{``, `[{"content":"x"}]`, ``}, {``, `[]`, ``}, {``, `""`, ``}, {``, `[1]`, `[1]`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]), []byte(s[2]), 5)
	}
	f.Fuzz(func(t *testing.T, instructions, input, tools []byte, min int) {
		checkCanonical(t, "AppendResponses", abs(min)%64, validJSON(instructions, input, tools),
			func() ([]byte, error) { return AppendResponses(nil, instructions, input, tools) },
			func() ([]byte, error) { return AppendValidResponses(nil, instructions, input, tools) },
			func(p *Parts, min int) error { return p.setResponses(instructions, input, tools, min) })
	})
}

// FuzzMessages: checkCanonical's properties for Anthropic Messages API
// requests.
func FuzzMessages(f *testing.F) {
	long := strings.Repeat("a long text ", 400)
	for _, s := range [][3]string{
		{`"be brief"`, `[{"role":"user","content":"hello"}]`, ``},
		{`[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}]`, `[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]}]`, `[{"name":"f","input_schema":{"a":1}}]`},
		{``, `[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"tool_use","id":"a","name":"f","input":{"b":1,"a":2}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"r"},{"type":"image","source":{"type":"url","url":"u"}}]},{"type":"text","text":"more"}]}]`, `[{"type":"web_search_20250305","name":"web_search"}]`},
		{`"` + long + `"`, `[{"role":"system","content":"` + long + `"},{"role":"user","content":[{"type":"text","text":"` + long + `"},{"type":"text","text":"\\n` + long + `"}]}]`, ``},
		{`7`, `[{"role":"user","content":[{"type":"document","source":{}}]},{"role":"assistant","content":[]}]`, `{}`},
		{``, `[{"content":"x"}]`, ``}, {``, `[]`, ``}, {`[{"type":"image"}]`, `[{"role":"user"}]`, ``}, {``, `[1]`, `[1]`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]), []byte(s[2]), 5)
	}
	f.Fuzz(func(t *testing.T, system, msgs, tools []byte, min int) {
		checkCanonical(t, "AppendMessages", abs(min)%64, validJSON(system, msgs, tools),
			func() ([]byte, error) { return AppendMessages(nil, system, msgs, tools) },
			func() ([]byte, error) { return AppendValidMessages(nil, system, msgs, tools) },
			func(p *Parts, min int) error { return p.setMessages(system, msgs, tools, min) })
	})
}
