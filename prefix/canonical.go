package prefix

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/llmlb/llmlb/jsonscan"
)

// FormatError is a prompt or message list that cannot be a valid request.
// Field names the request field ("prompt", "messages", "tools").
type FormatError struct {
	Field string
	Msg   string
}

func (e *FormatError) Error() string { return e.Field + ": " + e.Msg }

func formatErr(field, format string, args ...any) error {
	return &FormatError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Separators in canonical bytes. They are ASCII control characters that
// JSON-decoded text can contain too, but every variable-length field is
// followed by one, and a field's bytes are written with its length first, so
// two different messages lists can never produce the same bytes.
const (
	recordSep = 0x1e // ends a message, a tool definition or a prompt
	unitSep   = 0x1f // ends a field inside a record
)

// AppendCompletion appends the canonical bytes of a /v1/completions
// "prompt" value to dst: a string is its UTF-8 text; a list of strings is
// each text followed by a record separator; token ids are 4 bytes each,
// little-endian (about the 4 bytes a token of text takes, so block sizes
// mean the same), with a record separator after each list. An empty or
// ill-typed prompt is a [*FormatError].
func AppendCompletion(dst []byte, prompt json.RawMessage) ([]byte, error) {
	return appendCompletion(dst, prompt, false, nil)
}

// AppendValidCompletion is [AppendCompletion] for a prompt already known
// to be valid JSON in valid UTF-8, as a request parser that checked the
// whole body knows (see jsonscan.ValidObject): the same bytes and errors,
// without reading a long prompt's text again to check it. On other input
// it does not panic, but its result is unspecified.
func AppendValidCompletion(dst []byte, prompt json.RawMessage) ([]byte, error) {
	return appendCompletion(dst, prompt, true, nil)
}

// appendCompletion is AppendCompletion; with refs, a long plain text is
// referenced there instead of copied (see [Parts]).
func appendCompletion(dst []byte, prompt json.RawMessage, valid bool, refs *refList) ([]byte, error) {
	prompt = bytes.TrimSpace(prompt)
	if len(prompt) == 0 || string(prompt) == "null" {
		return dst, formatErr("prompt", "You must provide a prompt.")
	}
	switch prompt[0] {
	case '"':
		if p, ok := plainString(prompt, valid); ok {
			if len(p) == 0 {
				return dst, formatErr("prompt", "prompt must not be empty.")
			}
			return appendText(dst, p, refs), nil
		}
		var s string
		if err := json.Unmarshal(prompt, &s); err != nil {
			return dst, formatErr("prompt", "prompt must be a string, a list of strings or a list of token ids.")
		}
		if s == "" {
			return dst, formatErr("prompt", "prompt must not be empty.")
		}
		return append(dst, s...), nil
	case '[':
	default:
		return dst, formatErr("prompt", "prompt must be a string, a list of strings or a list of token ids.")
	}
	var list []json.RawMessage
	if err := json.Unmarshal(prompt, &list); err != nil {
		return dst, formatErr("prompt", "prompt must be a string, a list of strings or a list of token ids.")
	}
	if len(list) == 0 {
		return dst, formatErr("prompt", "prompt must not be empty.")
	}
	switch first := bytes.TrimSpace(list[0]); {
	case len(first) > 0 && first[0] == '"':
		var strs []string
		if err := json.Unmarshal(prompt, &strs); err != nil {
			return dst, formatErr("prompt", "prompt must be a string, a list of strings or a list of token ids.")
		}
		for _, s := range strs {
			if s == "" {
				return dst, formatErr("prompt", "prompt must not contain empty strings.")
			}
			dst = append(dst, s...)
			dst = append(dst, recordSep)
		}
		return dst, nil
	case len(first) > 0 && first[0] == '[':
		var nested [][]int64
		if err := json.Unmarshal(prompt, &nested); err != nil {
			return dst, formatErr("prompt", "prompt must be a string, a list of strings or a list of token ids.")
		}
		for _, ids := range nested {
			if len(ids) == 0 {
				return dst, formatErr("prompt", "prompt must not contain empty token lists.")
			}
			dst = appendTokens(dst, ids)
			dst = append(dst, recordSep)
		}
		return dst, nil
	default:
		var ids []int64
		if err := json.Unmarshal(prompt, &ids); err != nil {
			return dst, formatErr("prompt", "prompt must be a string, a list of strings or a list of token ids.")
		}
		return appendTokens(dst, ids), nil
	}
}

func appendTokens(dst []byte, ids []int64) []byte {
	for _, id := range ids {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(id))
	}
	return dst
}

