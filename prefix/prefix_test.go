package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func chat(t testing.TB, msgs string, tools string) []byte {
	t.Helper()
	b, err := AppendChat(nil, json.RawMessage(msgs), json.RawMessage(tools))
	if err != nil {
		t.Fatalf("AppendChat(%s) = %v", msgs, err)
	}
	return b
}

func TestCompletionForms(t *testing.T) {
	tests := []struct {
		name, prompt string
		want         []byte
		wantField    string
	}{
		{name: "string", prompt: `"hello"`, want: []byte("hello")},
		{name: "strings", prompt: `["a","b"]`, want: []byte("a\x1eb\x1e")},
		{name: "ids", prompt: `[1, 258]`, want: []byte{1, 0, 0, 0, 2, 1, 0, 0}},
		{name: "nested ids", prompt: `[[1],[2]]`, want: []byte{1, 0, 0, 0, 0x1e, 2, 0, 0, 0, 0x1e}},
		{name: "empty string", prompt: `""`, wantField: "prompt"},
		{name: "empty list", prompt: `[]`, wantField: "prompt"},
		{name: "empty inner", prompt: `[[]]`, wantField: "prompt"},
		{name: "mixed", prompt: `["a", 1]`, wantField: "prompt"},
		{name: "object", prompt: `{"a":1}`, wantField: "prompt"},
		{name: "missing", prompt: ``, wantField: "prompt"},
		{name: "null", prompt: `null`, wantField: "prompt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AppendCompletion(nil, json.RawMessage(tt.prompt))
			if tt.wantField != "" {
				var fe *FormatError
				if !errors.As(err, &fe) || fe.Field != tt.wantField {
					t.Fatalf("AppendCompletion(%s) error = %v, want a FormatError on %s", tt.prompt, err, tt.wantField)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Errorf("AppendCompletion(%s) = %q, %v; want %q", tt.prompt, got, err, tt.want)
			}
		})
	}
}

func TestChatIgnoresKeyOrderAndWhitespace(t *testing.T) {
	a := chat(t, `[{"role":"user","content":"hi"}]`, `[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]`)
	b := chat(t, `[ { "content" : "hi", "role" : "user" } ]`, `[{"function":{"parameters":{"a":2,"b":1},"name":"f"},"type":"function"}]`)
	if !bytes.Equal(a, b) {
		t.Errorf("same chat, different spelling: %q != %q", a, b)
	}
}

func TestChatKeepsEverythingRendered(t *testing.T) {
	base := `[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"http://x/1.png"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"q\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}]`
	ref := chat(t, base, "")
	variants := map[string][2]string{
		"system text":    {base, strings.Replace(base, `"content":"s"`, `"content":"t"`, 1)},
		"image url":      {base, strings.Replace(base, "1.png", "2.png", 1)},
		"tool call args": {base, strings.Replace(base, `{\"q\":1}`, `{\"q\":2}`, 1)},
		"tool call name": {base, strings.Replace(base, `"name":"get"`, `"name":"put"`, 1)},
		"tool result":    {base, strings.Replace(base, `"content":"42"`, `"content":"43"`, 1)},
		"role":           {base, strings.Replace(base, `"role":"system"`, `"role":"developer"`, 1)},
	}
	for name, v := range variants {
		if got := chat(t, v[1], ""); bytes.Equal(got, ref) {
			t.Errorf("%s: changing it did not change the canonical bytes", name)
		}
	}
	if got := chat(t, base, `[{"type":"function","function":{"name":"f"}}]`); bytes.Equal(got, ref) {
		t.Error("tools: adding a tool definition did not change the canonical bytes")
	}
	// Field boundaries are unambiguous: moving text between fields differs.
	x := chat(t, `[{"role":"user","name":"ab","content":"c"}]`, "")
	y := chat(t, `[{"role":"user","name":"a","content":"bc"}]`, "")
	if bytes.Equal(x, y) {
		t.Error("name/content boundary is ambiguous")
	}
}

