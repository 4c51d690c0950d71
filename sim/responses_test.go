package sim

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb/internal/pipenet"
)

// call sends method to url with body as JSON (no body when empty) and
// returns the status and the answer.
func call(t *testing.T, c *http.Client, method, url, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return resp.StatusCode, b
}

// mustJSON decodes b into v or fails the test.
func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
}

// sseEvent is one named server-sent event.
type sseEvent struct{ name, data string }

// namedEvents reads an SSE body of named events, each an "event:" line
// and a "data:" line.
func namedEvents(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.name == "" || ev.data == "" {
				t.Fatalf("incomplete event %+v", ev)
			}
			out = append(out, ev)
			ev = sseEvent{}
		case strings.HasPrefix(line, "event: ") && ev.name == "":
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && ev.name != "" && ev.data == "":
			ev.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("line %q out of place", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// response is what the tests read of a response object.
type response struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Model              string  `json:"model"`
	Status             string  `json:"status"`
	Background         bool    `json:"background"`
	Store              bool    `json:"store"`
	PreviousResponseID *string `json:"previous_response_id"`
	Output             []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (r *response) text() string {
	if len(r.Output) == 0 || len(r.Output[0].Content) == 0 {
		return ""
	}
	return r.Output[0].Content[0].Text
}

var (
	responseID = regexp.MustCompile(`^resp_[0-9a-f]{32}$`)
	messageID  = regexp.MustCompile(`^msg_[0-9a-f]{32}$`)
)

// tokensOf is the emulation's prompt token count for rendered text.
func tokensOf(rendered string) int { return len(rendered) / BytesPerToken }

// TestResponsesLifecycle: create, GET, a follow-up by
// previous_response_id priced as the same conversation through chat, its
// input items, DELETE, and GET after it.
func TestResponsesLifecycle(t *testing.T) {
	srv := fastServer(t)
	c := srv.Client()
	url := srv.URL + "/v1/responses"

	code, b := call(t, c, "POST", url, `{"model":"m","input":"hello there","instructions":"be brief","max_output_tokens":4}`)
	if code != 200 {
		t.Fatalf("create: %d %s", code, b)
	}
	var first response
	mustJSON(t, b, &first)
	wantPrompt := tokensOf("<|start|>system\nbe brief<|end|>\n<|start|>user\nhello there<|end|>\n<|start|>assistant\n")
	out := first.Output
	if !responseID.MatchString(first.ID) || first.Object != "response" || first.Model != "m" || !first.Store || first.Background ||
		first.PreviousResponseID != nil || len(out) != 1 || !messageID.MatchString(out[0].ID) || out[0].Type != "message" ||
		out[0].Role != "assistant" || out[0].Status != "completed" || len(out[0].Content) != 1 ||
		out[0].Content[0].Type != "output_text" || out[0].Content[0].Annotations == nil || len(strings.Fields(first.text())) != 4 {
		t.Errorf("create answered %s", b)
	}
	// vLLM marks a response that ran to max_output_tokens incomplete.
	if first.Status != "incomplete" || !strings.Contains(string(b), `"incomplete_details":{"reason":"max_output_tokens"}`) {
		t.Errorf("status %q, answer %s; want incomplete for max_output_tokens", first.Status, b)
	}
	if u := first.Usage; u == nil || u.InputTokens != wantPrompt || u.OutputTokens != 4 || u.TotalTokens != wantPrompt+4 {
		t.Errorf("usage %+v, want %d in and 4 out", u, wantPrompt)
	}

	code, got := call(t, c, "GET", url+"/"+first.ID, "")
	var a, g map[string]any
	mustJSON(t, b, &a)
	mustJSON(t, got, &g)
	if code != 200 || !reflect.DeepEqual(a, g) {
		t.Errorf("GET = %d %s, want the created response %s", code, got, b)
	}

	code, b = call(t, c, "POST", url, `{"model":"m","instructions":"be brief","max_output_tokens":2,"previous_response_id":"`+first.ID+`",
		"input":[{"role":"user","content":"and then?"},{"type":"message","role":"user","content":[{"type":"input_text","text":"go on"}]}]}`)
	if code != 200 {
		t.Fatalf("follow-up: %d %s", code, b)
	}
	var second response
	mustJSON(t, b, &second)
	if second.PreviousResponseID == nil || *second.PreviousResponseID != first.ID || second.ID == first.ID {
		t.Errorf("follow-up answered %s", b)
	}
	// The same conversation through chat costs the same.
	chat, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []any{
		map[string]any{"role": "system", "content": "be brief"},
		map[string]any{"role": "user", "content": "hello there"},
		map[string]any{"role": "assistant", "content": first.text()},
		map[string]any{"role": "user", "content": "and then?"},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "go on"}}},
	}})
	_, cb := call(t, c, "POST", srv.URL+"/v1/chat/completions", string(chat))
	var cu struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	mustJSON(t, cb, &cu)
	if second.Usage == nil || second.Usage.InputTokens != cu.Usage.PromptTokens {
		t.Errorf("follow-up input_tokens %+v, the same conversation through chat %d", second.Usage, cu.Usage.PromptTokens)
	}

	type itemList struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Role    string `json:"role"`
			Content []struct {
				Type, Text string
			} `json:"content"`
		} `json:"data"`
		FirstID string `json:"first_id"`
		LastID  string `json:"last_id"`
		HasMore bool   `json:"has_more"`
	}
	ids := map[string]string{} // text to id: the same in every listing
	for _, tc := range []struct {
		query     string
		wantTexts []string
		wantMore  bool
	}{
		{"", []string{"go on", "and then?"}, false}, // newest first, as OpenAI lists them
		{"?order=asc", []string{"and then?", "go on"}, false},
		{"?order=asc&limit=1", []string{"and then?"}, true},
	} {
		code, b := call(t, c, "GET", url+"/"+second.ID+"/input_items"+tc.query, "")
		var l itemList
		mustJSON(t, b, &l)
		var texts []string
		for _, d := range l.Data {
			if !messageID.MatchString(d.ID) || d.Type != "message" || d.Role != "user" || len(d.Content) != 1 || d.Content[0].Type != "input_text" {
				t.Errorf("input_items%s: item %+v", tc.query, d)
			}
			texts = append(texts, d.Content[0].Text)
			if id, ok := ids[d.Content[0].Text]; ok && id != d.ID {
				t.Errorf("input_items%s: item %q has id %s, before %s", tc.query, d.Content[0].Text, d.ID, id)
			}
			ids[d.Content[0].Text] = d.ID
		}
		if code != 200 || l.Object != "list" || !reflect.DeepEqual(texts, tc.wantTexts) || l.HasMore != tc.wantMore ||
			l.FirstID != l.Data[0].ID || l.LastID != l.Data[len(l.Data)-1].ID {
			t.Errorf("input_items%s = %d %s, want texts %q, has_more %v", tc.query, code, b, tc.wantTexts, tc.wantMore)
		}
	}

	code, b = call(t, c, "DELETE", url+"/"+first.ID, "")
	if want := `{"deleted":true,"id":"` + first.ID + `","object":"response"}`; code != 200 || strings.TrimSpace(string(b)) != want {
		t.Errorf("DELETE = %d %s, want %s", code, b, want)
	}
	if code, b := call(t, c, "GET", url+"/"+first.ID, ""); code != 404 {
		t.Errorf("GET after DELETE = %d %s, want 404", code, b)
	}
	// The follow-up holds its conversation: one more turn still prices it
	// whole.
	code, b = call(t, c, "POST", url, `{"model":"m","max_output_tokens":1,"previous_response_id":"`+second.ID+`","input":"x"}`)
	var third response
	mustJSON(t, b, &third)
	if code != 200 || third.Usage == nil || third.Usage.InputTokens <= second.Usage.InputTokens {
		t.Errorf("follow-up after the first was deleted: %d %s", code, b)
	}
}

