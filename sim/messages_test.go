package sim

import (
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// message is what the tests read of a Messages API answer.
type message struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason *string        `json:"stop_reason"`
	Usage      map[string]int `json:"usage"`
}

func TestMessagesNonStream(t *testing.T) {
	srv := fastServer(t)
	code, b := call(t, srv.Client(), "POST", srv.URL+"/v1/messages",
		`{"model":"m","max_tokens":4,"system":"be brief","messages":[{"role":"user","content":"hello there"}]}`)
	var m message
	mustJSON(t, b, &m)
	if code != 200 || !messageID.MatchString(m.ID) || m.Type != "message" || m.Role != "assistant" || m.Model != "m" ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || len(strings.Fields(m.Content[0].Text)) != 4 ||
		m.StopReason == nil || *m.StopReason != "max_tokens" || !strings.Contains(string(b), `"stop_sequence":null`) {
		t.Errorf("answer %d %s", code, b)
	}
	// input_tokens is the whole prompt, as vLLM reports it, with no cache
	// fields.
	want := map[string]int{"input_tokens": tokensOf("<|start|>system\nbe brief<|end|>\n<|start|>user\nhello there<|end|>\n<|start|>assistant\n"), "output_tokens": 4}
	if !reflect.DeepEqual(m.Usage, want) {
		t.Errorf("usage %v, want %v", m.Usage, want)
	}
}

func TestMessagesStream(t *testing.T) {
	srv := fastServer(t)
	resp := post(t, srv.URL+"/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hello there"}]}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := namedEvents(t, resp.Body)
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	var names []string
	for _, e := range evs {
		names = append(names, e.name)
	}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("events %q, want %q", names, want)
	}
	prompt := tokensOf("<|start|>user\nhello there<|end|>\n<|start|>assistant\n")
	var text string
	for _, e := range evs {
		var ev struct {
			Type    string   `json:"type"`
			Index   *int     `json:"index"`
			Message *message `json:"message"`
			Block   *struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			} `json:"content_block"`
			Delta *struct {
				Type       string  `json:"type"`
				Text       string  `json:"text"`
				StopReason *string `json:"stop_reason"`
			} `json:"delta"`
			Usage map[string]int `json:"usage"`
		}
		mustJSON(t, []byte(e.data), &ev)
		if ev.Type != e.name {
			t.Errorf("event %s has type %q", e.name, ev.Type)
		}
		ok := true
		switch e.name {
		case "message_start":
			ok = ev.Message != nil && messageID.MatchString(ev.Message.ID) && ev.Message.Role == "assistant" && ev.Message.StopReason == nil &&
				reflect.DeepEqual(ev.Message.Usage, map[string]int{"input_tokens": prompt, "output_tokens": 0})
		case "content_block_start":
			ok = ev.Index != nil && *ev.Index == 0 && ev.Block != nil && ev.Block.Type == "text" && ev.Block.Text != nil && *ev.Block.Text == ""
		case "content_block_delta":
			ok = ev.Index != nil && *ev.Index == 0 && ev.Delta != nil && ev.Delta.Type == "text_delta" && ev.Delta.Text != ""
			if ev.Delta != nil {
				text += ev.Delta.Text
			}
		case "content_block_stop":
			ok = ev.Index != nil && *ev.Index == 0
		case "message_delta":
			ok = ev.Delta != nil && ev.Delta.StopReason != nil && *ev.Delta.StopReason == "max_tokens" &&
				reflect.DeepEqual(ev.Usage, map[string]int{"input_tokens": prompt, "output_tokens": 3})
		}
		if !ok {
			t.Errorf("%s: %s", e.name, e.data)
		}
	}
	if len(strings.Fields(text)) != 3 {
		t.Errorf("streamed text %q, want 3 tokens", text)
	}
}

