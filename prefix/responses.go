package prefix

import (
	"bytes"
	"encoding/json"
)

// AppendResponses appends the canonical bytes of an OpenAI Responses API
// request (POST /v1/responses) to dst. vLLM serves it by turning it into
// chat messages and applying the chat template, so it is written as the
// chat request those messages make, in [AppendChat]'s form: the tools
// (a flat function tool nested as chat's {"type":"function","function":
// {...}}, any other tool as it is), then the instructions as a system
// message, then a string input as one user message, or each input item in
// order: a message item as a message of its role and content (input_text
// and output_text parts as text parts, an input_image by its URL, any
// other part as sorted JSON); a function_call as an assistant message with
// that one tool call (call_id, name, arguments); a function_call_output as
// a tool message (call_id, output); and any other item (reasoning,
// item_reference, built-in tool calls), or a known one with members this
// form does not map, as its sorted JSON in a record of its own.
//
// A request of instructions and a string input is thus the bytes of the
// chat request of a system and a user message with those texts, tools
// included; so are message items with string contents, function calls
// and their outputs. Items are not merged into one assistant message as
// vLLM merges them, so that every item's bytes depend on it alone and a
// later turn, which resends the conversation, has an earlier turn's bytes
// as its prefix. The ids and statuses of message, function_call,
// function_call_output and reasoning items are left out: no template
// renders them, and a client may resend an item without them.
//
// A missing or empty input is a [*FormatError] "You must provide input."
// (a request with previous_response_id may carry only new items, which is
// fine); so are an input that is neither a string nor a list of objects,
// a message item without a role, and instructions that are not a string.
func AppendResponses(dst []byte, instructions, input, tools json.RawMessage) ([]byte, error) {
	return appendResponses(dst, instructions, input, tools, false, nil, nil)
}

// AppendValidResponses is [AppendResponses] for fields already known to be
// valid JSON in valid UTF-8, as [AppendValidChat] is AppendChat.
func AppendValidResponses(dst []byte, instructions, input, tools json.RawMessage) ([]byte, error) {
	return appendResponses(dst, instructions, input, tools, true, nil, nil)
}

// The members of an input item that this form maps, as bits of
// responseItem.seen.
const (
	memberType = 1 << iota
	memberRole
	memberContent
	memberCallID
	memberName
	memberArguments
	memberOutput
	memberOther
)

// responseItem is an input item's raw members, nil when absent.
type responseItem struct {
	raw                                         []byte
	typ, role, content, callID, name, args, out []byte
	seen                                        int // member bits
}

// scanResponseItems reads a list of input items; it reports false when
// raw is not a list of objects.
func scanResponseItems(raw []byte, valid bool) ([]responseItem, bool) {
	var items []responseItem
	ok := scanArray(raw, valid, func(elem []byte) bool {
		if elem[0] != '{' {
			return false
		}
		it := responseItem{raw: elem}
		ok := scanObject(elem, valid, func(key, val []byte) bool {
			switch string(key) {
			case "type":
				it.typ, it.seen = val, it.seen|memberType
			case "role":
				it.role, it.seen = val, it.seen|memberRole
			case "content":
				it.content, it.seen = val, it.seen|memberContent
			case "call_id":
				it.callID, it.seen = val, it.seen|memberCallID
			case "name":
				it.name, it.seen = val, it.seen|memberName
			case "arguments":
				it.args, it.seen = val, it.seen|memberArguments
			case "output":
				it.out, it.seen = val, it.seen|memberOutput
			case "id", "status": // not rendered; see AppendResponses
			default:
				it.seen |= memberOther
			}
			return true
		})
		items = append(items, it)
		return ok
	})
	return items, ok
}