// TestResponsesFollowUpDropsSystemTurns: instructions and system items do
// not carry over to a follow-up, as in vLLM; the rest of the conversation
// does.
func TestResponsesFollowUpDropsSystemTurns(t *testing.T) {
	srv := fastServer(t)
	url := srv.URL + "/v1/responses"
	_, b := call(t, srv.Client(), "POST", url, `{"model":"m","instructions":"be brief","max_output_tokens":2,
		"input":[{"role":"system","content":"old rules"},{"role":"user","content":"hi"}]}`)
	var first response
	mustJSON(t, b, &first)
	code, b := call(t, srv.Client(), "POST", url, `{"model":"m","input":"next","max_output_tokens":1,"previous_response_id":"`+first.ID+`"}`)
	var second response
	mustJSON(t, b, &second)
	want := tokensOf("<|start|>user\nhi<|end|>\n<|start|>assistant\n" + first.text() + "<|end|>\n<|start|>user\nnext<|end|>\n<|start|>assistant\n")
	if code != 200 || second.Usage == nil || second.Usage.InputTokens != want {
		t.Errorf("follow-up = %d %s, want %d input tokens", code, b, want)
	}
}

// TestResponsesUnknownID: every route answers an id the store lacks with
// vLLM's 404, byte for byte.
func TestResponsesUnknownID(t *testing.T) {
	srv := fastServer(t)
	const want = `{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
	for _, tc := range []struct{ name, method, path, body string }{
		{"previous_response_id", "POST", "/v1/responses", `{"model":"m","input":"hi","previous_response_id":"resp_nope"}`},
		{"get", "GET", "/v1/responses/resp_nope", ""},
		{"cancel", "POST", "/v1/responses/resp_nope/cancel", ""},
		{"delete", "DELETE", "/v1/responses/resp_nope", ""},
		{"input_items", "GET", "/v1/responses/resp_nope/input_items", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := call(t, srv.Client(), tc.method, srv.URL+tc.path, tc.body)
			if code != 404 || strings.TrimSpace(string(b)) != want {
				t.Errorf("%s %s = %d %s, want 404 %s", tc.method, tc.path, code, b, want)
			}
		})
	}
}

// TestResponsesStreamEvents: a streamed response's events come in vLLM's
// order, numbered from 0, the text deltas adding up to the final text, the
// usage in response.completed; the response is stored by then.
func TestResponsesStreamEvents(t *testing.T) {
	srv := fastServer(t)
	resp := post(t, srv.URL+"/v1/responses", `{"model":"m","input":"hello there","max_output_tokens":3,"stream":true}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := namedEvents(t, resp.Body)
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	var names []string
	for _, e := range evs {
		names = append(names, e.name)
	}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("events %q, want %q", names, want)
	}
	var deltas, done string
	var final response
	for i, e := range evs {
		var ev struct {
			Type           string    `json:"type"`
			SequenceNumber int       `json:"sequence_number"`
			Response       *response `json:"response"`
			ItemID         string    `json:"item_id"`
			Delta          string    `json:"delta"`
			Text           string    `json:"text"`
		}
		mustJSON(t, []byte(e.data), &ev)
		if ev.Type != e.name || ev.SequenceNumber != i {
			t.Errorf("event %d: type %q, sequence_number %d in %s", i, ev.Type, ev.SequenceNumber, e.data)
		}
		switch e.name {
		case "response.created", "response.in_progress":
			if ev.Response == nil || ev.Response.Status != "in_progress" || ev.Response.Usage != nil || len(ev.Response.Output) != 0 {
				t.Errorf("%s: %s", e.name, e.data)
			}
		case "response.output_text.delta":
			deltas += ev.Delta
		case "response.output_text.done":
			done = ev.Text
		case "response.completed":
			final = *ev.Response
		}
	}
	if deltas == "" || done != deltas || final.text() != deltas {
		t.Errorf("deltas %q, done %q, final text %q", deltas, done, final.text())
	}
	if u := final.Usage; u == nil || u.InputTokens < 1 || u.OutputTokens != 3 || u.TotalTokens != u.InputTokens+3 {
		t.Errorf("response.completed usage %+v", u)
	}
	code, b := call(t, srv.Client(), "GET", srv.URL+"/v1/responses/"+final.ID, "")
	var stored response
	mustJSON(t, b, &stored)
	if code != 200 || stored.text() != deltas {
		t.Errorf("GET of the streamed response = %d %s", code, b)
	}

	// store=false: answered, not kept.
	resp = post(t, srv.URL+"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1,"stream":true,"store":false}`)
	evs = namedEvents(t, resp.Body)
	mustJSON(t, []byte(evs[len(evs)-1].data), &struct{ Response *response }{&final})
	if code, b := call(t, srv.Client(), "GET", srv.URL+"/v1/responses/"+final.ID, ""); code != 404 || final.Store {
		t.Errorf("GET of a store=false response = %d %s; store echoed %v", code, b, final.Store)
	}
}