// TestMessagesCountTokens: count_tokens answers what /v1/messages reports
// as input_tokens, and a Claude Code billing header block in the system
// prompt counts for nothing, as vLLM drops it.
func TestMessagesCountTokens(t *testing.T) {
	srv := fastServer(t)
	const msgs = `"messages":[{"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":" there"}]}]`
	count := func(system string) int {
		t.Helper()
		code, b := call(t, srv.Client(), "POST", srv.URL+"/v1/messages/count_tokens", `{"model":"m","system":`+system+`,`+msgs+`}`)
		var c map[string]int
		mustJSON(t, b, &c)
		if code != 200 || len(c) != 1 {
			t.Fatalf("count_tokens = %d %s", code, b)
		}
		return c["input_tokens"]
	}
	plain := count(`[{"type":"text","text":"be brief"}]`)
	if want := tokensOf("<|start|>system\nbe brief<|end|>\n<|start|>user\nhello there<|end|>\n<|start|>assistant\n"); plain != want {
		t.Errorf("count_tokens = %d, want %d", plain, want)
	}
	if n := count(`[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=8f2e;"},{"type":"text","text":"be brief"}]`); n != plain {
		t.Errorf("with a billing header block: %d, want %d", n, plain)
	}
	_, b := call(t, srv.Client(), "POST", srv.URL+"/v1/messages", `{"model":"m","max_tokens":1,"system":"be brief",`+msgs+`}`)
	var m message
	mustJSON(t, b, &m)
	if m.Usage["input_tokens"] != plain {
		t.Errorf("/v1/messages input_tokens %d, count_tokens %d", m.Usage["input_tokens"], plain)
	}
}

func TestMessagesErrorsInAnthropicShape(t *testing.T) {
	srv := fastServer(t)
	for _, tc := range []struct {
		name, path, body string
		wantStatus       int
		wantType         string
	}{
		{"max_tokens missing", "/v1/messages", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error"},
		{"max_tokens 0", "/v1/messages", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error"},
		{"bad json", "/v1/messages", `{"model":`, 400, "invalid_request_error"},
		{"no messages", "/v1/messages", `{"model":"m","max_tokens":1,"messages":[]}`, 400, "invalid_request_error"},
		{"bad role", "/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"tool","content":"hi"}]}`, 400, "invalid_request_error"},
		{"unknown model", "/v1/messages", `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"},
		{"too long", "/v1/messages", `{"model":"m","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error"},
		{"count unknown model", "/v1/messages/count_tokens", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := call(t, srv.Client(), "POST", srv.URL+tc.path, tc.body)
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			mustJSON(t, b, &e)
			if code != tc.wantStatus || e.Type != "error" || e.Error.Type != tc.wantType || e.Error.Message == "" {
				t.Errorf("POST %s = %d %s, want %d with error type %s", tc.path, code, b, tc.wantStatus, tc.wantType)
			}
		})
	}
}

// TestConversationCostsTheSameThroughEveryAPI: one conversation with a
// tool call, sent through chat, the Responses API and the Messages API,
// renders to the same prompt and so costs the same; /tokenize and
// count_tokens count it alike.
func TestConversationCostsTheSameThroughEveryAPI(t *testing.T) {
	srv := fastServer(t)
	const rendered = "<|start|>system\nYou are a weather bot.<|end|>\n" +
		"<|start|>user\nWeather in Paris?<|end|>\n" +
		"<|start|>assistant\n<|call|>get_weather {\"city\":\"Paris\"}<|end|>\n" +
		"<|start|>tool\nsunny, 21C<|end|>\n" +
		"<|start|>user\nThanks! And Rome?<|end|>\n" +
		"<|start|>assistant\n"
	want := tokensOf(rendered)
	const chatMessages = `"messages":[
		{"role":"system","content":"You are a weather bot."},
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"sunny, 21C"},
		{"role":"user","content":"Thanks! And Rome?"}]`
	const anthropic = `"system":"You are a weather bot.","messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"get_weather","input":{"city": "Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"sunny, 21C"},{"type":"text","text":"Thanks! And Rome?"}]}]`
	for _, tc := range []struct {
		name, path, body string
		read             func(b []byte) int
	}{
		{"chat", "/v1/chat/completions", `{"model":"m","max_tokens":1,` + chatMessages + `}`, func(b []byte) int {
			var v struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				}
			}
			mustJSON(t, b, &v)
			return v.Usage.PromptTokens
		}},
		{"tokenize", "/tokenize", `{"model":"m",` + chatMessages + `}`, func(b []byte) int {
			var v struct{ Count int }
			mustJSON(t, b, &v)
			return v.Count
		}},
		{"responses", "/v1/responses", `{"model":"m","max_output_tokens":1,"instructions":"You are a weather bot.","input":[
			{"role":"user","content":"Weather in Paris?"},
			{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
			{"type":"function_call_output","call_id":"c1","output":"sunny, 21C"},
			{"type":"message","role":"user","content":[{"type":"input_text","text":"Thanks! And Rome?"}]}]}`, func(b []byte) int {
			var v response
			mustJSON(t, b, &v)
			if v.Usage == nil {
				return 0
			}
			return v.Usage.InputTokens
		}},
		{"messages", "/v1/messages", `{"model":"m","max_tokens":1,` + anthropic + `}`, func(b []byte) int {
			var v message
			mustJSON(t, b, &v)
			return v.Usage["input_tokens"]
		}},
		{"messages, tool result apart", "/v1/messages", `{"model":"m","max_tokens":1,"system":[{"type":"text","text":"You are a weather bot."}],"messages":[
			{"role":"user","content":"Weather in Paris?"},
			{"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"get_weather","input":{"city":"Paris"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":[{"type":"text","text":"sunny, 21C"}]}]},
			{"role":"user","content":"Thanks! And Rome?"}]}`, func(b []byte) int {
			var v message
			mustJSON(t, b, &v)
			return v.Usage["input_tokens"]
		}},
		{"count_tokens", "/v1/messages/count_tokens", `{"model":"m",` + anthropic + `}`, func(b []byte) int {
			var v map[string]int
			mustJSON(t, b, &v)
			return v["input_tokens"]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := call(t, srv.Client(), "POST", srv.URL+tc.path, tc.body)
			if got := tc.read(b); code != 200 || got != want {
				t.Errorf("POST %s = %d, %d prompt tokens (%s); want %d", tc.path, code, got, b, want)
			}
		})
	}
}

// TestTokenizeRendersChatTemplate pins /tokenize: a chat renders through
// the same template as before tool calls joined it, and a completion
// prompt counts as sent.
func TestTokenizeRendersChatTemplate(t *testing.T) {
	srv := fastServer(t)
	for _, tc := range []struct{ name, body, rendered string }{
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":null}]}`,
			"<|start|>user\nhello there<|end|>\n<|start|>assistant\n<|end|>\n<|start|>assistant\n"},
		{"completion", `{"model":"m","prompt":"once upon a time"}`, "once upon a time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := call(t, srv.Client(), "POST", srv.URL+"/tokenize", tc.body)
			var v struct {
				Count       int      `json:"count"`
				MaxModelLen int      `json:"max_model_len"`
				Tokens      []uint32 `json:"tokens"`
			}
			mustJSON(t, b, &v)
			want := Tokens([]byte(tc.rendered))
			if code != 200 || v.Count != len(want) || !reflect.DeepEqual(v.Tokens, want) || v.MaxModelLen != 4096 {
				t.Errorf("tokenize = %d %s, want %d tokens %v", code, b, len(want), want)
			}
		})
	}
	// A message with neither content nor tool calls is still refused.
	if code, b := call(t, srv.Client(), "POST", srv.URL+"/tokenize", `{"model":"m","messages":[{"role":"user"}]}`); code != 400 {
		t.Errorf("tokenize of a message without content = %d %s, want 400", code, b)
	}
}