func TestChatRejectsBadMessages(t *testing.T) {
	for _, msgs := range []string{``, `null`, `[]`, `{}`, `[{"content":"x"}]`, `[{"role":""}]`, `[{"role":"user","content":7}]`, `[{"role":"user","content":[7]}]`} {
		var fe *FormatError
		if _, err := AppendChat(nil, json.RawMessage(msgs), nil); !errors.As(err, &fe) {
			t.Errorf("AppendChat(%s) error = %v, want a FormatError", msgs, err)
		}
	}
	var fe *FormatError
	if _, err := AppendChat(nil, json.RawMessage(`[{"role":"user","content":"x"}]`), json.RawMessage(`{"a":1}`)); !errors.As(err, &fe) || fe.Field != "tools" {
		t.Errorf("bad tools: error = %v, want a FormatError on tools", err)
	}
}

// longText returns n bytes of text that differ by seed.
func longText(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s line %d of a long system prompt. ", seed, i)
	}
	return b.String()[:n]
}

func msgJSON(role, content string) string {
	b, _ := json.Marshal(map[string]string{"role": role, "content": content})
	return string(b)
}

// TestChatPrefixSharing is the chat prefix test: conversations that
// share their first message share exactly the blocks that message covers,
// and a later turn of one conversation matches every block of its earlier
// turn.
func TestChatPrefixSharing(t *testing.T) {
	sys := msgJSON("system", longText("tenant-a", 4000))
	c1 := chat(t, "["+sys+","+msgJSON("user", longText("question one", 2000))+"]", "")
	c2 := chat(t, "["+sys+","+msgJSON("user", longText("question two", 2000))+"]", "")
	seed := Seed("m", "")
	h1 := AppendHashes(nil, seed, c1, 256, 1000)
	h2 := AppendHashes(nil, seed, c2, 256, 1000)
	shared := 0
	for shared < len(h1) && shared < len(h2) && h1[shared] == h2[shared] {
		shared++
	}
	// The system message is about 4000 bytes: 15 full 256-byte blocks,
	// the 16th holds the start of the user turn.
	if shared < 14 || shared > 16 {
		t.Errorf("conversations share %d blocks, want the ~15 the first message covers", shared)
	}
	for i := shared; i < min(len(h1), len(h2)); i++ {
		if h1[i] == h2[i] {
			t.Fatalf("block %d is equal after the conversations diverged", i)
		}
	}

	turn1 := "[" + sys + "," + msgJSON("user", "hi") + "," + msgJSON("assistant", longText("answer", 1500)) + "]"
	turn2 := strings.TrimSuffix(turn1, "]") + "," + msgJSON("user", "and then?") + "]"
	t1 := AppendHashes(nil, seed, chat(t, turn1, ""), 256, 1000)
	t2 := AppendHashes(nil, seed, chat(t, turn2, ""), 256, 1000)
	if len(t1) == 0 || !slices.Equal(t1, t2[:len(t1)]) {
		t.Errorf("later turn does not match the earlier turn's %d blocks", len(t1))
	}
	x := NewIndex(Config{BlockBytes: 256})
	x.Insert(0, t1)
	dst := make([]int32, 1)
	if got := x.Match(t2, dst); got != len(t1) || dst[0] != int32(len(t1)) {
		t.Errorf("index Match(turn 2) = %d (slot 0: %d), want %d", got, dst[0], len(t1))
	}
}

func TestHashesSeededByModelAndSalt(t *testing.T) {
	data := []byte(longText("x", 1024))
	a := AppendHashes(nil, Seed("m", ""), data, 64, 100)
	for _, s := range []uint64{Seed("n", ""), Seed("m", "salt"), Seed("", "m")} {
		if b := AppendHashes(nil, s, data, 64, 100); b[0] == a[0] {
			t.Errorf("different seed, same first block hash")
		}
	}
	if len(a) != 16 {
		t.Errorf("1024 bytes in 64-byte blocks: %d hashes, want 16", len(a))
	}
	if got := AppendHashes(nil, 1, data, 64, 5); len(got) != 5 {
		t.Errorf("max 5 blocks: got %d", len(got))
	}
	if got := AppendHashes(nil, 1, data[:63], 64, 5); len(got) != 0 {
		t.Errorf("partial block hashed: %v", got)
	}
}