// TestResponsesFollowUpHitsPrefixCache: on the engine model, a follow-up
// by previous_response_id finds its conversation's prefix in the server's
// cache, as a chat follow-up does.
func TestResponsesFollowUpHitsPrefixCache(t *testing.T) {
	cfg, err := Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ServerConfig{Model: "m"}, NewLive(cfg, 1000))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	instructions := strings.Repeat("You answer questions about the quarterly report. ", 60)
	body, _ := json.Marshal(map[string]any{"model": "m", "instructions": instructions, "input": "What were the sales?", "max_output_tokens": 8})
	code, b := call(t, srv.Client(), "POST", srv.URL+"/v1/responses", string(body))
	var first response
	mustJSON(t, b, &first)
	if code != 200 || first.Usage == nil {
		t.Fatalf("first: %d %s", code, b)
	}
	body, _ = json.Marshal(map[string]any{"model": "m", "instructions": instructions, "input": "And the costs?",
		"previous_response_id": first.ID, "max_output_tokens": 8})
	code, b = call(t, srv.Client(), "POST", srv.URL+"/v1/responses", string(body))
	var second response
	mustJSON(t, b, &second)
	if code != 200 || second.Usage == nil {
		t.Fatalf("follow-up: %d %s", code, b)
	}
	// The first prompt is a prefix of the second; all its full blocks of
	// 16 tokens are cached.
	if want := first.Usage.InputTokens / 16 * 16; second.Usage.InputTokensDetails.CachedTokens < want || want == 0 {
		t.Errorf("follow-up cached_tokens = %d of %d, want at least the first prompt's %d", second.Usage.InputTokensDetails.CachedTokens,
			second.Usage.InputTokens, want)
	}
}

