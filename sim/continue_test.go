package sim

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// answer is a non-streaming completion or chat answer.
type answer struct {
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (a answer) text() string { return a.Choices[0].Text + a.Choices[0].Message.Content }

// ask posts body to srv's path and reads a 200 answer.
func ask(t *testing.T, srv *httptest.Server, path string, body any) answer {
	t.Helper()
	b, _ := json.Marshal(body)
	code, out := call(t, srv.Client(), "POST", srv.URL+path, string(b))
	if code != 200 {
		t.Fatalf("POST %s %s = %d %s", path, b, code, out)
	}
	var a answer
	mustJSON(t, out, &a)
	return a
}

// firstWords returns the first n words of an emulated answer, as a stream
// cut after n chunks delivered them.
func firstWords(text string, n int) string {
	w := strings.Fields(text)
	return " " + strings.Join(w[:n], " ")
}

// continuation is the chat request that asks for the rest of an answer
// to msgs cut after delivered, maxTokens tokens short of the original.
func continuation(msgs []map[string]any, delivered string, maxTokens int, stream bool) map[string]any {
	return map[string]any{"model": "m", "stream": stream, "max_tokens": maxTokens,
		"messages":               append(slices.Clone(msgs), map[string]any{"role": "assistant", "content": delivered}),
		"continue_final_message": true, "add_generation_prompt": false}
}

// TestChatContinuesFinalAssistantMessage: a chat that continues a final
// assistant message, on another server, streams the rest of the answer
// the message was cut from, max_tokens long; the assistant's text counts
// as prompt, rendered open (no end-of-turn, no new generation prompt),
// and /tokenize renders the same.
func TestChatContinuesFinalAssistantMessage(t *testing.T) {
	first, second := fastServer(t), fastServer(t)
	msgs := []map[string]any{{"role": "user", "content": "hello there"}}
	whole := ask(t, first, "/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 8}).text()
	delivered := firstWords(whole, 3)

	body := continuation(msgs, delivered, 5, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	b, _ := json.Marshal(body)
	resp := post(t, second.URL+"/v1/chat/completions", string(b))
	evs := events(t, resp.Body)
	// role chunk, 5 content chunks, usage chunk, [DONE]
	if resp.StatusCode != 200 || len(evs) != 8 || evs[7] != "[DONE]" {
		t.Fatalf("continuation stream = %d %q, want a role chunk, 5 content chunks, usage and [DONE]", resp.StatusCode, evs)
	}
	var rest string
	var usage chunk
	for i, e := range evs[:7] {
		var c chunk
		mustJSON(t, []byte(e), &c)
		if i >= 1 && i <= 5 {
			rest += *c.Choices[0].Delta.Content
		}
		if i == 5 && (c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "length") {
			t.Errorf("last content chunk %s, want finish_reason length", e)
		}
		usage = c
	}
	if delivered+rest != whole {
		t.Errorf("delivered %q + continuation %q = %q, want the unbroken answer %q", delivered, rest, delivered+rest, whole)
	}

	rendered := "<|start|>user\nhello there<|end|>\n<|start|>assistant\n" + delivered
	code, tb := call(t, second.Client(), "POST", second.URL+"/tokenize", string(b))
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	mustJSON(t, tb, &tok)
	var got []byte
	for _, id := range tok.Tokens {
		got = binary.LittleEndian.AppendUint32(got, id)
	}
	if want := rendered[:len(rendered)/BytesPerToken*BytesPerToken]; code != 200 || string(got) != want {
		t.Errorf("tokenize renders %q (%d), want %q: the assistant's text open", got, code, want)
	}
	if u := usage.Usage; u == nil || u.PromptTokens != tok.Count || u.PromptTokens != len(rendered)/BytesPerToken || u.CompletionTokens != 5 {
		t.Errorf("usage %+v, want prompt_tokens %d (the assistant's text included) and completion_tokens 5", u, len(rendered)/BytesPerToken)
	}
}

// TestCompletionContinuesItsPrompt: a completion whose prompt is another
// completion's prompt plus the first words of its answer goes on with the
// rest of that answer.
func TestCompletionContinuesItsPrompt(t *testing.T) {
	first, second := fastServer(t), fastServer(t)
	const prompt = "once upon a time"
	whole := ask(t, first, "/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 8}).text()
	delivered := firstWords(whole, 3)
	a := ask(t, second, "/v1/completions", map[string]any{"model": "m", "prompt": prompt + delivered, "max_tokens": 5})
	if delivered+a.text() != whole || a.Usage.CompletionTokens != 5 || a.Usage.PromptTokens != len(prompt+delivered)/BytesPerToken {
		t.Errorf("continuation %q, usage %+v; want %q after %q, 5 tokens, and the delivered text counted as prompt",
			a.text(), a.Usage, strings.TrimPrefix(whole, delivered), delivered)
	}
}

// TestContinuationHitsPrefixCacheWhereTheConversationRan: on the engine
// model, a continuation's prompt begins with the original prompt's bytes,
// so the server that ran the original finds its blocks cached, and a
// server that never saw the conversation prefills it all.
func TestContinuationHitsPrefixCacheWhereTheConversationRan(t *testing.T) {
	cfg, err := Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	engine := func() *httptest.Server {
		s, err := NewServer(ServerConfig{Model: "m"}, NewLive(cfg, 1000))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		return srv
	}
	ran, fresh := engine(), engine()
	msgs := []map[string]any{
		{"role": "system", "content": strings.Repeat("You answer questions about the quarterly report. ", 60)},
		{"role": "user", "content": "What were the sales?"},
	}
	orig := ask(t, ran, "/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 16})
	delivered := firstWords(orig.text(), 10)
	there := ask(t, ran, "/v1/chat/completions", continuation(msgs, delivered, 6, false))
	elsewhere := ask(t, fresh, "/v1/chat/completions", continuation(msgs, delivered, 6, false))
	want := orig.Usage.PromptTokens / 16 * 16
	if got := there.Usage.PromptTokensDetails.CachedTokens; got < want || want == 0 {
		t.Errorf("continuation where the conversation ran: cached_tokens %d of %d, want at least the original prompt's %d",
			got, there.Usage.PromptTokens, want)
	}
	if got := elsewhere.Usage.PromptTokensDetails.CachedTokens; got != 0 || elsewhere.Usage.PromptTokens <= orig.Usage.PromptTokens {
		t.Errorf("continuation elsewhere: cached_tokens %d of %d, want 0 of more than the original %d",
			got, elsewhere.Usage.PromptTokens, orig.Usage.PromptTokens)
	}
	if there.text() != elsewhere.text() {
		t.Errorf("continuations differ by server: %q and %q", there.text(), elsewhere.text())
	}
}

// TestContinueFinalMessageRefusals: the combinations vLLM refuses, in
// its words, on chat and /tokenize; add_generation_prompt false alone
// renders the turns closed.
func TestContinueFinalMessageRefusals(t *testing.T) {
	srv := fastServer(t)
	const user = `"messages":[{"role":"user","content":"hi"}]`
	const asst = `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":" the"}]`
	for _, tc := range []struct {
		name, fields, wantType, wantMessage string
	}{
		{"both true", asst + `,"continue_final_message":true,"add_generation_prompt":true`, "Bad Request",
			"Value error, Cannot set both `continue_final_message` and `add_generation_prompt` to True."},
		{"add_generation_prompt left true", asst + `,"continue_final_message":true`, "BadRequestError",
			"continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead."},
		{"last message the user's", user + `,"continue_final_message":true,"add_generation_prompt":false`, "BadRequestError",
			"cannot continue the final message when the last message is not from the assistant"},
	} {
		for _, path := range []string{"/v1/chat/completions", "/tokenize"} {
			code, b := call(t, srv.Client(), "POST", srv.URL+path, `{"model":"m","max_tokens":2,`+tc.fields+`}`)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			mustJSON(t, b, &e)
			if code != 400 || e.Error.Code != 400 || e.Error.Type != tc.wantType || e.Error.Message != tc.wantMessage {
				t.Errorf("%s, %s = %d %s, want 400 %s %q", tc.name, path, code, b, tc.wantType, tc.wantMessage)
			}
		}
	}

	code, b := call(t, srv.Client(), "POST", srv.URL+"/tokenize", `{"model":"m",`+user+`,"add_generation_prompt":false}`)
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	mustJSON(t, b, &tok)
	if want := Tokens([]byte("<|start|>user\nhi<|end|>\n")); code != 200 || !slices.Equal(tok.Tokens, want) {
		t.Errorf("tokenize with add_generation_prompt false = %d %s, want %v: the turns closed, no generation prompt", code, b, want)
	}
	if code, b := call(t, srv.Client(), "POST", srv.URL+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"continue_final_message":true}`); code != 200 {
		t.Errorf("completion with continue_final_message = %d %s, want 200: completions have no such field", code, b)
	}
}

// cutStream posts body to url and reads the stream to its end, returning
// its data payloads and the error that ended the read (nil at a clean
// end).
func cutStream(t *testing.T, url, body string) ([]string, error) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s = %d", url, resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	var evs []string
	for ev := range strings.SplitSeq(string(b), "\n\n") {
		if data, ok := strings.CutPrefix(ev, "data: "); ok {
			evs = append(evs, data)
		}
	}
	return evs, err
}

// TestDieMidStreamCutsEveryStreamAfterThreeChunks: with the fault
// "die-mid-stream:events=3" every chat and completion stream longer than
// three tokens is cut after exactly three content chunks (chat's role
// chunk before them), with no finish_reason, usage or [DONE]; a stream of
// three tokens ends whole; and a chat continuation of the cut answer on a
// healthy server streams its rest, each word the vocabulary's next.
func TestDieMidStreamCutsEveryStreamAfterThreeChunks(t *testing.T) {
	dying, srv := faultServer(t)
	healthy := fastServer(t)
	fs, err := ParseFaults("die-mid-stream:events=3")
	if err != nil {
		t.Fatal(err)
	}
	dying.SetFaults(fs)
	msgs := []map[string]any{{"role": "user", "content": "hello there"}}
	chat, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 8, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	const completion = `{"model":"m","prompt":"hello there","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
	for i := range 3 {
		for _, tc := range []struct{ path, body string }{{"/v1/chat/completions", string(chat)}, {"/v1/completions", completion}} {
			evs, err := cutStream(t, srv.URL+tc.path, tc.body)
			content := 0
			for _, e := range evs {
				var c chunk
				mustJSON(t, []byte(e), &c)
				if len(c.Choices) != 1 || c.Choices[0].FinishReason != nil || c.Usage != nil {
					t.Errorf("stream %d, %s: event %s after which the stream should have been cut", i, tc.path, e)
				}
				if ch := c.Choices[0]; (ch.Text != nil && *ch.Text != "") || (ch.Delta != nil && ch.Delta.Content != nil && *ch.Delta.Content != "") {
					content++
				}
			}
			if err == nil || content != 3 {
				t.Errorf("stream %d, %s: %d content chunks, read error %v; want 3, then a broken body", i, tc.path, content, err)
			}
		}
	}
	evs, err := cutStream(t, srv.URL+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":3,"stream":true}`)
	if err != nil || len(evs) != 4 || evs[3] != "[DONE]" {
		t.Errorf("three-token stream = %q, %v; want three chunks and [DONE]", evs, err)
	}

	evs, _ = cutStream(t, srv.URL+"/v1/chat/completions", string(chat))
	var delivered string
	for _, e := range evs {
		var c chunk
		mustJSON(t, []byte(e), &c)
		delivered += *c.Choices[0].Delta.Content
	}
	rest := ask(t, healthy, "/v1/chat/completions", continuation(msgs, delivered, 5, false))
	got := strings.Fields(delivered + rest.text())
	start := slices.Index(words, got[0])
	for i, w := range got {
		if want := words[(start+i)%len(words)]; w != want || len(got) != 8 {
			t.Fatalf("cut answer %q + continuation %q: word %d is %q, want %q in an answer of 8", delivered, rest.text(), i, w, want)
		}
	}
}