func TestIndexMatchStopsAtFirstMiss(t *testing.T) {
	x := NewIndex(Config{BlockBytes: 64, FallbackEntries: 100})
	x.Insert(0, []uint64{1, 2, 3, 4})
	x.Insert(1, []uint64{1, 2})
	x.Insert(2, []uint64{9, 3, 4})
	dst := make([]int32, 3)
	if got := x.Match([]uint64{1, 2, 3, 5}, dst); got != 3 {
		t.Errorf("Match = %d, want 3", got)
	}
	if want := []int32{3, 2, 0}; !slices.Equal(dst, want) {
		t.Errorf("per slot = %v, want %v (slot 2 holds 3 and 4, but not block 0)", dst, want)
	}
	clear(dst)
	if got := x.Match([]uint64{7, 1, 2}, dst); got != 0 || !slices.Equal(dst, []int32{0, 0, 0}) {
		t.Errorf("Match(miss first) = %d %v, want 0", got, dst)
	}
}

func TestIndexEvictsLeastRecentlyUsed(t *testing.T) {
	x := NewIndex(Config{BlockBytes: 64, FallbackEntries: 3})
	x.Insert(0, []uint64{1, 2, 3})
	x.Insert(0, []uint64{4}) // evicts 3: a prompt loses its tail first, as in vLLM
	dst := make([]int32, 1)
	if got := x.Match([]uint64{1, 2, 3}, dst); got != 2 {
		t.Errorf("after eviction Match(1,2,3) = %d, want 2 (the head kept)", got)
	}
	x.Insert(0, []uint64{1}) // 1 is now the most recent: 1 4 2
	x.Insert(0, []uint64{5}) // evicts 2
	clear(dst)
	if got := x.Match([]uint64{1, 2}, dst); got != 1 {
		t.Errorf("after eviction Match(1,2) = %d, want 1", got)
	}
	clear(dst)
	if got := x.Match([]uint64{4}, dst); got != 1 {
		t.Errorf("Match(4) = %d, want 1: 4 was used after 2", got)
	}
	if n, _ := x.Stats(); n != 3 {
		t.Errorf("entries = %d, want 3", n)
	}
	x.Insert(1, []uint64{4})
	x.Forget(0)
	if n, _ := x.Stats(); n != 1 {
		t.Errorf("entries after Forget = %d, want 1", n)
	}
	clear(dst)
	dst = make([]int32, 2)
	if got := x.Match([]uint64{4}, dst); got != 1 || dst[1] != 1 || dst[0] != 0 {
		t.Errorf("Match after Forget = %d %v, want only slot 1", got, dst)
	}
}

func TestIndexSizedFromKVCapacity(t *testing.T) {
	x := NewIndex(Config{}) // auto: 16-token engine blocks → 256 bytes = 64 tokens
	if x.BlockBytes() != 256 {
		t.Fatalf("auto block bytes = %d, want 256", x.BlockBytes())
	}
	x.Resize(0, 16, 40, 0) // 640 tokens = 10 of our blocks
	hs := make([]uint64, 20)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	x.Insert(0, hs)
	if n, _ := x.Stats(); n != 10 {
		t.Errorf("entries = %d, want 10 (KV capacity)", n)
	}
	// SGLang reports page size 1: still 256-byte blocks.
	x.Resize(1, 1, 1000, 0)
	if x.BlockBytes() != 256 {
		t.Errorf("page size 1 → block bytes %d, want 256", x.BlockBytes())
	}
	// A 128-token engine block re-tunes to 512 bytes and empties the index.
	x.Resize(2, 128, 100, 0)
	if x.BlockBytes() != 512 || x.Resets() != 1 {
		t.Errorf("block 128 → %d bytes, %d resets; want 512, 1", x.BlockBytes(), x.Resets())
	}
	if n, _ := x.Stats(); n != 0 {
		t.Errorf("entries after re-tune = %d, want 0", n)
	}
	// A fixed block size is never re-tuned.
	y := NewIndex(Config{BlockBytes: 64})
	y.Resize(0, 128, 10, 0)
	if y.BlockBytes() != 64 {
		t.Errorf("fixed block bytes changed to %d", y.BlockBytes())
	}
}

