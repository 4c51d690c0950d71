package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func messages(t testing.TB, system, msgs, tools string) []byte {
	t.Helper()
	b, err := AppendMessages(nil, json.RawMessage(system), json.RawMessage(msgs), json.RawMessage(tools))
	if err != nil {
		t.Fatalf("AppendMessages(%s, %s) = %v", system, msgs, err)
	}
	return b
}

// TestSameConversationSameBytes: a system prompt and a user's text are the
// same canonical bytes sent as a chat, a Responses or a Messages request,
// as vLLM renders them to the same tokens, tools included.
func TestSameConversationSameBytes(t *testing.T) {
	sys, _ := json.Marshal(longText("tenant-a", 6000))
	user, _ := json.Marshal("Summarise the attached notes.")
	var c Parts
	if err := c.SetValidChat(json.RawMessage(`[{"role":"system","content":`+string(sys)+`},{"role":"user","content":`+string(user)+`}]`),
		json.RawMessage(`[{"type":"function","function":{"name":"search","description":"Search notes.","parameters":{"type":"object"}}}]`)); err != nil {
		t.Fatal(err)
	}
	var r Parts
	if err := r.SetValidResponses(sys, user, json.RawMessage(`[{"type":"function","name":"search","description":"Search notes.","parameters":{"type":"object"}}]`)); err != nil {
		t.Fatal(err)
	}
	var m Parts
	if err := m.SetValidMessages(sys, json.RawMessage(`[{"role":"user","content":`+string(user)+`}]`),
		json.RawMessage(`[{"name":"search","description":"Search notes.","input_schema":{"type":"object"}}]`)); err != nil {
		t.Fatal(err)
	}
	want := c.AppendTo(nil)
	for name, p := range map[string]*Parts{"responses": &r, "messages": &m} {
		if got := p.AppendTo(nil); !bytes.Equal(got, want) {
			t.Errorf("%s: %q, want the chat's %q", name, got, want)
		}
		if p.FirstUser != c.FirstUser || p.FirstTurn != c.FirstTurn {
			t.Errorf("%s: FirstUser, FirstTurn = %d, %d; the chat's %d, %d", name, p.FirstUser, p.FirstTurn, c.FirstUser, c.FirstTurn)
		}
	}
}

