package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func responses(t testing.TB, instructions, input, tools string) []byte {
	t.Helper()
	b, err := AppendResponses(nil, json.RawMessage(instructions), json.RawMessage(input), json.RawMessage(tools))
	if err != nil {
		t.Fatalf("AppendResponses(%s, %s) = %v", instructions, input, err)
	}
	return b
}

// TestResponsesMatchesChat: a Responses request is the bytes of the chat
// request vLLM turns it into, wherever the two are one item to one message.
func TestResponsesMatchesChat(t *testing.T) {
	tests := []struct {
		name                       string
		instructions, input, tools string
		wantMessages, wantTools    string
	}{
		{
			name:         "instructions and string input",
			instructions: `"You are terse."`, input: `"What is 2+2?"`,
			wantMessages: `[{"role":"system","content":"You are terse."},{"role":"user","content":"What is 2+2?"}]`,
		},
		{
			name:  "string input alone",
			input: `"hello"`, instructions: `null`,
			wantMessages: `[{"role":"user","content":"hello"}]`,
		},
		{
			name:         "empty instructions add no system message",
			instructions: `""`, input: `"hello"`,
			wantMessages: `[{"role":"user","content":"hello"}]`,
		},
		{
			name:         "message items",
			input:        `[{"role":"developer","content":"rules"},{"type":"message","role":"user","content":"hi","id":"msg_1"},{"role":"assistant","content":"hello","status":"completed"}]`,
			wantMessages: `[{"role":"developer","content":"rules"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]`,
		},
		{
			name:         "content parts",
			input:        `[{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"http://x/1.png","detail":"high"}]},{"role":"assistant","content":[{"type":"output_text","text":"a cat","annotations":[],"logprobs":[]}]}]`,
			wantMessages: `[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"http://x/1.png","detail":"high"}}]},{"role":"assistant","content":[{"type":"text","text":"a cat"}]}]`,
		},
		{
			name:         "tool calling",
			instructions: `"Use tools."`,
			input:        `[{"role":"user","content":"weather in Paris?"},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},{"type":"function_call_output","call_id":"call_1","output":"sunny"},{"type":"message","role":"assistant","content":"It is sunny."}]`,
			tools:        `[{"type":"function","name":"weather","description":"Weather by city.","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}]`,
			wantMessages: `[{"role":"system","content":"Use tools."},{"role":"user","content":"weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"},{"role":"assistant","content":"It is sunny."}]`,
			wantTools:    `[{"type":"function","function":{"name":"weather","description":"Weather by city.","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := responses(t, tt.instructions, tt.input, tt.tools)
			if want := chat(t, tt.wantMessages, tt.wantTools); !bytes.Equal(got, want) {
				t.Errorf("AppendResponses = %q, want the chat request's %q", got, want)
			}
		})
	}
}

func TestResponsesIgnoresIDsKeyOrderAndWhitespace(t *testing.T) {
	a := responses(t, `"s"`, `[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"reasoning","summary":[{"type":"summary_text","text":"hm"}]}]`, `[{"type":"function","name":"f","parameters":{"b":1,"a":2}}]`)
	b := responses(t, ` "s" `, `[ {"content":[{"text":"hi","type":"input_text"}],"role":"user","id":"msg_9","type":"message","status":"completed"},
		{"arguments":"{}","name":"f","call_id":"c","type":"function_call","id":"fc_2","status":"completed"},
		{"summary":[{"text":"hm","type":"summary_text"}],"type":"reasoning","id":"rs_3"} ]`, `[{"parameters":{"a":2,"b":1},"name":"f","type":"function"}]`)
	if !bytes.Equal(a, b) {
		t.Errorf("same request, different spelling and ids: %q != %q", a, b)
	}
}

func TestResponsesKeepsEverythingRendered(t *testing.T) {
	base := `[{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"http://x/1.png"},{"type":"input_file","file_id":"file-1"}]},{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},{"type":"function_call","call_id":"c1","name":"get","arguments":"{\"q\":1}"},{"type":"function_call_output","call_id":"c1","output":"42"},{"type":"web_search_call","id":"ws_1","status":"completed","action":{"query":"x"}}]`
	ref := responses(t, `"s"`, base, "")
	variants := map[string]string{
		"user text":      strings.Replace(base, `"look"`, `"see"`, 1),
		"image url":      strings.Replace(base, "1.png", "2.png", 1),
		"file part":      strings.Replace(base, "file-1", "file-2", 1),
		"reasoning":      strings.Replace(base, `"think"`, `"ponder"`, 1),
		"call id":        strings.Replace(base, `"call_id":"c1","name"`, `"call_id":"c2","name"`, 1),
		"call name":      strings.Replace(base, `"name":"get"`, `"name":"put"`, 1),
		"call arguments": strings.Replace(base, `{\"q\":1}`, `{\"q\":2}`, 1),
		"output":         strings.Replace(base, `"output":"42"`, `"output":"43"`, 1),
		"output call id": strings.Replace(base, `"call_id":"c1","output"`, `"call_id":"c3","output"`, 1),
		"other item id":  strings.Replace(base, "ws_1", "ws_2", 1),
		"role":           strings.Replace(base, `"role":"user"`, `"role":"developer"`, 1),
	}
	for name, v := range variants {
		if got := responses(t, `"s"`, v, ""); bytes.Equal(got, ref) {
			t.Errorf("%s: changing it did not change the canonical bytes", name)
		}
	}
	if got := responses(t, `"t"`, base, ""); bytes.Equal(got, ref) {
		t.Error("instructions: changing them did not change the canonical bytes")
	}
	if got := responses(t, `"s"`, base, `[{"type":"web_search"}]`); bytes.Equal(got, ref) {
		t.Error("tools: adding a tool did not change the canonical bytes")
	}
	// A string input and a list of one user message of that string are
	// the same chat message, as vLLM renders them.
	if a, b := responses(t, ``, `"hi"`, ``), responses(t, ``, `[{"role":"user","content":"hi"}]`, ``); !bytes.Equal(a, b) {
		t.Errorf("string input %q, message item %q", a, b)
	}
}

