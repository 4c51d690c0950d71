package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file serves OpenAI's Responses API as vLLM does
// (vllm/entrypoints/openai/responses): POST /v1/responses, GET and cancel
// by id, and the store they read. OpenAI's DELETE and input_items, which
// vLLM lacks, are served too. A request's input becomes chat turns
// rendered by the same template as chat, and runs through the same
// [Server.admit] and [Server.run], so the Responses API and chat price a
// conversation alike.

// responsesRequest is what the emulation reads of a Responses API
// request; the fields after RequestID are only echoed in the response.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              *bool           `json:"store"` // nil is true
	Background         bool            `json:"background"`
	Stream             bool            `json:"stream"`
	RequestID          string          `json:"request_id"` // vLLM's extension: the response's id

	Metadata          json.RawMessage `json:"metadata"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	Text              json.RawMessage `json:"text"`
	Reasoning         json.RawMessage `json:"reasoning"`
	User              *string         `json:"user"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
}

// responseObject is a response as vLLM's ResponsesResponse writes it, with
// OpenAI's store field added.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Model              string             `json:"model"`
	Status             string             `json:"status"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	Metadata           json.RawMessage    `json:"metadata"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	Temperature        float64            `json:"temperature"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopP               float64            `json:"top_p"`
	Background         bool               `json:"background"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	ServiceTier        string             `json:"service_tier"`
	Store              bool               `json:"store"`
	Text               json.RawMessage    `json:"text"`
	Truncation         string             `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               *string            `json:"user"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

// outputMessage is the assistant message a response outputs.
type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