// message is the part of a chat message that a chat template renders.
type message struct {
	Role       *string         `json:"role"`
	Name       string          `json:"name"`
	ToolCallID string          `json:"tool_call_id"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []toolCall      `json:"tool_calls"`
	// Reasoning content some servers accept back in assistant turns.
	ReasoningContent string `json:"reasoning_content"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

// AppendChat appends the canonical bytes of a chat request to dst: first the
// tool definitions (templates render them into the system turn, so they come
// before every message), each as JSON with sorted keys; then every message in
// order: its role, name and tool_call_id, its content (a string, or each
// part: text as text, an image by its URL, any other part as sorted JSON),
// any reasoning content, and its tool calls (id, function name, arguments).
// Each field is length-prefixed, so the encoding is unambiguous; nothing
// depends on key order or whitespace in the request. A message list that is
// not a non-empty list of objects with roles is a [*FormatError].
func AppendChat(dst []byte, messages, tools json.RawMessage) ([]byte, error) {
	return appendChat(dst, messages, tools, false, nil, nil)
}

// AppendValidChat is [AppendChat] for messages and tools already known to
// be valid JSON in valid UTF-8, as [AppendValidCompletion] is
// AppendCompletion: on a long prompt, most of AppendChat's time goes to
// checking again what the request parser has checked.
func AppendValidChat(dst []byte, messages, tools json.RawMessage) ([]byte, error) {
	return appendChat(dst, messages, tools, true, nil, nil)
}

// appendChat is AppendChat; with refs, long plain texts are referenced
// there instead of copied (see [Parts]); with turn, it sets turn[0] and
// turn[1] to what [Parts.FirstUser] and [Parts.FirstTurn] say.
func appendChat(dst []byte, messages, tools json.RawMessage, valid bool, refs *refList, turn *[2]int) ([]byte, error) {
	messages = bytes.TrimSpace(messages)
	if len(messages) == 0 || string(messages) == "null" {
		return dst, formatErr("messages", "You must provide messages.")
	}
	msgs, ok := scanMessages(messages, valid)
	if !ok {
		msgs = nil
		if err := json.Unmarshal(messages, &msgs); err != nil {
			return dst, formatErr("messages", "messages must be a list of message objects.")
		}
	}
	if len(msgs) == 0 {
		return dst, formatErr("messages", "messages must not be empty.")
	}
	for _, m := range msgs {
		if m.Role == nil || *m.Role == "" {
			return dst, formatErr("messages", "every message needs a role.")
		}
	}
	start, referred := len(dst), 0 // referred: bytes of refs before this call
	if refs != nil {
		referred = refs.bytes()
	}
	tools = bytes.TrimSpace(tools)
	if len(tools) > 0 && string(tools) != "null" {
		var defs []json.RawMessage
		if err := json.Unmarshal(tools, &defs); err != nil {
			return dst, formatErr("tools", "tools must be a list of tool objects.")
		}
		for _, d := range defs {
			var err error
			if dst, err = appendSorted(append(dst, 't'), d); err != nil {
				return dst, formatErr("tools", "tools must be a list of tool objects.")
			}
			dst = append(dst, recordSep)
		}
	}
	at := func() int { // the canonical length written so far
		n := len(dst) - start
		if refs != nil {
			n += refs.bytes() - referred
		}
		return n
	}
	user := false
	for _, m := range msgs {
		first := !user && *m.Role == "user"
		if first && turn != nil {
			turn[0] = at()
		}
		dst = appendField(append(dst, 'm'), *m.Role)
		dst = appendField(dst, m.Name)
		dst = appendField(dst, m.ToolCallID)
		var err error
		if dst, err = appendContent(dst, m.Content, valid, refs); err != nil {
			return dst, err
		}
		dst = appendField(dst, m.ReasoningContent)
		for _, tc := range m.ToolCalls {
			dst = appendField(append(dst, 'c'), tc.ID)
			dst = appendField(dst, tc.Function.Name)
			dst = appendField(dst, argumentsText(tc.Function.Arguments))
		}
		dst = append(dst, recordSep)
		if first {
			user = true
			if turn != nil {
				turn[1] = at()
			}
		}
	}
	return dst, nil
}

// messageKeys are message's JSON keys.
var messageKeys = []string{"role", "name", "tool_call_id", "content", "tool_calls", "reasoning_content"}

// scanMessages decodes a messages array as encoding/json would into
// []message, in one pass over the (long) content strings, which it keeps
// raw; the small fields are decoded by encoding/json itself. It reports
// false when unsure (invalid JSON, an element that is not an object, a
// field of the wrong type, a key that differs from a field's only in case,
// which encoding/json would take), and the caller asks encoding/json.
// With valid, raw is known to be valid JSON in valid UTF-8.
func scanMessages(raw []byte, valid bool) ([]message, bool) {
	var msgs []message
	ok := scanArray(raw, valid, func(elem []byte) bool {
		if elem[0] != '{' {
			return false
		}
		var m message
		ok := scanObject(elem, valid, func(key, val []byte) bool {
			switch string(key) {
			case "content":
				m.Content = val
				return true
			case "role":
				return json.Unmarshal(val, &m.Role) == nil
			case "name":
				return json.Unmarshal(val, &m.Name) == nil
			case "tool_call_id":
				return json.Unmarshal(val, &m.ToolCallID) == nil
			case "tool_calls":
				return json.Unmarshal(val, &m.ToolCalls) == nil
			case "reasoning_content":
				return json.Unmarshal(val, &m.ReasoningContent) == nil
			}
			for _, k := range messageKeys {
				if bytes.EqualFold(key, []byte(k)) {
					return false
				}
			}
			return true
		})
		msgs = append(msgs, m)
		return ok
	})
	return msgs, ok
}

// scanArray is jsonscan.Array, or ValidArray for valid input; called
// directly, not through a func value, so that elem can stay on the stack.
func scanArray(raw []byte, valid bool, elem func([]byte) bool) bool {
	if valid {
		return jsonscan.ValidArray(raw, elem)
	}
	return jsonscan.Array(raw, elem)
}

// scanObject is jsonscan.Object, or ValidObject for valid input.
func scanObject(raw []byte, valid bool, member func(key, val []byte) bool) bool {
	if valid {
		return jsonscan.ValidObject(raw, member)
	}
	return jsonscan.Object(raw, member)
}

// appendField writes s with its length first, then a unit separator.
func appendField[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	dst = append(dst, s...)
	return append(dst, unitSep)
}

// appendText appends text, or, with refs and a text of at least
// refs.min bytes, a reference to it where it lies.
func appendText(dst, text []byte, refs *refList) []byte {
	if refs == nil || len(text) < refs.min {
		return append(dst, text...)
	}
	refs.refs = append(refs.refs, Ref{At: len(dst), Text: text})
	return dst
}

// plainString is jsonscan.PlainString, or ValidPlainString for a string
// known to be valid.
func plainString(raw []byte, valid bool) ([]byte, bool) {
	if valid {
		return jsonscan.ValidPlainString(raw)
	}
	return jsonscan.PlainString(raw)
}

// appendContent writes a message's content: a string, null, or a list of
// parts.
func appendContent(dst []byte, raw json.RawMessage, valid bool, refs *refList) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return append(dst, 'n', unitSep), nil
	case raw[0] == '"':
		if p, ok := plainString(raw, valid); ok {
			dst = binary.AppendUvarint(append(dst, 's'), uint64(len(p)))
			return append(appendText(dst, p, refs), unitSep), nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return dst, formatErr("messages", "message content must be a string or a list of content parts.")
		}
		return appendField(append(dst, 's'), s), nil
	case raw[0] == '[':
	default:
		return dst, formatErr("messages", "message content must be a string or a list of content parts.")
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return dst, formatErr("messages", "message content must be a string or a list of content parts.")
	}
	for _, p := range parts {
		var cp contentPart
		if err := json.Unmarshal(p, &cp); err != nil {
			return dst, formatErr("messages", "every content part must be an object with a type.")
		}
		switch {
		case cp.Type == "text":
			dst = appendField(append(dst, 'p'), cp.Text)
		case cp.Type == "image_url" && cp.ImageURL != nil:
			dst = appendField(append(dst, 'i'), cp.ImageURL.URL)
		default:
			var err error
			if dst, err = appendSorted(append(dst, 'o'), p); err != nil {
				return dst, formatErr("messages", "every content part must be an object with a type.")
			}
			dst = append(dst, unitSep)
		}
	}
	return dst, nil
}