// A tokenizer's rate sizes the LRU: the same 640-token cache holds 480
// bytes of text at 3 bytes a token and 1,120 at 7.
func TestIndexSizedAtBytesPerToken(t *testing.T) {
	for _, c := range []struct {
		bpt  float64
		want int
	}{{3, 7}, {4, 10}, {7, 17}} {
		x := NewIndex(Config{}) // 256-byte blocks
		x.Resize(0, 16, 40, c.bpt)
		hs := make([]uint64, 40)
		for i := range hs {
			hs[i] = uint64(i + 1)
		}
		x.Insert(0, hs)
		if n, _ := x.Stats(); n != c.want {
			t.Errorf("%v bytes a token: entries = %d, want %d", c.bpt, n, c.want)
		}
	}
}

// Evicted names the blocks a slot's LRU dropped, until it takes them back,
// and only for that slot.
func TestIndexEvicted(t *testing.T) {
	x := NewIndex(Config{BlockBytes: 64})
	x.Resize(0, 16, 4, 4) // 4 blocks of 64 bytes
	x.Resize(1, 16, 4, 4)
	x.Insert(0, []uint64{1, 2, 3, 4})
	x.Insert(1, []uint64{1, 2})
	if x.Evicted(0, 1) {
		t.Fatal("block 1 is held, not evicted")
	}
	x.Insert(0, []uint64{5, 6}) // drops the tail blocks 4 and 3
	for _, h := range []uint64{3, 4} {
		if !x.Evicted(0, h) {
			t.Errorf("block %d: not reported evicted from slot 0", h)
		}
		if x.Evicted(1, h) {
			t.Errorf("block %d: reported evicted from slot 1, which never held it", h)
		}
	}
	if x.Evicted(0, 99) {
		t.Error("a block never held is reported evicted")
	}
	x.Insert(0, []uint64{4})
	if x.Evicted(0, 4) {
		t.Error("block 4 placed again is still reported evicted")
	}
}

func TestTreeMatchAndEvict(t *testing.T) {
	tr := NewTree(0)
	tr.Insert(0, []byte("hello world"))
	tr.Insert(1, []byte("hello there"))
	dst := make([]int32, 3)
	if got := tr.Match([]byte("hello world!"), dst); got != 11 {
		t.Errorf("Match = %d, want 11", got)
	}
	if want := []int32{11, 6, 0}; !slices.Equal(dst, want) {
		t.Errorf("per slot = %v, want %v", dst, want)
	}
	if tr.Size(0) != 11 || tr.Size(1) != 11 {
		t.Errorf("sizes = %d, %d, want 11, 11", tr.Size(0), tr.Size(1))
	}
	tr.Forget(0)
	clear(dst)
	if tr.Match([]byte("hello world"), dst); dst[0] != 0 || dst[1] != 6 {
		t.Errorf("after Forget(0): %v", dst)
	}

	small := NewTree(20)
	small.Insert(0, []byte("aaaaaaaaaa")) // 10
	small.Insert(0, []byte("bbbbbbbbbb")) // 20
	small.Insert(0, []byte("cccccccccc")) // 30 > 20: evict oldest down to 18
	clear(dst)
	small.Match([]byte("aaaaaaaaaa"), dst)
	if dst[0] != 0 {
		t.Errorf("oldest leaf not evicted: match %d", dst[0])
	}
	clear(dst)
	small.Match([]byte("cccccccccc"), dst)
	if dst[0] != 10 {
		t.Errorf("newest leaf evicted: match %d", dst[0])
	}
	if small.Size(0) > 20 {
		t.Errorf("size %d over the limit", small.Size(0))
	}
}