func TestResponsesRejectsBadInput(t *testing.T) {
	tests := []struct {
		name, instructions, input, tools string
		wantField, wantMsg               string
	}{
		{name: "missing", input: ``, wantField: "input", wantMsg: "You must provide input."},
		{name: "null", input: `null`, wantField: "input", wantMsg: "You must provide input."},
		{name: "empty string", input: `""`, wantField: "input", wantMsg: "You must provide input."},
		{name: "empty list", input: ` [ ] `, wantField: "input", wantMsg: "You must provide input."},
		{name: "number", input: `7`, wantField: "input", wantMsg: "input must be a string or a list of input items."},
		{name: "list of strings", input: `["a"]`, wantField: "input", wantMsg: "input must be a string or a list of input items."},
		{name: "bad JSON", input: `[{"role":"user"`, wantField: "input", wantMsg: "input must be a string or a list of input items."},
		{name: "no role", input: `[{"content":"x"}]`, wantField: "input", wantMsg: "every message item needs a role."},
		{name: "bad content", input: `[{"role":"user","content":7}]`, wantField: "input", wantMsg: "input[0].content must be a string or a list of content parts."},
		{name: "bad part", input: `[{"role":"user","content":["x"]}]`, wantField: "input", wantMsg: "input[0].content must be a string or a list of content parts."},
		{name: "bad call id", input: `[{"role":"user","content":"x"},{"type":"function_call","call_id":1}]`, wantField: "input", wantMsg: "input[1].call_id must be a string."},
		{name: "bad type", input: `[{"type":1}]`, wantField: "input", wantMsg: "input[0].type must be a string."},
		{name: "instructions", instructions: `["x"]`, input: `"x"`, wantField: "instructions", wantMsg: "instructions must be a string."},
		{name: "tools", input: `"x"`, tools: `{"type":"function"}`, wantField: "tools", wantMsg: "tools must be a list of tool objects."},
		{name: "tool not an object", input: `"x"`, tools: `["f"]`, wantField: "tools", wantMsg: "tools must be a list of tool objects."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AppendResponses(nil, json.RawMessage(tt.instructions), json.RawMessage(tt.input), json.RawMessage(tt.tools))
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Field != tt.wantField || fe.Msg != tt.wantMsg {
				t.Errorf("AppendResponses(%s, %s, %s) error = %v, want %s: %s", tt.instructions, tt.input, tt.tools, err, tt.wantField, tt.wantMsg)
			}
		})
	}
	// Only new items, as a request with previous_response_id sends them.
	if _, err := AppendResponses(nil, nil, json.RawMessage(`[{"type":"function_call_output","call_id":"c1","output":"42"}]`), nil); err != nil {
		t.Errorf("new items only: %v", err)
	}
}