// argumentsText returns a tool call's arguments: OpenAI sends a JSON string
// holding JSON; some clients send the object itself.
func argumentsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	var b []byte
	b, _ = appendSorted(b, raw)
	return string(b)
}

// appendSorted writes raw JSON re-encoded with object keys sorted and no
// insignificant whitespace; numbers keep their text.
func appendSorted(dst []byte, raw json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return dst, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return dst, err
	}
	return appendValue(dst, v), nil
}

func appendValue(dst []byte, v any) []byte {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, strings.Compare)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			dst = appendValue(dst, x[k])
		}
		return append(dst, '}')
	case []any:
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, e)
		}
		return append(dst, ']')
	case string:
		return appendJSONString(dst, x)
	case json.Number:
		return append(dst, x...)
	case bool:
		if x {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	default:
		return append(dst, "null"...)
	}
}

func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// FirstUserText returns up to n runes of the text of a chat's first user
// message (its string content, or its first text part), as KubeAI's
// prefix-hash load balancer keys requests; nil when there is none or the
// messages do not parse.
func FirstUserText(messages json.RawMessage, n int) []byte {
	msgs, ok := scanMessages(bytes.TrimSpace(messages), false)
	if !ok {
		msgs = nil
		if json.Unmarshal(messages, &msgs) != nil {
			return nil
		}
	}
	for _, m := range msgs {
		if m.Role == nil || *m.Role != "user" {
			continue
		}
		var text string
		raw := bytes.TrimSpace(m.Content)
		switch {
		case len(raw) > 0 && raw[0] == '"':
			if json.Unmarshal(raw, &text) != nil {
				return nil
			}
		case len(raw) > 0 && raw[0] == '[':
			var parts []contentPart
			if json.Unmarshal(raw, &parts) != nil {
				return nil
			}
			for _, p := range parts {
				if p.Type == "text" {
					text = p.Text
					break
				}
			}
		}
		i := 0
		for k := range text {
			if i == n {
				return []byte(text[:k])
			}
			i++
		}
		return []byte(text)
	}
	return nil
}