func TestFirstUserText(t *testing.T) {
	for _, tc := range []struct {
		name, messages, want string
	}{
		{"system skipped", `[{"role":"system","content":"be brief"},{"role":"user","content":"héllo world"}]`, "héllo"},
		{"parts", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"abcdefgh"}]}]`, "abcde"},
		{"no user", `[{"role":"system","content":"s"}]`, ""},
		{"short", `[{"role":"user","content":"ab"}]`, "ab"},
		{"not messages", `{"role":"user"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(FirstUserText([]byte(tc.messages), 5)); got != tc.want {
				t.Errorf("FirstUserText(%s, 5) = %q, want %q", tc.messages, got, tc.want)
			}
		})
	}
}

// TestPartsFirstTurn: a chat with a user message records where the first
// one begins and ends in the canonical bytes (the end is what every turn
// of its conversation shares), with long texts referred to or not, and
// whether messages follow (a later turn); a chat with no user message and
// a completion record none.
func TestPartsFirstTurn(t *testing.T) {
	sys := msgJSON("system", longText("tenant-a", 6000))
	u1 := msgJSON("user", longText("question one", 5000))
	a1 := msgJSON("assistant", "an answer")
	u2 := msgJSON("user", "and then?")
	tools := `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`
	for _, tc := range []struct {
		name, msgs    string
		before, first string // the messages before the first user message, and through it
		later         bool
		tools         string
	}{
		{"later turn", "[" + sys + "," + u1 + "," + a1 + "," + u2 + "]", "[" + sys + "]", "[" + sys + "," + u1 + "]", true, ""},
		{"tools", "[" + sys + "," + u1 + "," + a1 + "]", "[" + sys + "]", "[" + sys + "," + u1 + "]", true, tools},
		{"tools, no system", "[" + u1 + "," + a1 + "]", "", "[" + u1 + "]", true, tools},
		{"no system", "[" + u1 + "," + a1 + "]", "", "[" + u1 + "]", true, ""},
		{"short texts", `[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}]`, `[{"role":"system","content":"s"}]`, `[{"role":"system","content":"s"},{"role":"user","content":"q"}]`, true, ""},
		{"first turn", "[" + sys + "," + u1 + "]", "[" + sys + "]", "[" + sys + "," + u1 + "]", false, ""},
		{"no user", "[" + sys + "," + a1 + "]", "", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, turn := 0, 0
			if tc.before != "" {
				user = len(chat(t, tc.before, tc.tools))
			} else if tc.tools != "" { // the tools' bytes alone: a chat of no messages is refused
				user = len(chat(t, `[{"role":"user","content":""}]`, tc.tools)) - len(chat(t, `[{"role":"user","content":""}]`, ""))
			}
			if tc.first != "" {
				turn = len(chat(t, tc.first, tc.tools))
			}
			var tools json.RawMessage
			if tc.tools != "" {
				tools = json.RawMessage(tc.tools)
			}
			for _, min := range []int{minRef, 1 << 30} {
				var p Parts
				if err := p.setChat([]byte(tc.msgs), tools, min); err != nil {
					t.Fatal(err)
				}
				if p.FirstUser != user || p.FirstTurn != turn || p.LaterTurn() != tc.later {
					t.Errorf("min %d: FirstUser, FirstTurn, LaterTurn = %d, %d, %v; want %d, %d, %v", min, p.FirstUser, p.FirstTurn, p.LaterTurn(), user, turn, tc.later)
				}
			}
		})
	}
	p := Parts{FirstUser: 3, FirstTurn: 7}
	if err := p.SetValidCompletion([]byte(`"a prompt"`)); err != nil || p.FirstUser != 0 || p.FirstTurn != 0 || p.LaterTurn() {
		t.Errorf("completion: FirstUser, FirstTurn, LaterTurn = %d, %d, %v, err %v; want 0, 0, false", p.FirstUser, p.FirstTurn, p.LaterTurn(), err)
	}
}
