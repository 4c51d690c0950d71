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
// Field names the request field ("prompt", "messages", "tools", and for
// the Responses and Messages APIs "input", "instructions", "system").
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
	mark := newTurnMark(dst, refs, turn)
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
	for _, m := range msgs {
		mark.begin(dst, *m.Role)
		dst = appendMessageHead(dst, *m.Role, m.Name, m.ToolCallID)
		var err error
		if dst, err = appendContent(dst, m.Content, valid, refs); err != nil {
			return dst, err
		}
		dst = appendField(dst, m.ReasoningContent)
		for _, tc := range m.ToolCalls {
			dst = appendToolCall(dst, tc.ID, tc.Function.Name, argumentsText(tc.Function.Arguments))
		}
		dst = append(dst, recordSep)
		mark.end(dst)
	}
	return dst, nil
}

// A chat message's record is 'm', its role, name and tool_call_id
// (appendMessageHead), its content (appendContent; a string is 's' and
// the text as a field, appendPieces), its reasoning content as a field,
// each tool call (appendToolCall), and a record separator. The Responses
// and Messages canonicalisers write the chat messages an engine turns
// their requests into with the same functions, so equal messages are
// equal bytes.

// appendMessageHead begins a chat message's record.
func appendMessageHead(dst []byte, role, name, toolCallID string) []byte {
	dst = appendField(append(dst, 'm'), role)
	dst = appendField(dst, name)
	return appendField(dst, toolCallID)
}

// appendToolCall writes one tool call of an assistant message.
func appendToolCall(dst []byte, id, name, arguments string) []byte {
	dst = appendField(append(dst, 'c'), id)
	dst = appendField(dst, name)
	return appendField(dst, arguments)
}

// turnMark records, for [Parts.FirstUser] and [Parts.FirstTurn], where the
// first user message's record begins and ends in the canonical bytes: the
// length written since start, plus the texts refs referred to since it
// held referred bytes. A nil turn records nothing.
type turnMark struct {
	turn            *[2]int
	refs            *refList
	start, referred int
	in, done        bool // inside the first user message's record; past it
}

// newTurnMark returns a turnMark counting from the end of dst.
func newTurnMark(dst []byte, refs *refList, turn *[2]int) turnMark {
	k := turnMark{turn: turn, refs: refs, start: len(dst)}
	if refs != nil {
		k.referred = refs.bytes()
	}
	return k
}

// at returns the canonical length written so far.
func (k *turnMark) at(dst []byte) int {
	n := len(dst) - k.start
	if k.refs != nil {
		n += k.refs.bytes() - k.referred
	}
	return n
}

// begin is called before each message's record, with its role.
func (k *turnMark) begin(dst []byte, role string) {
	k.in = !k.done && role == "user"
	if k.in && k.turn != nil {
		k.turn[0] = k.at(dst)
	}
}

// end is called after each message's record.
func (k *turnMark) end(dst []byte) {
	if k.in {
		k.in, k.done = false, true
		if k.turn != nil {
			k.turn[1] = k.at(dst)
		}
	}
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
			return appendPieces(append(dst, 's'), "", refs, piece{b: p, inPlace: true}), nil
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
	v, err := decodeAny(raw)
	if err != nil {
		return dst, err
	}
	return appendValue(dst, v), nil
}

// appendSortedWithout is appendSorted without the members drop names,
// when raw is an object: fields a template does not render.
func appendSortedWithout(dst []byte, raw json.RawMessage, drop ...string) ([]byte, error) {
	v, err := decodeAny(raw)
	if err != nil {
		return dst, err
	}
	if m, ok := v.(map[string]any); ok {
		for _, k := range drop {
			delete(m, k)
		}
	}
	return appendValue(dst, v), nil
}

// decodeAny decodes raw JSON keeping numbers' text, for appendValue.
func decodeAny(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// piece is a text of a request: a JSON string's decoded bytes, in place
// when they are the string's own bytes in the request (it had no
// escapes), so that a [Parts] may refer to them there.
type piece struct {
	b       []byte
	inPlace bool
}

// jsonPiece decodes the JSON string raw; it reports false when raw is not
// one.
func jsonPiece(raw []byte, valid bool) (piece, bool) {
	if p, ok := plainString(raw, valid); ok {
		return piece{b: p, inPlace: true}, true
	}
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return piece{}, false
	}
	return piece{b: []byte(s)}, true
}

// jsonString decodes a short JSON string field; null is "". It reports
// false for any other value.
func jsonString(raw []byte, valid bool) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	p, ok := jsonPiece(raw, valid)
	return string(p.b), ok
}

// appendPieces writes pieces joined by sep as one field, as appendField
// writes their concatenation, referring with refs to long ones in place.
func appendPieces(dst []byte, sep string, refs *refList, ps ...piece) []byte {
	n := 0
	for i, p := range ps {
		if i > 0 {
			n += len(sep)
		}
		n += len(p.b)
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	for i, p := range ps {
		if i > 0 {
			dst = append(dst, sep...)
		}
		if p.inPlace {
			dst = appendText(dst, p.b, refs)
		} else {
			dst = append(dst, p.b...)
		}
	}
	return append(dst, unitSep)
}

// appendTextMessage writes the record of a chat message with a string
// content and nothing else: {"role": role, "content": text...}.
func appendTextMessage(dst []byte, role string, refs *refList, text ...piece) []byte {
	dst = appendMessageHead(dst, role, "", "")
	dst = appendPieces(append(dst, 's'), "", refs, text...)
	return append(appendField(dst, ""), recordSep)
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