func newOutputText(text string) outputText {
	return outputText{Type: "output_text", Text: text, Annotations: []any{}}
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// Response statuses.
const (
	statusQueued     = "queued"
	statusInProgress = "in_progress"
	statusIncomplete = "incomplete"
	statusCancelled  = "cancelled"
	statusFailed     = "failed"
)

// responseNotFound is vLLM's answer for an id it does not hold, whether
// asked for directly or as previous_response_id (serving.py,
// _make_not_found_error).
func responseNotFound(id string) *refusal {
	return &refusal{status: http.StatusNotFound, typ: "invalid_request_error", param: "response_id",
		msg: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// createResponse serves POST /v1/responses: read the request, price it
// as its whole conversation, then answer at once (background), as a
// stream, or when done.
func (s *Server) createResponse(w http.ResponseWriter, r *http.Request) {
	req, store, rf := s.readResponsesRequest(r)
	if rf != nil {
		writeVLLM(w, rf)
		return
	}
	if s.generationFault(w, r, writeVLLM) {
		return
	}
	rec, a, rf := s.admitResponse(req, store, r.Header.Get(rankHeader))
	if rf != nil {
		writeVLLM(w, rf)
		return
	}
	switch {
	case req.Background:
		s.startBackground(w, r, a, rec, req.Stream)
	case req.Stream:
		sse := startSSE(w, a.die)
		defer sse.close()
		_, err := s.respond(r.Context(), a, rec.resp, func(name string, ev map[string]any) error { return sse.send(name, ev) },
			func(final responseObject) { s.keep(rec, final, store) })
		sse.abortOnDie(err) // end the stream early: no response.completed
	default:
		final, err := s.respond(r.Context(), a, rec.resp, nil, func(final responseObject) { s.keep(rec, final, store) })
		abortOnDie(err)
		if err != nil {
			return // the client left
		}
		writeAnswer(w, a, final)
	}
}

// readResponsesRequest decodes a request and reports whether its response
// is to be stored: store defaults to true, background needs it, and a
// server that keeps no responses ignores it, as vLLM without its store
// does.
func (s *Server) readResponsesRequest(r *http.Request) (*responsesRequest, bool, *refusal) {
	var req responsesRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return nil, false, badRequest("", "Invalid request body: "+err.Error())
	}
	store := req.Store == nil || *req.Store
	if req.Background && !store {
		return nil, false, badRequest("background", "background can only be used when `store` is true")
	}
	if s.responses == nil {
		if req.Background {
			return nil, false, badRequest("background", "This server keeps no responses (MaxStoredResponses < 0), so it runs none in the background.")
		}
		store = false
	}
	return &req, store, nil
}

// admitResponse renders req's prompt, its instructions as a system turn,
// the conversation of previous_response_id and its input, and admits it,
// returning the response to be and the generation to run.
func (s *Server) admitResponse(req *responsesRequest, store bool, rank string) (*storedResponse, admitted, *refusal) {
	adapter, rf := s.lookupModel(req.Model)
	if rf != nil {
		return nil, admitted{}, rf
	}
	var turns []turn
	if req.Instructions != nil && *req.Instructions != "" {
		turns = append(turns, turn{role: "system", text: *req.Instructions})
	}
	var prev *storedResponse
	if id := req.PreviousResponseID; id != nil && *id != "" {
		var history []turn
		if prev, history = s.responses.conversation(*id); prev == nil {
			return nil, admitted{}, responseNotFound(*id)
		}
		turns = append(turns, history...)
	}
	id := req.RequestID
	if id == "" {
		id = randomID("resp_")
	}
	input, _, err := readInput(req.Input, id)
	if err != nil {
		return nil, admitted{}, badRequest("input", err.Error())
	}
	turns = append(turns, input...)
	maxTokens := defaultChatMaxTokens
	if req.MaxOutputTokens != nil {
		maxTokens = *req.MaxOutputTokens
	}
	if maxTokens < 1 {
		return nil, admitted{}, badRequest("max_output_tokens", "max_output_tokens must be at least 1, got "+strconv.Itoa(maxTokens)+".")
	}
	// A background response runs apart from its request: die-mid-stream
	// stops it as it stops a stream.
	a, rf := s.admit(generation{model: req.Model, adapter: adapter, prompt: renderChat(turns), maxTokens: maxTokens, rank: rank,
		stream: req.Stream || req.Background})
	if rf != nil {
		return nil, admitted{}, rf
	}
	return &storedResponse{id: id, prev: prev, input: req.Input, resp: newResponseObject(id, req, store, maxTokens)}, a, nil
}

// newResponseObject is the response to req before it runs: no output, no
// usage, the request's settings echoed with vLLM's defaults.
func newResponseObject(id string, req *responsesRequest, store bool, maxTokens int) responseObject {
	o := responseObject{
		ID: id, Object: "response", CreatedAt: time.Now().Unix(), Model: req.Model, Status: statusInProgress,
		Instructions: req.Instructions, Metadata: req.Metadata, Output: []outputMessage{},
		ParallelToolCalls: true, Temperature: 1, ToolChoice: req.ToolChoice, Tools: req.Tools, TopP: 1,
		Background: req.Background, MaxOutputTokens: maxTokens, PreviousResponseID: req.PreviousResponseID,
		Reasoning: req.Reasoning, ServiceTier: "auto", Store: store, Text: req.Text, Truncation: "disabled", User: req.User,
	}
	if req.ParallelToolCalls != nil {
		o.ParallelToolCalls = *req.ParallelToolCalls
	}
	if req.Temperature != nil {
		o.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		o.TopP = *req.TopP
	}
	if o.ToolChoice == nil {
		o.ToolChoice = json.RawMessage(`"auto"`)
	}
	if o.Tools == nil {
		o.Tools = json.RawMessage(`[]`)
	}
	return o
}

// keep stores rec with its final response when the request asked for it.
func (s *Server) keep(rec *storedResponse, final responseObject, store bool) {
	if store {
		rec.resp = final
		s.responses.put(rec)
	}
}

// respond runs a, the generation of resp, and returns resp finished with
// its output and usage. done gets the finished response before the last
// stream event goes out, so a client that reads response.completed finds
// the response stored. emit, when not nil, gets the stream's events in
// vLLM's order: response.created and response.in_progress at once, the
// message's output_item.added and content_part.added with the first
// token, an output_text.delta per token, then output_text.done,
// content_part.done, output_item.done and response.completed, numbered
// from 0 in sequence_number.
func (s *Server) respond(ctx context.Context, a admitted, resp responseObject,
	emit func(name string, ev map[string]any) error, done func(responseObject)) (responseObject, error) {
	seq := 0
	send := func(name string, ev map[string]any) error {
		if emit == nil {
			return nil
		}
		ev["type"] = name
		ev["sequence_number"] = seq
		seq++
		return emit(name, ev)
	}
	resp.Status = statusInProgress
	if err := send("response.created", map[string]any{"response": resp}); err != nil {
		return resp, err
	}
	if err := send("response.in_progress", map[string]any{"response": resp}); err != nil {
		return resp, err
	}
	msg := outputMessage{ID: randomID("msg_"), Type: "message", Role: "assistant", Status: statusInProgress, Content: []outputText{}}
	at := func(ev map[string]any) map[string]any {
		ev["item_id"], ev["output_index"], ev["content_index"] = msg.ID, 0, 0
		return ev
	}
	var text strings.Builder
	n := 0
	cached, err := s.run(ctx, a, func(t string) error {
		if n == 0 {
			if err := send("response.output_item.added", map[string]any{"output_index": 0, "item": msg}); err != nil {
				return err
			}
			if err := send("response.content_part.added", at(map[string]any{"part": newOutputText("")})); err != nil {
				return err
			}
		}
		n++
		text.WriteString(t)
		return send("response.output_text.delta", at(map[string]any{"delta": t, "logprobs": []any{}}))
	})
	if err != nil {
		return resp, err
	}
	part := newOutputText(text.String())
	msg.Status, msg.Content = "completed", []outputText{part}
	// The engines always run to max_output_tokens, and vLLM marks a
	// response that stopped for its length incomplete (serving.py,
	// responses_full_generator), though its stream still ends with
	// response.completed.
	resp.Status, resp.IncompleteDetails = statusIncomplete, &incompleteDetails{Reason: "max_output_tokens"}
	resp.Output = []outputMessage{msg}
	u := &responseUsage{InputTokens: a.prompt, OutputTokens: a.job.MaxTokens, TotalTokens: a.prompt + a.job.MaxTokens}
	u.InputTokensDetails.CachedTokens = cached
	resp.Usage = u
	for _, ev := range []struct {
		name string
		ev   map[string]any
	}{
		{"response.output_text.done", at(map[string]any{"text": part.Text, "logprobs": []any{}})},
		{"response.content_part.done", at(map[string]any{"part": part})},
		{"response.output_item.done", map[string]any{"output_index": 0, "item": msg}},
	} {
		if err := send(ev.name, ev.ev); err != nil {
			return resp, err
		}
	}
	done(resp)
	return resp, send("response.completed", map[string]any{"response": resp})
}

// startBackground stores rec as queued and runs it apart from the
// request, which vLLM answers at once with the queued response, or, for a
// streamed request, with the stream of its events as they come. GET shows
// it queued until it ends, as vLLM's does.
func (s *Server) startBackground(w http.ResponseWriter, r *http.Request, a admitted, rec *storedResponse, stream bool) {
	// The work outlives the request that started it; cancel ends it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	rec.resp.Status = statusQueued
	rec.cancel = cancel
	queued := rec.resp
	var emit func(string, map[string]any) error
	if stream {
		rec.events = newEventLog()
		emit = func(name string, ev map[string]any) error {
			frame, err := sseFrame(name, ev)
			if err == nil {
				rec.events.add(frame)
			}
			return err
		}
	}
	s.responses.put(rec)
	go func() {
		defer cancel()
		if rec.events != nil {
			defer rec.events.close()
		}
		_, err := s.respond(ctx, a, queued, emit, func(final responseObject) { s.responses.finish(rec, final) })
		if err != nil {
			s.responses.fail(rec)
		}
	}()
	if stream {
		followEvents(w, r, rec.events, 0)
		return
	}
	writeJSON(w, queued)
}

// getResponse serves GET /v1/responses/{id}: the stored response, or with
// stream=true a background stream's events after starting_after.
func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	resp, events, ok := s.responses.get(id)
	if !ok {
		writeVLLM(w, responseNotFound(id))
		return
	}
	q := r.URL.Query()
	if q.Get("stream") != "true" {
		writeJSON(w, resp)
		return
	}
	if events == nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "response_id", "Unknown response_id: "+id)
		return
	}
	from := 0
	if v := q.Get("starting_after"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 {
			vllmError(w, http.StatusBadRequest, "BadRequestError", "starting_after", fmt.Sprintf("starting_after %q is not a sequence number", v))
			return
		}
		from = n + 1
	}
	followEvents(w, r, events, from)
}