// TestMessagesMatchesChat: a Messages request is the bytes of the chat
// request vLLM turns it into.
func TestMessagesMatchesChat(t *testing.T) {
	tests := []struct {
		name                    string
		system, msgs, tools     string
		wantMessages, wantTools string
	}{
		{
			name:         "system blocks joined, billing header and cache_control left out",
			system:       `[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=5e1f"},{"type":"text","text":"You are a coding agent. "},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}]`,
			msgs:         `[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]`,
			wantMessages: `[{"role":"system","content":"You are a coding agent. Be brief."},{"role":"user","content":"hi"}]`,
		},
		{
			name:         "no system",
			msgs:         `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]`,
			wantMessages: `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]`,
		},
		{
			name:         "system messages folded into the system text",
			system:       `"a"`,
			msgs:         `[{"role":"system","content":"b"},{"role":"user","content":"hi"}]`,
			wantMessages: `[{"role":"system","content":"ab"},{"role":"user","content":"hi"}]`,
		},
		{
			name:         "several parts, images",
			msgs:         `[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}},{"type":"image","source":{"type":"url","url":"http://x/1.png"}},{"type":"text","text":""}]}]`,
			wantMessages: `[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}},{"type":"image_url","image_url":{"url":"http://x/1.png"}}]}]`,
		},
		{
			name:         "tool calling",
			system:       `"Use tools."`,
			msgs:         `[{"role":"user","content":"weather in Paris?"},{"role":"assistant","content":[{"type":"thinking","thinking":"I should look.","signature":"EqQB"},{"type":"text","text":"Let me check."},{"type":"tool_use","id":"toolu_1","name":"weather","input":{"unit":"C","city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"},{"type":"text","text":"20C"}],"is_error":false}]},{"role":"assistant","content":[{"type":"text","text":"It is sunny."}]},{"role":"user","content":"thanks"}]`,
			tools:        `[{"name":"weather","description":"Weather by city.","input_schema":{"type":"object","properties":{"city":{"type":"string"}}},"cache_control":{"type":"ephemeral"}}]`,
			wantMessages: `[{"role":"system","content":"Use tools."},{"role":"user","content":"weather in Paris?"},{"role":"assistant","content":"Let me check.","reasoning_content":"I should look.","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"weather","arguments":{"city":"Paris","unit":"C"}}}]},{"role":"tool","tool_call_id":"toolu_1","content":"sunny\n20C"},{"role":"assistant","content":"It is sunny."},{"role":"user","content":"thanks"}]`,
			wantTools:    `[{"type":"function","function":{"name":"weather","description":"Weather by city.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`,
		},
		{
			name:         "tool results before the user's text, images after them",
			msgs:         `[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"shot","input":{}},{"type":"tool_use","id":"b","name":"f"}]},{"role":"user","content":[{"type":"text","text":"here"},{"type":"tool_result","tool_use_id":"a","content":[{"type":"image","source":{"type":"url","url":"http://x/s.png"}}]},{"type":"tool_result","tool_use_id":"b","content":"ok"}]}]`,
			wantMessages: `[{"role":"assistant","content":null,"tool_calls":[{"id":"a","function":{"name":"shot","arguments":"{}"}},{"id":"b","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"a","content":""},{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/s.png"}}]},{"role":"tool","tool_call_id":"b","content":"ok"},{"role":"user","content":"here"}]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := messages(t, tt.system, tt.msgs, tt.tools)
			if want := chat(t, tt.wantMessages, tt.wantTools); !bytes.Equal(got, want) {
				t.Errorf("AppendMessages = %q, want the chat request's %q", got, want)
			}
		})
	}
}

func TestMessagesKeepsEverythingRendered(t *testing.T) {
	base := `[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"document","source":{"type":"text","data":"notes"}}]},{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s1"},{"type":"tool_use","id":"t1","name":"get","input":{"q":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"42"}]}]`
	ref := messages(t, `"s"`, base, "")
	variants := map[string]string{
		"user text":      strings.Replace(base, `"look"`, `"see"`, 1),
		"image data":     strings.Replace(base, "AAAA", "AAAB", 1),
		"image type":     strings.Replace(base, "image/png", "image/gif", 1),
		"document":       strings.Replace(base, "notes", "memo", 1),
		"thinking":       strings.Replace(base, `"hm"`, `"hmm"`, 1),
		"tool use id":    strings.Replace(base, `"id":"t1"`, `"id":"t2"`, 1),
		"tool name":      strings.Replace(base, `"name":"get"`, `"name":"put"`, 1),
		"tool input":     strings.Replace(base, `{"q":1}`, `{"q":2}`, 1),
		"tool result":    strings.Replace(base, `"content":"42"`, `"content":"43"`, 1),
		"tool result id": strings.Replace(base, `"tool_use_id":"t1"`, `"tool_use_id":"t3"`, 1),
		"role":           strings.Replace(base, `"role":"assistant"`, `"role":"user"`, 1),
	}
	for name, v := range variants {
		if got := messages(t, `"s"`, v, ""); bytes.Equal(got, ref) {
			t.Errorf("%s: changing it did not change the canonical bytes", name)
		}
	}
	if got := messages(t, `"t"`, base, ""); bytes.Equal(got, ref) {
		t.Error("system: changing it did not change the canonical bytes")
	}
	if got := messages(t, `"s"`, base, `[{"type":"web_search_20250305","name":"web_search"}]`); bytes.Equal(got, ref) {
		t.Error("tools: adding a tool did not change the canonical bytes")
	}
	// Not rendered: a thinking block's signature, cache_control, is_error,
	// key order and whitespace.
	same := strings.NewReplacer(`"signature":"s1"`, `"signature":"s2"`, `"content":"42"}`, `"content":"42","is_error":true,"cache_control":{"type":"ephemeral"}}`,
		`{"q":1}`, ` { "q" : 1 } `).Replace(base)
	if got := messages(t, `"s"`, same, ""); !bytes.Equal(got, ref) {
		t.Errorf("signature, cache_control, is_error or spelling changed the canonical bytes: %q, want %q", got, ref)
	}
}

func TestMessagesRejectsBadRequests(t *testing.T) {
	tests := []struct {
		name, system, msgs, tools string
		wantField, wantMsg        string
	}{
		{name: "missing", msgs: ``, wantField: "messages", wantMsg: "You must provide messages."},
		{name: "null", msgs: `null`, wantField: "messages", wantMsg: "You must provide messages."},
		{name: "empty", msgs: `[]`, wantField: "messages", wantMsg: "messages must not be empty."},
		{name: "object", msgs: `{"role":"user"}`, wantField: "messages", wantMsg: "messages must be a list of message objects."},
		{name: "not objects", msgs: `["hi"]`, wantField: "messages", wantMsg: "messages must be a list of message objects."},
		{name: "no role", msgs: `[{"content":"hi"}]`, wantField: "messages", wantMsg: "every message needs a role."},
		{name: "role not a string", msgs: `[{"role":1,"content":"hi"}]`, wantField: "messages", wantMsg: "every message needs a role."},
		{name: "no content", msgs: `[{"role":"user"}]`, wantField: "messages", wantMsg: "message content must be a string or a list of content blocks."},
		{name: "block without type", msgs: `[{"role":"user","content":[{"text":"hi"}]}]`, wantField: "messages", wantMsg: "message content must be a string or a list of content blocks."},
		{name: "tool input", msgs: `[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":"{}"}]}]`, wantField: "messages", wantMsg: "a tool_use block's input must be an object."},
		{name: "system number", system: `5`, msgs: `[{"role":"user","content":"hi"}]`, wantField: "system", wantMsg: "system must be a string or a list of text blocks."},
		{name: "system image", system: `[{"type":"image","source":{}}]`, msgs: `[{"role":"user","content":"hi"}]`, wantField: "system", wantMsg: "system must be a string or a list of text blocks."},
		{name: "tools", msgs: `[{"role":"user","content":"hi"}]`, tools: `{"name":"f"}`, wantField: "tools", wantMsg: "tools must be a list of tool objects."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AppendMessages(nil, json.RawMessage(tt.system), json.RawMessage(tt.msgs), json.RawMessage(tt.tools))
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Field != tt.wantField || fe.Msg != tt.wantMsg {
				t.Errorf("AppendMessages(%s, %s, %s) error = %v, want %s: %s", tt.system, tt.msgs, tt.tools, err, tt.wantField, tt.wantMsg)
			}
		})
	}
}