// TestNewRoutesShowGenerationFaults: the generation faults reach the
// Responses and Messages routes, written in each API's error shape, and
// die-mid-stream cuts their streams.
func TestNewRoutesShowGenerationFaults(t *testing.T) {
	s, srv := faultServer(t)
	set := func(spec string) {
		t.Helper()
		fs, err := ParseFaults(spec)
		if err != nil {
			t.Fatal(err)
		}
		s.SetFaults(fs)
	}
	set("429")
	resp := post(t, srv.URL+"/v1/messages", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"type":"rate_limit_error"`) {
		t.Errorf("messages under 429: %d %s", resp.StatusCode, b)
	}
	resp = post(t, srv.URL+"/v1/responses", `{"model":"m","input":"hi"}`)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 429 || !strings.Contains(string(b), `"type":"TooManyRequestsError"`) {
		t.Errorf("responses under 429: %d %s", resp.StatusCode, b)
	}

	set("die-mid-stream:events=2")
	for _, tc := range []struct{ path, body, delta, last string }{
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":5,"stream":true}`, "event: response.output_text.delta\n", "response.completed"},
		{"/v1/messages", `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "event: content_block_delta\n", "message_stop"},
	} {
		resp, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || strings.Contains(string(b), tc.last) || strings.Count(string(b), tc.delta) != 2 {
			t.Errorf("%s under die-mid-stream: read error %v, body %s; want two deltas, then a broken body", tc.path, err, b)
		}
	}
}