// cancelResponse serves POST /v1/responses/{id}/cancel: a queued or
// running background response is cancelled and its work stopped.
func (s *Server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	resp, rf := s.responses.cancel(r.PathValue("id"))
	if rf != nil {
		writeVLLM(w, rf)
		return
	}
	writeJSON(w, resp)
}

// deleteResponse serves DELETE /v1/responses/{id}, OpenAI's, which vLLM
// lacks: the response leaves the store, its background work stopped.
func (s *Server) deleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.responses.remove(id) {
		writeVLLM(w, responseNotFound(id))
		return
	}
	writeJSON(w, map[string]any{"id": id, "object": "response", "deleted": true})
}

// listInputItems serves GET /v1/responses/{id}/input_items, OpenAI's,
// which vLLM lacks: the response's own input items (not those of the
// responses it follows), newest first unless order=asc, at most limit
// (1 to 100, default 20), as OpenAI lists them.
func (s *Server) listInputItems(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	input, ok := s.responses.input(id)
	if !ok {
		writeVLLM(w, responseNotFound(id))
		return
	}
	_, items, err := readInput(input, id)
	if err != nil { // it was read when stored
		vllmError(w, http.StatusInternalServerError, "InternalServerError", "", err.Error())
		return
	}
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			vllmError(w, http.StatusBadRequest, "BadRequestError", "limit", fmt.Sprintf("limit %q is not 1 to 100", v))
			return
		}
		limit = n
	}
	switch q.Get("order") {
	case "", "desc":
		slices.Reverse(items)
	case "asc":
	default:
		vllmError(w, http.StatusBadRequest, "BadRequestError", "order", fmt.Sprintf("order %q is not asc or desc", q.Get("order")))
		return
	}
	more := len(items) > limit
	items = items[:min(limit, len(items))]
	var first, last any
	if len(items) > 0 {
		first, last = items[0]["id"], items[len(items)-1]["id"]
	}
	writeJSON(w, map[string]any{"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": more})
}