// TestMessagesLaterTurnExtendsEarlier: every turn of an agent's
// conversation, resent whole with its new messages (and cache_control
// moved to the last block, as Claude Code moves it), has the earlier
// turns' canonical bytes as its prefix and marks the same first user
// message.
func TestMessagesLaterTurnExtendsEarlier(t *testing.T) {
	system := `[{"type":"text","text":"x-anthropic-billing-header: cch=TURN"},{"type":"text","text":` + quote(longText("agent rules", 6000)) + `,"cache_control":{"type":"ephemeral"}}]`
	tools := `[{"name":"read_file","description":"Read a file.","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}]`
	turns := [][]string{
		{`{"role":"user","content":[{"type":"text","text":` + quote(longText("fix the bug in main.go", 5000)) + `,"cache_control":{"type":"ephemeral"}}]}`},
		{`{"role":"assistant","content":[{"type":"thinking","thinking":"Read it first.","signature":"EqQB"},{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"main.go"}}]}`,
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":` + quote(longText("package main", 9000)) + `,"cache_control":{"type":"ephemeral"}}]}`},
		{`{"role":"assistant","content":[{"type":"text","text":"The bug is on line 3."}]}`,
			`{"role":"user","content":[{"type":"text","text":"fix it","cache_control":{"type":"ephemeral"}}]}`},
	}
	var msgs []string
	var prev []byte
	var first [2]int
	for i, turn := range turns {
		if i > 0 { // the last block's cache_control moves on
			msgs[len(msgs)-1] = strings.Replace(msgs[len(msgs)-1], `,"cache_control":{"type":"ephemeral"}`, "", 1)
		}
		msgs = append(msgs, turn...)
		sys := strings.Replace(system, "TURN", strings.Repeat("x", i+1), 1)
		list := itemsJSON(msgs)
		whole := messages(t, sys, list, tools)
		if !bytes.HasPrefix(whole, prev) {
			t.Fatalf("turn %d does not extend turn %d's %d bytes", i+1, i, len(prev))
		}
		prev = whole
		var p Parts
		if err := p.SetValidMessages(json.RawMessage(sys), json.RawMessage(list), json.RawMessage(tools)); err != nil {
			t.Fatal(err)
		}
		if got := p.AppendTo(nil); !bytes.Equal(got, whole) || len(p.Refs) == 0 {
			t.Fatalf("turn %d: Parts (%d refs) %d bytes, AppendMessages %d", i+1, len(p.Refs), len(got), len(whole))
		}
		if i == 0 {
			first = [2]int{p.FirstUser, p.FirstTurn}
			if p.FirstUser == 0 || p.FirstTurn != len(whole) || p.LaterTurn() {
				t.Errorf("first turn: FirstUser, FirstTurn, LaterTurn = %d, %d, %v of %d bytes", p.FirstUser, p.FirstTurn, p.LaterTurn(), len(whole))
			}
			continue
		}
		if [2]int{p.FirstUser, p.FirstTurn} != first || !p.LaterTurn() {
			t.Errorf("turn %d: FirstUser, FirstTurn, LaterTurn = %d, %d, %v; want %d, %d, true", i+1, p.FirstUser, p.FirstTurn, p.LaterTurn(), first[0], first[1])
		}
	}
	seed := Seed("m", "")
	h1 := AppendHashes(nil, seed, messages(t, system, itemsJSON(turns[0]), tools), 256, 1000)
	h3 := AppendHashes(nil, seed, prev, 256, 1000)
	if len(h1) == 0 || !slices.Equal(h1, h3[:len(h1)]) {
		t.Errorf("the last turn does not match the first turn's %d blocks", len(h1))
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