// itemsJSON returns a JSON list of the items.
func itemsJSON(items []string) string { return "[" + strings.Join(items, ",") + "]" }

// TestResponsesLaterTurnExtendsEarlier: every turn of a tool-calling
// conversation, resent whole with its new items, has the earlier turns'
// canonical bytes as its prefix, and its Parts (long texts referred to)
// mark the same first user message as the chat it stands for.
func TestResponsesLaterTurnExtendsEarlier(t *testing.T) {
	instructions, _ := json.Marshal(longText("agent rules", 6000))
	question, _ := json.Marshal(longText("fix the bug in main.go", 5000))
	file, _ := json.Marshal(longText("package main", 9000))
	tools := `[{"type":"function","name":"read_file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}]`
	turns := [][]string{
		{`{"type":"message","role":"user","content":[{"type":"input_text","text":` + string(question) + `}]}`},
		{`{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"}`,
			`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"read_file","arguments":"{\"path\":\"main.go\"}","status":"completed"}`,
			`{"type":"function_call_output","call_id":"call_1","output":` + string(file) + `}`},
		{`{"type":"message","id":"msg_2","role":"assistant","status":"completed","content":[{"type":"output_text","text":"The bug is on line 3.","annotations":[]}]}`,
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"}]}`},
	}
	var items []string
	var prev []byte
	var first [2]int
	for i, turn := range turns {
		items = append(items, turn...)
		input := json.RawMessage(itemsJSON(items))
		whole := responses(t, string(instructions), string(input), tools)
		if !bytes.HasPrefix(whole, prev) {
			t.Fatalf("turn %d does not extend turn %d's %d bytes", i+1, i, len(prev))
		}
		prev = whole
		var p Parts
		if err := p.SetValidResponses(instructions, input, json.RawMessage(tools)); err != nil {
			t.Fatal(err)
		}
		if got := p.AppendTo(nil); !bytes.Equal(got, whole) || len(p.Refs) == 0 {
			t.Fatalf("turn %d: Parts (%d refs) %d bytes, AppendResponses %d", i+1, len(p.Refs), len(got), len(whole))
		}
		if i == 0 {
			first = [2]int{p.FirstUser, p.FirstTurn}
			sys := `{"role":"system","content":` + string(instructions) + `}`
			user := `{"role":"user","content":[{"type":"text","text":` + string(question) + `}]}`
			chatTools := `[{"type":"function","function":{"name":"read_file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]`
			var c Parts
			if err := c.SetValidChat(json.RawMessage("["+sys+","+user+"]"), json.RawMessage(chatTools)); err != nil {
				t.Fatal(err)
			}
			if got := c.AppendTo(nil); !bytes.Equal(got, whole) || c.FirstUser != p.FirstUser || c.FirstTurn != p.FirstTurn {
				t.Errorf("first turn: FirstUser, FirstTurn = %d, %d; the chat's %d, %d (equal bytes %v)", p.FirstUser, p.FirstTurn, c.FirstUser, c.FirstTurn, bytes.Equal(got, whole))
			}
			if p.LaterTurn() {
				t.Error("first turn: LaterTurn() = true")
			}
			continue
		}
		if [2]int{p.FirstUser, p.FirstTurn} != first || !p.LaterTurn() {
			t.Errorf("turn %d: FirstUser, FirstTurn, LaterTurn = %d, %d, %v; want %d, %d, true", i+1, p.FirstUser, p.FirstTurn, p.LaterTurn(), first[0], first[1])
		}
	}
	seed := Seed("m", "")
	h1 := AppendHashes(nil, seed, responses(t, string(instructions), itemsJSON(turns[0]), tools), 256, 1000)
	h3 := AppendHashes(nil, seed, prev, 256, 1000)
	if len(h1) == 0 || !slices.Equal(h1, h3[:len(h1)]) {
		t.Errorf("the last turn does not match the first turn's %d blocks", len(h1))
	}
}