// inputItem is one Responses API input item, the fields the template
// reads of the kinds it renders.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// itemIDPrefix is the id prefix OpenAI gives each kind of input item.
var itemIDPrefix = map[string]string{"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}

// itemID is the id of response respID's i-th input item when the client
// gave it none: 32 hex digits like a random UUID's, but derived from the
// response, so that input_items lists the same ids every time.
func itemID(typ, respID string, i int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", respID, i))
	return itemIDPrefix[typ] + hex.EncodeToString(sum[:16])
}

// readInput reads the input of response respID, a string or a list of
// items, into chat turns (as vLLM's construct_input_messages does) and
// into the items as input_items lists them: each with an id, a message's
// string content as one text part. Reasoning items are listed but not
// rendered, as chat templates drop earlier turns' reasoning. The store
// keeps the input as sent and reads it again when asked, so a response's
// input is held once.
func readInput(raw json.RawMessage, respID string) ([]turn, []map[string]any, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		item := map[string]any{"id": itemID("message", respID, 0), "type": "message", "role": "user", "status": "completed",
			"content": []any{map[string]any{"type": "input_text", "text": s}}}
		return []turn{{role: "user", text: s}}, []map[string]any{item}, nil
	}
	var raws []json.RawMessage
	if json.Unmarshal(raw, &raws) != nil {
		return nil, nil, fmt.Errorf("input must be a string or a list of items")
	}
	var turns []turn
	var items []map[string]any
	for i, r := range raws {
		var it inputItem
		var listed map[string]any
		if json.Unmarshal(r, &it) != nil || json.Unmarshal(r, &listed) != nil {
			return nil, nil, fmt.Errorf("input[%d] is not an item", i)
		}
		if it.Type == "" && it.Role != "" {
			it.Type = "message"
			listed["type"] = "message"
		}
		switch it.Type {
		case "message":
			if !slices.Contains([]string{"user", "assistant", "system", "developer"}, it.Role) {
				return nil, nil, fmt.Errorf("input[%d]: role %q is not user, assistant, system or developer", i, it.Role)
			}
			text, present, err := contentText(it.Content)
			if err != nil || !present {
				return nil, nil, fmt.Errorf("input[%d]: content must be a string or a list of parts", i)
			}
			if json.Unmarshal(it.Content, new(string)) == nil {
				typ := "input_text"
				if it.Role == "assistant" {
					typ = "output_text"
				}
				listed["content"] = []any{map[string]any{"type": typ, "text": text}}
			}
			if n := len(turns); it.Role == "assistant" && n > 0 && turns[n-1].role == "assistant" && turns[n-1].text == "" {
				turns[n-1].text = text // the text of a turn that so far only called tools
			} else {
				turns = append(turns, turn{role: it.Role, text: text})
			}
		case "function_call":
			turns = addCall(turns, toolCall{name: it.Name, arguments: it.Arguments})
		case "function_call_output":
			text, _, err := contentText(it.Output)
			if err != nil {
				return nil, nil, fmt.Errorf("input[%d]: output must be a string or a list of parts", i)
			}
			turns = append(turns, turn{role: "tool", text: text})
		case "reasoning":
		default:
			return nil, nil, fmt.Errorf("input[%d]: item type %q is not supported", i, it.Type)
		}
		if id, _ := listed["id"].(string); id == "" {
			listed["id"] = itemID(it.Type, respID, i)
		}
		items = append(items, listed)
	}
	return turns, items, nil
}