// appendResponses is AppendResponses; refs and turn are as appendChat's.
func appendResponses(dst []byte, instructions, input, tools json.RawMessage, valid bool, refs *refList, turn *[2]int) ([]byte, error) {
	input = bytes.TrimSpace(input)
	if len(input) == 0 || string(input) == "null" {
		return dst, formatErr("input", "You must provide input.")
	}
	var text piece
	var items []responseItem
	switch input[0] {
	case '"':
		var ok bool
		if text, ok = jsonPiece(input, valid); !ok {
			return dst, formatErr("input", "input must be a string or a list of input items.")
		}
		if len(text.b) == 0 {
			return dst, formatErr("input", "You must provide input.")
		}
	case '[':
		var ok bool
		if items, ok = scanResponseItems(input, valid); !ok {
			return dst, formatErr("input", "input must be a string or a list of input items.")
		}
		if len(items) == 0 {
			return dst, formatErr("input", "You must provide input.")
		}
	default:
		return dst, formatErr("input", "input must be a string or a list of input items.")
	}
	var instr piece
	if instructions = bytes.TrimSpace(instructions); len(instructions) > 0 && string(instructions) != "null" {
		var ok bool
		if instr, ok = jsonPiece(instructions, valid); !ok {
			return dst, formatErr("instructions", "instructions must be a string.")
		}
	}

	mark := newTurnMark(dst, refs, turn)
	var err error
	if dst, err = appendResponseTools(dst, tools, valid); err != nil {
		return dst, err
	}
	if len(instr.b) > 0 { // vLLM adds no system message for empty instructions
		dst = appendTextMessage(dst, "system", refs, instr)
	}
	if items == nil {
		mark.begin(dst, "user")
		dst = appendTextMessage(dst, "user", refs, text)
		mark.end(dst)
		return dst, nil
	}
	for i := range items {
		if dst, err = appendResponseItem(dst, i, &items[i], valid, refs, &mark); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// appendResponseItem writes the record of input item i.
func appendResponseItem(dst []byte, i int, it *responseItem, valid bool, refs *refList, mark *turnMark) ([]byte, error) {
	typ, ok := jsonString(it.typ, valid)
	if !ok {
		return dst, formatErr("input", "input[%d].type must be a string.", i)
	}
	var allowed int
	switch typ {
	case "", "message":
		allowed = memberType | memberRole | memberContent
		if role, ok := jsonString(it.role, valid); !ok || role == "" {
			return dst, formatErr("input", "every message item needs a role.")
		}
	case "function_call":
		allowed = memberType | memberCallID | memberName | memberArguments
	case "function_call_output":
		allowed = memberType | memberCallID | memberOutput
	case "reasoning": // vLLM keeps one of its texts; its sorted JSON keeps all
	default:
		return appendOtherItem(dst, it.raw)
	}
	if allowed == 0 || it.seen&^allowed != 0 {
		return appendOtherItem(dst, it.raw, "id", "status")
	}
	str := func(raw []byte, key string) (string, error) {
		s, ok := jsonString(raw, valid)
		if !ok {
			return "", formatErr("input", "input[%d].%s must be a string.", i, key)
		}
		return s, nil
	}
	var err error
	switch typ {
	case "function_call":
		var id, name string
		if id, err = str(it.callID, "call_id"); err != nil {
			return dst, err
		}
		if name, err = str(it.name, "name"); err != nil {
			return dst, err
		}
		dst = appendMessageHead(dst, "assistant", "", "")
		dst = append(dst, 'n', unitSep) // content null
		dst = appendField(dst, "")      // reasoning
		dst = appendToolCall(dst, id, name, argumentsText(it.args))
	case "function_call_output":
		var id string
		if id, err = str(it.callID, "call_id"); err != nil {
			return dst, err
		}
		dst = appendMessageHead(dst, "tool", "", id)
		if dst, ok = appendResponseContent(dst, it.out, valid, refs); !ok {
			return dst, formatErr("input", "input[%d].output must be a string or a list of content parts.", i)
		}
		dst = appendField(dst, "")
	default: // a message
		role, _ := jsonString(it.role, valid)
		mark.begin(dst, role)
		dst = appendMessageHead(dst, role, "", "")
		if dst, ok = appendResponseContent(dst, it.content, valid, refs); !ok {
			return dst, formatErr("input", "input[%d].content must be a string or a list of content parts.", i)
		}
		dst = appendField(dst, "")
		dst = append(dst, recordSep)
		mark.end(dst)
		return dst, nil
	}
	return append(dst, recordSep), nil
}

// appendOtherItem writes an input item this form does not map to a chat
// message: 'x' and its sorted JSON, without the members drop names.
func appendOtherItem(dst, raw []byte, drop ...string) ([]byte, error) {
	b, err := appendSortedWithout(nil, raw, drop...)
	if err != nil {
		return dst, formatErr("input", "input must be a string or a list of input items.")
	}
	return append(appendField(append(dst, 'x'), b), recordSep), nil
}

// appendResponseContent writes a message item's content, or a function
// call output, as appendContent writes a chat message's: a string, null,
// or a list of content parts. It reports false for any other value.
func appendResponseContent(dst, raw []byte, valid bool, refs *refList) ([]byte, bool) {
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return append(dst, 'n', unitSep), true
	case raw[0] == '"':
		p, ok := jsonPiece(raw, valid)
		if !ok {
			return dst, false
		}
		return appendPieces(append(dst, 's'), "", refs, p), true
	case raw[0] != '[':
		return dst, false
	}
	ok := scanArray(raw, valid, func(part []byte) bool {
		var ok bool
		dst, ok = appendResponsePart(dst, part, valid, refs)
		return ok
	})
	return dst, ok
}

// appendResponsePart writes one content part: input_text and output_text
// as chat's text parts (annotations and logprobs are not rendered), an
// input_image with an image_url as chat's image part (its detail left out,
// as chat's is), any other part as sorted JSON.
func appendResponsePart(dst, raw []byte, valid bool, refs *refList) ([]byte, bool) {
	if raw[0] != '{' {
		return dst, false
	}
	var typ, text, url []byte
	file := false
	if !scanObject(raw, valid, func(key, val []byte) bool {
		switch string(key) {
		case "type":
			typ = val
		case "text":
			text = val
		case "image_url":
			url = val
		case "file_id":
			file = true
		}
		return true
	}) {
		return dst, false
	}
	t, _ := jsonString(typ, valid)
	switch {
	case t == "input_text" || t == "output_text":
		if p, ok := jsonPiece(text, valid); ok {
			return appendPieces(append(dst, 'p'), "", refs, p), true
		}
	case t == "input_image" && !file:
		if p, ok := jsonPiece(url, valid); ok {
			return appendPieces(append(dst, 'i'), "", refs, p), true
		}
	}
	dst, err := appendSorted(append(dst, 'o'), raw)
	return append(dst, unitSep), err == nil
}

// appendResponseTools writes the tool definitions as chat's: a function
// tool {"type":"function", name, description, parameters, ...} as
// {"type":"function","function":{name, description, parameters, ...}},
// which is what vLLM hands the template, any other tool as it is.
func appendResponseTools(dst, tools []byte, valid bool) ([]byte, error) {
	tools = bytes.TrimSpace(tools)
	if len(tools) == 0 || string(tools) == "null" {
		return dst, nil
	}
	if !scanArray(tools, valid, func(raw []byte) bool {
		if raw[0] != '{' {
			return false
		}
		v, err := decodeAny(raw)
		m, ok := v.(map[string]any)
		if err != nil || !ok {
			return false
		}
		if m["type"] == "function" {
			delete(m, "type")
			v = map[string]any{"type": "function", "function": m}
		}
		dst = append(appendValue(append(dst, 't'), v), recordSep)
		return true
	}) {
		return dst, formatErr("tools", "tools must be a list of tool objects.")
	}
	return dst, nil
}
