package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// This file serves Anthropic's Messages API as vLLM does
// (vllm/entrypoints/anthropic): POST /v1/messages and
// /v1/messages/count_tokens. vLLM turns a Messages request into a chat
// request and its answer back; here the messages become the chat template's
// turns and run through the same [Server.admit] and [Server.run] as chat,
// so the two APIs price a conversation alike.

// messagesRequest is what the emulation reads of a Messages API request
// (count_tokens reads the same, less max_tokens and stream).
type messagesRequest struct {
	Model     string             `json:"model"`
	Messages  []anthropicMessage `json:"messages"`
	System    json.RawMessage    `json:"system"` // a string or text blocks
	MaxTokens *int               `json:"max_tokens"`
	Stream    bool               `json:"stream"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string or blocks
}

// anthropicBlock is a content block, the fields the template reads.
type anthropicBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`    // tool_use
	Input   json.RawMessage `json:"input"`   // tool_use
	Content json.RawMessage `json:"content"` // tool_result: a string or text blocks
}

// billingHeader starts the system block Claude Code sends with a hash that
// changes on every request; vLLM drops the block, since it would defeat
// prefix caching, and so does the emulation.
const billingHeader = "x-anthropic-billing-header"

// turns renders the request's system prompt and messages as vLLM's
// _convert_anthropic_to_openai_request does: the system text (the system
// field's, then any system messages', joined) as one system turn;
// tool_use blocks as the assistant turn's tool calls; a user's tool_result
// blocks as tool turns ahead of the user's own text, and a user message
// with nothing else left out. Thinking and image blocks add no text.
func (req *messagesRequest) turns() ([]turn, error) {
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("messages must not be empty")
	}
	var system strings.Builder
	if err := systemText(&system, req.System); err != nil {
		return nil, fmt.Errorf("system must be a string or a list of text blocks")
	}
	for _, m := range req.Messages {
		if m.Role == "system" {
			if err := systemText(&system, m.Content); err != nil {
				return nil, fmt.Errorf("system message content must be a string or a list of text blocks")
			}
		}
	}
	var turns []turn
	if system.Len() > 0 {
		turns = append(turns, turn{role: "system", text: system.String()})
	}
	for i, m := range req.Messages {
		switch m.Role {
		case "system":
			continue
		case "user", "assistant":
		default:
			return nil, fmt.Errorf("messages[%d]: role %q is not user or assistant", i, m.Role)
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			turns = append(turns, turn{role: m.Role, text: s})
			continue
		}
		var blocks []anthropicBlock
		if json.Unmarshal(m.Content, &blocks) != nil {
			return nil, fmt.Errorf("messages[%d]: content must be a string or a list of blocks", i)
		}
		t := turn{role: m.Role}
		hasText := false
		for _, b := range blocks {
			switch b.Type {
			case "text":
				t.text += b.Text
				hasText = hasText || b.Text != ""
			case "tool_use":
				args := []byte("{}")
				if len(b.Input) > 0 && string(b.Input) != "null" {
					var buf bytes.Buffer
					if json.Compact(&buf, b.Input) != nil {
						return nil, fmt.Errorf("messages[%d]: tool_use input is not JSON", i)
					}
					args = buf.Bytes()
				}
				t.calls = append(t.calls, toolCall{name: b.Name, arguments: string(args)})
			case "tool_result":
				result, err := toolResultText(b.Content)
				if err != nil {
					return nil, fmt.Errorf("messages[%d]: tool_result content must be a string or a list of blocks", i)
				}
				if m.Role == "user" {
					turns = append(turns, turn{role: "tool", text: result})
				} else {
					t.text += "Tool result: " + result
					hasText = true
				}
			}
		}
		if m.Role == "user" && !hasText {
			continue
		}
		turns = append(turns, t)
	}
	return turns, nil
}

// systemText appends a system prompt, a string or text blocks, to b.
func systemText(b *strings.Builder, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b.WriteString(s)
		return nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return err
	}
	for _, bl := range blocks {
		if bl.Type == "text" && !strings.HasPrefix(bl.Text, billingHeader) {
			b.WriteString(bl.Text)
		}
	}
	return nil
}