// bubbleServer serves an emulated server on m at http://sim:8000 on an
// in-memory network, for a test inside a synctest bubble; stop closes it
// before the bubble ends.
func bubbleServer(t *testing.T, cfg ServerConfig, m Model) (c *http.Client, stop func()) {
	t.Helper()
	s, err := NewServer(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	var pn pipenet.Network
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(pn.Listen("sim:8000"))
	tr := &http.Transport{DialContext: pn.DialContext}
	return &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		hs.Close()
	}
}

// TestResponsesBackground: a background response answers queued at once,
// runs on, and GET shows it finished; cancelling a running one stops its
// work and keeps it cancelled; a finished one cannot be cancelled. On the
// bubble's fake clock, so polling needs no sleeps.
func TestResponsesBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewSteady(SteadyConfig{DecodeTokensPerSecond: 10, FirstTokenLatency: 100 * time.Millisecond})
		c, stop := bubbleServer(t, ServerConfig{Model: "m"}, m)
		defer stop()
		const url = "http://sim:8000/v1/responses"
		get := func(id string) response {
			t.Helper()
			code, b := call(t, c, "GET", url+"/"+id, "")
			var r response
			mustJSON(t, b, &r)
			if code != 200 {
				t.Fatalf("GET %s = %d %s", id, code, b)
			}
			return r
		}

		code, b := call(t, c, "POST", url, `{"model":"m","input":"hi","max_output_tokens":5,"background":true}`)
		var r response
		mustJSON(t, b, &r)
		if code != 200 || r.Status != "queued" || !r.Background || len(r.Output) != 0 || r.Usage != nil {
			t.Fatalf("background create = %d %s", code, b)
		}
		if g := get(r.ID); g.Status != "queued" {
			t.Errorf("GET at once: status %q, want queued", g.Status)
		}
		advance(10 * time.Second)
		done := get(r.ID)
		if done.Status != "incomplete" || len(strings.Fields(done.text())) != 5 || done.Usage == nil || done.Usage.OutputTokens != 5 {
			t.Errorf("GET when done: %+v", done)
		}
		const notCancellable = `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":"response_id","code":400}}`
		if code, b := call(t, c, "POST", url+"/"+r.ID+"/cancel", ""); code != 400 || strings.TrimSpace(string(b)) != notCancellable {
			t.Errorf("cancel of a finished response = %d %s, want 400 %s", code, b, notCancellable)
		}

		_, b = call(t, c, "POST", url, `{"model":"m","input":"hi","max_output_tokens":1000,"background":true}`)
		mustJSON(t, b, &r)
		advance(time.Second)
		if st := m.Stats(); st.Running != 1 {
			t.Fatalf("running %d, want the background response", st.Running)
		}
		code, b = call(t, c, "POST", url+"/"+r.ID+"/cancel", "")
		var cancelled response
		mustJSON(t, b, &cancelled)
		if code != 200 || cancelled.Status != "cancelled" || cancelled.ID != r.ID {
			t.Errorf("cancel = %d %s", code, b)
		}
		synctest.Wait()
		if st := m.Stats(); st.Running != 0 || st.Waiting != 0 {
			t.Errorf("after cancel: running %d, waiting %d; want the work stopped", st.Running, st.Waiting)
		}
		advance(200 * time.Second)
		if g := get(r.ID); g.Status != "cancelled" || len(g.Output) != 0 {
			t.Errorf("GET after cancel: %+v", g)
		}

		code, b = call(t, c, "POST", url, `{"model":"m","input":"hi","background":true,"store":false}`)
		if code != 400 || !strings.Contains(string(b), "background can only be used when `store` is true") {
			t.Errorf("background without store = %d %s", code, b)
		}
	})
}

