package sim

import (
	"encoding/json"
	"fmt"
)

// turn is one message of a conversation as the emulated chat template sees
// it. Chat messages, Responses API input items and Anthropic messages all
// become turns first, so a conversation renders to the same prompt text,
// and so costs the same and hits the same cached blocks, whichever API
// carries it.
type turn struct {
	role  string
	text  string
	calls []toolCall // tool calls an assistant turn makes
}

// toolCall is a function call as the template renders it: the name and
// the arguments as JSON text.
type toolCall struct {
	name, arguments string
}

// chatEnd is how the chat template ends a prompt, as a chat request's
// add_generation_prompt and continue_final_message choose.
type chatEnd int

const (
	// newTurn ends with the opening of the assistant's answer, the
	// generation prompt (add_generation_prompt, vLLM's default).
	newTurn chatEnd = iota
	// closedTurns ends with the last turn closed and no generation prompt
	// (add_generation_prompt false).
	closedTurns
	// continueFinal leaves the final turn open, with no end-of-turn and no
	// generation prompt, so the answer continues it
	// (continue_final_message).
	continueFinal
)

// renderChat renders turns through the emulation's chat template, ending
// with the opening of the assistant's answer, as a chat template's
// generation prompt does:
//
//	<|start|>{role}\n{text}<|call|>{name} {arguments}...<|end|>\n ... <|start|>assistant\n
//
// A turn without tool calls renders exactly as chat messages always have,
// so adding tool calls to the template changed no existing prompt's price.
func renderChat(turns []turn) []byte { return renderTemplate(turns, newTurn) }

// renderTemplate renders turns as [renderChat] does, ending as end says.
// A conversation with a final assistant turn of text T renders with
// continueFinal to exactly the bytes the conversation without it renders
// with newTurn, followed by T: the prompt that continues a cut answer is
// the prompt that began it plus the text delivered, so it shares that
// prompt's cached blocks, as vLLM's does.
func renderTemplate(turns []turn, end chatEnd) []byte {
	var b []byte
	for i, t := range turns {
		b = append(b, "<|start|>"...)
		b = append(b, t.role...)
		b = append(b, '\n')
		b = append(b, t.text...)
		for _, c := range t.calls {
			b = append(b, "<|call|>"...)
			b = append(b, c.name...)
			b = append(b, ' ')
			b = append(b, c.arguments...)
		}
		if end == continueFinal && i == len(turns)-1 {
			return b
		}
		b = append(b, "<|end|>\n"...)
	}
	if end == newTurn {
		b = append(b, "<|start|>assistant\n"...)
	}
	return b
}

// contentText reads a message's content: a string, or a list of parts
// whose text fields are joined, as the template puts parts side by side
// (parts with no text, such as images, add nothing). Absent content is
// empty and reported as not present; null is empty text.
func contentText(raw json.RawMessage) (text string, present bool, err error) {
	if len(raw) == 0 {
		return "", false, nil
	}
	if json.Unmarshal(raw, &text) == nil {
		return text, true, nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", false, fmt.Errorf("message content must be a string or a list of parts")
	}
	for _, p := range parts {
		text += p.Text
	}
	return text, true, nil
}

// addCall appends c to the conversation: to the assistant turn just
// before it, or as a new assistant turn. A chat message carries its text
// and tool calls together, while the Responses API and Anthropic's blocks
// send them as separate items; merging them here makes the three render
// alike (vLLM merges them the same way before its chat template).
func addCall(turns []turn, c toolCall) []turn {
	if n := len(turns); n > 0 && turns[n-1].role == "assistant" {
		turns[n-1].calls = append(turns[n-1].calls, c)
		return turns
	}
	return append(turns, turn{role: "assistant", calls: []toolCall{c}})
}

// chatTurns reads chat completion messages into turns. Content may be
// absent only on a message that makes tool calls.
func chatTurns(msgs []chatMessage) ([]turn, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("messages must not be empty")
	}
	turns := make([]turn, 0, len(msgs))
	for _, m := range msgs {
		text, present, err := contentText(m.Content)
		if err != nil {
			return nil, err
		}
		if !present && len(m.ToolCalls) == 0 {
			return nil, fmt.Errorf("message content must be a string or a list of parts")
		}
		t := turn{role: m.Role, text: text}
		for _, c := range m.ToolCalls {
			t.calls = append(t.calls, toolCall{name: c.Function.Name, arguments: c.Function.Arguments})
		}
		turns = append(turns, t)
	}
	return turns, nil
}