// toolResultText is a tool_result's content: a string, or its text blocks
// one to a line.
func toolResultText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", err
	}
	var texts []string
	for _, b := range blocks {
		if b.Type == "text" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// writeAnthropic writes rf in Anthropic's error shape,
// {"type":"error","error":{"type":...,"message":...}}, with Anthropic's
// error type for the status. (vLLM puts its own type names there, but
// clients of this API branch on Anthropic's.)
func writeAnthropic(w http.ResponseWriter, rf *refusal) {
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Type = "error"
	body.Error.Message = rf.msg
	switch {
	case rf.status == http.StatusNotFound:
		body.Error.Type = "not_found_error"
	case rf.status == http.StatusTooManyRequests:
		body.Error.Type = "rate_limit_error"
	case rf.status == 529:
		body.Error.Type = "overloaded_error"
	case rf.status >= 500:
		body.Error.Type = "api_error"
	default:
		body.Error.Type = "invalid_request_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rf.status)
	_ = json.NewEncoder(w).Encode(body)
}

// readMessages decodes a Messages request; one to generate (not to count
// tokens) needs max_tokens of at least 1.
func readMessages(r *http.Request, generate bool) (*messagesRequest, *refusal) {
	var req messagesRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return nil, badRequest("", "Invalid request body: "+err.Error())
	}
	if generate {
		if req.MaxTokens == nil {
			return nil, badRequest("max_tokens", "max_tokens: Field required")
		}
		if *req.MaxTokens < 1 {
			return nil, badRequest("max_tokens", fmt.Sprintf("max_tokens: Input should be greater than 0, got %d", *req.MaxTokens))
		}
	}
	return &req, nil
}

// createMessage serves POST /v1/messages.
func (s *Server) createMessage(w http.ResponseWriter, r *http.Request) {
	req, rf := readMessages(r, true)
	if rf != nil {
		writeAnthropic(w, rf)
		return
	}
	if s.generationFault(w, r, writeAnthropic) {
		return
	}
	adapter, rf := s.lookupModel(req.Model)
	if rf != nil {
		writeAnthropic(w, rf)
		return
	}
	turns, err := req.turns()
	if err != nil {
		writeAnthropic(w, badRequest("messages", err.Error()))
		return
	}
	a, rf := s.admit(generation{model: req.Model, adapter: adapter, prompt: renderChat(turns), maxTokens: *req.MaxTokens,
		rank: r.Header.Get(rankHeader), stream: req.Stream})
	if rf != nil {
		writeAnthropic(w, rf)
		return
	}
	id := randomID("msg_")
	// The engines always run to max_tokens; vLLM maps chat's "length" to
	// Anthropic's "max_tokens".
	const stopReason = "max_tokens"
	usage := map[string]any{"input_tokens": a.prompt, "output_tokens": a.job.MaxTokens}

	if !req.Stream {
		var text strings.Builder
		_, err := s.run(r.Context(), a, func(t string) error { text.WriteString(t); return nil })
		abortOnDie(err)
		if err != nil {
			return // the client left
		}
		writeAnswer(w, a, map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content":     []any{map[string]any{"type": "text", "text": text.String()}},
			"stop_reason": stopReason, "stop_sequence": nil, "usage": usage,
		})
		return
	}

	// vLLM converts chat's stream, whose first chunk comes with the first
	// token, so message_start does too.
	sse := startSSE(w, a.die)
	defer sse.close()
	block := func(ev map[string]any) map[string]any { ev["index"] = 0; return ev }
	n := 0
	_, err = s.run(r.Context(), a, func(t string) error {
		if n == 0 {
			start := map[string]any{"type": "message_start", "message": map[string]any{
				"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": []any{},
				"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": a.prompt, "output_tokens": 0},
			}}
			if err := sse.send("message_start", start); err != nil {
				return err
			}
			cb := block(map[string]any{"type": "content_block_start", "content_block": map[string]any{"type": "text", "text": ""}})
			if err := sse.send("content_block_start", cb); err != nil {
				return err
			}
		}
		n++
		return sse.send("content_block_delta", block(map[string]any{"type": "content_block_delta",
			"delta": map[string]any{"type": "text_delta", "text": t}}))
	})
	sse.abortOnDie(err) // end the stream early: no message_stop
	if err != nil {
		return
	}
	for _, ev := range []map[string]any{
		block(map[string]any{"type": "content_block_stop"}),
		{"type": "message_delta", "delta": map[string]any{"stop_reason": stopReason, "stop_sequence": nil}, "usage": usage},
		{"type": "message_stop"},
	} {
		if sse.send(ev["type"].(string), ev) != nil {
			return
		}
	}
}

// countMessageTokens serves POST /v1/messages/count_tokens: the prompt
// tokens the same request to /v1/messages would report as input_tokens.
func (s *Server) countMessageTokens(w http.ResponseWriter, r *http.Request) {
	req, rf := readMessages(r, false)
	if rf != nil {
		writeAnthropic(w, rf)
		return
	}
	if _, rf := s.lookupModel(req.Model); rf != nil {
		writeAnthropic(w, rf)
		return
	}
	turns, err := req.turns()
	if err != nil {
		writeAnthropic(w, badRequest("messages", err.Error()))
		return
	}
	writeJSON(w, map[string]any{"input_tokens": promptTokens(renderChat(turns))})
}