// TestResponsesBackgroundStream: a streamed background response streams
// its events to the request that made it, and GET with stream=true replays
// them after starting_after.
func TestResponsesBackgroundStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, stop := bubbleServer(t, ServerConfig{Model: "m"}, NewSteady(SteadyConfig{DecodeTokensPerSecond: 10}))
		defer stop()
		const url = "http://sim:8000/v1/responses"
		resp, err := c.Post(url, "application/json", strings.NewReader(`{"model":"m","input":"hi","max_output_tokens":3,"background":true,"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		evs := namedEvents(t, resp.Body)
		resp.Body.Close()
		if len(evs) != 11 || evs[10].name != "response.completed" {
			t.Fatalf("background stream: %d events, last %+v", len(evs), evs[len(evs)-1])
		}
		var created struct{ Response response }
		mustJSON(t, []byte(evs[0].data), &created)
		replay, err := c.Get(url + "/" + created.Response.ID + "?stream=true&starting_after=5")
		if err != nil {
			t.Fatal(err)
		}
		again := namedEvents(t, replay.Body)
		replay.Body.Close()
		if !reflect.DeepEqual(again, evs[6:]) {
			t.Errorf("replay after 5 = %q, want %q", again, evs[6:])
		}
	})
}

// TestResponseStoreBounds: the store keeps the newest MaxStoredResponses;
// a negative size keeps none, ignoring store=true and refusing background.
func TestResponseStoreBounds(t *testing.T) {
	for _, tc := range []struct {
		name       string
		max        int
		wantKept   []int // statuses of GET for the three responses made
		background int
	}{
		{"newest two", 2, []int{404, 200, 200}, 200},
		{"none", -1, []int{404, 404, 404}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewServer(ServerConfig{Model: "m", MaxStoredResponses: tc.max}, NewSteady(SteadyConfig{Speed: 1000}))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			var ids []string
			for range 3 {
				_, b := call(t, srv.Client(), "POST", srv.URL+"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1}`)
				var r response
				mustJSON(t, b, &r)
				if r.Store != (tc.max >= 0) {
					t.Errorf("store echoed %v with MaxStoredResponses %d", r.Store, tc.max)
				}
				ids = append(ids, r.ID)
			}
			var got []int
			for _, id := range ids {
				code, _ := call(t, srv.Client(), "GET", srv.URL+"/v1/responses/"+id, "")
				got = append(got, code)
			}
			if !reflect.DeepEqual(got, tc.wantKept) {
				t.Errorf("GET of the three = %v, want %v", got, tc.wantKept)
			}
			if code, b := call(t, srv.Client(), "POST", srv.URL+"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1,"background":true}`); code != tc.background {
				t.Errorf("background = %d %s, want %d", code, b, tc.background)
			}
		})
	}
}

// TestResponsesRequestID: a client's request_id becomes the response's id,
// as in vLLM.
func TestResponsesRequestID(t *testing.T) {
	srv := fastServer(t)
	code, b := call(t, srv.Client(), "POST", srv.URL+"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1,"request_id":"resp_mine"}`)
	var r response
	mustJSON(t, b, &r)
	if code != 200 || r.ID != "resp_mine" {
		t.Errorf("create with request_id = %d %s", code, b)
	}
	if code, _ := call(t, srv.Client(), "GET", srv.URL+"/v1/responses/resp_mine", ""); code != 200 {
		t.Errorf("GET resp_mine = %d", code)
	}
}
