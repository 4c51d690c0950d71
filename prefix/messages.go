package prefix

import (
	"bytes"
	"encoding/json"
)

// AppendMessages appends the canonical bytes of an Anthropic Messages API
// request (POST /v1/messages, and /v1/messages/count_tokens with the same
// fields) to dst. vLLM serves it by turning it into chat messages and
// applying the chat template, so it is written as the chat request those
// messages make, in [AppendChat]'s form, following vLLM's conversion:
//   - the tools, each {name, description, input_schema} as chat's
//     {"type":"function","function":{name, description, parameters}};
//     a tool with other members (a server tool) as its sorted JSON;
//   - the system text (a string, or its text blocks joined, with the texts
//     of any messages of role "system") as one leading system message;
//   - each message in order. A string content is the message's content;
//     of a list of blocks, text blocks are text parts (one text alone is
//     a string content), an image is an image part by its URL (a base64
//     source as a data: URL), thinking blocks are the reasoning content,
//     tool_use blocks are tool calls (id, name, and the input object's
//     sorted JSON as the arguments), and any other block is its sorted
//     JSON. A tool_result block of a user message is a tool message of
//     its own (tool_use_id, its text blocks joined by newlines) before the
//     message, followed by a user message of its images if it has any; a
//     user message left with no content is dropped.
//
// A request of a system string and user messages of string contents is
// thus the bytes of the chat request with the same system and user
// messages; so is one whose contents are single text blocks, and a tool
// call sequence whose chat form sends the arguments as an object. Not
// rendered, so left out: cache_control, a thinking block's signature,
// redacted_thinking blocks, a tool result's is_error, and a system text
// block beginning "x-anthropic-billing-header" (Claude Code's, which
// holds a hash of each request, and which vLLM drops so that prefixes
// are cached). Every message's bytes depend on it alone, so a later turn
// has an earlier turn's bytes as its prefix.
//
// Missing messages are a [*FormatError] "You must provide messages.", and
// an empty list, a message without a role, a content that is neither a
// string nor a list of objects, and a system that is neither a string nor
// a list of text blocks are FormatErrors too.
func AppendMessages(dst []byte, system, messages, tools json.RawMessage) ([]byte, error) {
	return appendMessages(dst, system, messages, tools, false, nil, nil)
}

// AppendValidMessages is [AppendMessages] for fields already known to be
// valid JSON in valid UTF-8, as [AppendValidChat] is AppendChat.
func AppendValidMessages(dst []byte, system, messages, tools json.RawMessage) ([]byte, error) {
	return appendMessages(dst, system, messages, tools, true, nil, nil)
}

// billingHeader begins the system text block Claude Code adds to each
// request, which vLLM leaves out of the prompt.
const billingHeader = "x-anthropic-billing-header"

// anthropicMessage is a message's role and raw content.
type anthropicMessage struct {
	role    string
	content []byte
}

// appendMessages is AppendMessages; refs and turn are as appendChat's.
func appendMessages(dst []byte, system, messages, tools json.RawMessage, valid bool, refs *refList, turn *[2]int) ([]byte, error) {
	messages = bytes.TrimSpace(messages)
	if len(messages) == 0 || string(messages) == "null" {
		return dst, formatErr("messages", "You must provide messages.")
	}
	var msgs []anthropicMessage
	roles := true
	if !scanArray(messages, valid, func(elem []byte) bool {
		if elem[0] != '{' {
			return false
		}
		var m anthropicMessage
		var role []byte
		ok := scanObject(elem, valid, func(key, val []byte) bool {
			switch string(key) {
			case "role":
				role = val
			case "content":
				m.content = val
			}
			return true
		})
		var str bool
		m.role, str = jsonString(role, valid)
		roles = roles && str && m.role != ""
		msgs = append(msgs, m)
		return ok
	}) {
		return dst, formatErr("messages", "messages must be a list of message objects.")
	}
	if len(msgs) == 0 {
		return dst, formatErr("messages", "messages must not be empty.")
	}
	if !roles {
		return dst, formatErr("messages", "every message needs a role.")
	}

	// The system text: vLLM joins the top-level system's texts and those
	// of messages of role "system" into one leading system message.
	var sys []piece
	if system = bytes.TrimSpace(system); len(system) > 0 && string(system) != "null" {
		var ok bool
		if system[0] == '"' {
			var p piece
			if p, ok = jsonPiece(system, valid); ok && len(p.b) > 0 {
				sys = append(sys, p)
			}
		} else {
			sys, ok = appendSystemBlocks(sys, system, valid, true)
		}
		if !ok {
			return dst, formatErr("system", "system must be a string or a list of text blocks.")
		}
	}
	for _, m := range msgs {
		if m.role != "system" {
			continue
		}
		var ok bool
		if len(m.content) > 0 && m.content[0] == '"' {
			var p piece
			if p, ok = jsonPiece(m.content, valid); ok {
				sys = append(sys, p)
			}
		} else {
			sys, ok = appendSystemBlocks(sys, m.content, valid, false)
		}
		if !ok {
			return dst, formatErr("messages", "message content must be a string or a list of content blocks.")
		}
	}

	mark := newTurnMark(dst, refs, turn)
	var err error
	if dst, err = appendMessagesTools(dst, tools, valid); err != nil {
		return dst, err
	}
	if len(sys) > 0 {
		dst = appendTextMessage(dst, "system", refs, sys...)
	}
	var blocks []contentBlock // reused from message to message
	for _, m := range msgs {
		switch {
		case m.role == "system":
		case len(m.content) > 0 && m.content[0] == '"':
			p, ok := jsonPiece(m.content, valid)
			if !ok {
				return dst, formatErr("messages", "message content must be a string or a list of content blocks.")
			}
			mark.begin(dst, m.role)
			dst = appendTextMessage(dst, m.role, refs, p)
			mark.end(dst)
		default:
			if dst, blocks, err = appendBlockMessage(dst, m, blocks[:0], valid, refs, &mark); err != nil {
				return dst, err
			}
		}
	}
	return dst, nil
}

// appendSystemBlocks appends to sys the texts of a list of system text
// blocks that vLLM keeps: not empty, not the billing header. With strict,
// a block that is not a text block is refused, as the API refuses it in
// the top-level system; in a system message vLLM skips it.
func appendSystemBlocks(sys []piece, raw []byte, valid, strict bool) ([]piece, bool) {
	if len(raw) == 0 || raw[0] != '[' {
		return sys, false
	}
	ok := scanArray(raw, valid, func(elem []byte) bool {
		if elem[0] != '{' {
			return false
		}
		var typ, text []byte
		if !scanObject(elem, valid, func(key, val []byte) bool {
			switch string(key) {
			case "type":
				typ = val
			case "text":
				text = val
			}
			return true
		}) {
			return false
		}
		t, _ := jsonString(typ, valid)
		p, ok := jsonPiece(text, valid)
		if t != "text" || !ok {
			return !strict
		}
		if len(p.b) > 0 && !bytes.HasPrefix(p.b, []byte(billingHeader)) {
			sys = append(sys, p)
		}
		return true
	})
	return sys, ok
}

// contentBlock is a content block's type and the raw members this form
// reads, nil when absent, and what the block becomes in a chat message.
type contentBlock struct {
	raw                                     []byte
	typ                                     string
	text, thinking, id, name, input, source []byte
	toolUseID, content                      []byte
	kind                                    blockKind
	str                                     piece // a text's or a thinking's text
}

// blockKind is what a content block becomes in vLLM's chat messages.
type blockKind int8

const (
	blockSkipped   blockKind = iota // not rendered
	blockPart                       // a content part other than a text
	blockText                       // a text part
	blockReasoning                  // reasoning content
	blockCall                       // a tool call
	blockResult                     // a tool message (a user message's tool_result)
)

// scanBlocks reads a list of content blocks into blocks; it reports false
// when raw is not a list of objects with string types.
func scanBlocks(blocks []contentBlock, raw []byte, valid bool) ([]contentBlock, bool) {
	ok := len(raw) > 0 && raw[0] == '[' && scanArray(raw, valid, func(elem []byte) bool {
		if elem[0] != '{' {
			return false
		}
		b := contentBlock{raw: elem}
		var typ []byte
		if !scanObject(elem, valid, func(key, val []byte) bool {
			switch string(key) {
			case "type":
				typ = val
			case "text":
				b.text = val
			case "thinking":
				b.thinking = val
			case "id":
				b.id = val
			case "name":
				b.name = val
			case "input":
				b.input = val
			case "source":
				b.source = val
			case "tool_use_id":
				b.toolUseID = val
			case "content":
				b.content = val
			}
			return true
		}) {
			return false
		}
		var ok bool
		b.typ, ok = jsonString(typ, valid)
		blocks = append(blocks, b)
		return ok && b.typ != ""
	})
	return blocks, ok
}

// appendBlockMessage writes the records of a message whose content is a
// list of blocks: a tool message for each tool result of a user message
// (and a user message of its images), then the message itself.
func appendBlockMessage(dst []byte, m anthropicMessage, blocks []contentBlock, valid bool, refs *refList, mark *turnMark) ([]byte, []contentBlock, error) {
	blocks, ok := scanBlocks(blocks, m.content, valid)
	if !ok {
		return dst, blocks, formatErr("messages", "message content must be a string or a list of content blocks.")
	}
	parts, text := 0, -1 // how many content parts; the last one
	for i := range blocks {
		b := &blocks[i]
		b.kind = blockPart
		switch b.typ {
		case "text":
			if len(b.text) == 0 || string(b.text) == "null" || string(b.text) == `""` {
				b.kind = blockSkipped // vLLM drops a text block without text
			} else if p, ok := jsonPiece(b.text, valid); ok {
				b.kind, b.str = blockText, p
			}
		case "thinking":
			b.kind = blockSkipped
			if p, ok := jsonPiece(b.thinking, valid); ok {
				b.kind, b.str = blockReasoning, p
			}
		case "redacted_thinking":
			b.kind = blockSkipped
		case "tool_use":
			b.kind = blockCall
		case "tool_result":
			if m.role == "user" {
				b.kind = blockResult
			}
		}
		if b.kind == blockPart || b.kind == blockText {
			parts++
			text = i
		}
	}

	var err error
	for i := range blocks {
		if blocks[i].kind == blockResult {
			if dst, err = appendToolResult(dst, &blocks[i], valid, refs, mark); err != nil {
				return dst, blocks, err
			}
		}
	}
	if parts == 0 && m.role == "user" {
		return dst, blocks, nil // vLLM drops a user message left without content
	}

	mark.begin(dst, m.role)
	dst = appendMessageHead(dst, m.role, "", "")
	switch {
	case parts == 0:
		dst = append(dst, 'n', unitSep)
	case parts == 1 && blocks[text].kind == blockText: // vLLM makes a lone text the content string
		dst = appendPieces(append(dst, 's'), "", refs, blocks[text].str)
	default:
		for i := range blocks {
			switch blocks[i].kind {
			case blockText:
				dst = appendPieces(append(dst, 'p'), "", refs, blocks[i].str)
			case blockPart:
				if dst, err = appendBlockPart(dst, &blocks[i], valid, refs); err != nil {
					return dst, blocks, err
				}
			}
		}
	}
	var thinking []piece
	for i := range blocks {
		if blocks[i].kind == blockReasoning {
			thinking = append(thinking, blocks[i].str)
		}
	}
	dst = appendPieces(dst, "", refs, thinking...)
	for i := range blocks {
		if blocks[i].kind != blockCall {
			continue
		}
		b := &blocks[i]
		id, ok1 := jsonString(b.id, valid)
		name, ok2 := jsonString(b.name, valid)
		if !ok1 || !ok2 {
			return dst, blocks, formatErr("messages", "a tool_use block's id and name must be strings.")
		}
		args := []byte("{}") // vLLM's arguments for a missing input
		if in := b.input; len(in) > 0 && string(in) != "null" {
			if args, err = appendSorted(nil, in); err != nil || in[0] != '{' {
				return dst, blocks, formatErr("messages", "a tool_use block's input must be an object.")
			}
		}
		dst = appendToolCall(dst, id, name, string(args))
	}
	dst = append(dst, recordSep)
	mark.end(dst)
	return dst, blocks, nil
}

// appendBlockPart writes a content block that is a part but not a text: an
// image with a URL or base64 source as chat's image part, anything else as
// its sorted JSON without cache_control.
func appendBlockPart(dst []byte, b *contentBlock, valid bool, refs *refList) ([]byte, error) {
	if b.typ == "image" {
		if url, ok := imageURL(b.source, valid); ok {
			return appendPieces(append(dst, 'i'), "", refs, url...), nil
		}
	}
	dst, err := appendSortedWithout(append(dst, 'o'), b.raw, "cache_control")
	if err != nil {
		return dst, formatErr("messages", "every content block must be an object with a type.")
	}
	return append(dst, unitSep), nil
}

// imageURL returns the pieces of the URL vLLM gives an image source: a
// url source's URL, or a base64 source's data: URL (media type
// image/jpeg if none is given); false for any other source.
func imageURL(source []byte, valid bool) ([]piece, bool) {
	if len(source) == 0 || source[0] != '{' {
		return nil, false
	}
	var typ, url, media, data []byte
	if !scanObject(source, valid, func(key, val []byte) bool {
		switch string(key) {
		case "type":
			typ = val
		case "url":
			url = val
		case "media_type":
			media = val
		case "data":
			data = val
		}
		return true
	}) {
		return nil, false
	}
	switch t, _ := jsonString(typ, valid); t {
	case "url":
		p, ok := jsonPiece(url, valid)
		return []piece{p}, ok
	case "base64", "":
		m, ok1 := jsonString(media, valid)
		d, ok2 := jsonPiece(data, valid)
		if !ok1 || !ok2 {
			return nil, false
		}
		if m == "" {
			m = "image/jpeg"
		}
		return []piece{{b: []byte("data:" + m + ";base64,")}, d}, true
	}
	return nil, false
}

// appendToolResult writes a user message's tool_result block as vLLM
// does: a tool message of its text (a string, or its text blocks joined
// by newlines), then, if it has images, a user message of them.
func appendToolResult(dst []byte, b *contentBlock, valid bool, refs *refList, mark *turnMark) ([]byte, error) {
	id, ok := jsonString(b.toolUseID, valid)
	if !ok {
		return dst, formatErr("messages", "a tool_result block's tool_use_id must be a string.")
	}
	var texts []piece
	var images [][]piece
	switch c := b.content; {
	case len(c) == 0 || string(c) == "null":
	case c[0] == '"':
		p, _ := jsonPiece(c, valid)
		texts = append(texts, p)
	case c[0] == '[':
		scanArray(c, valid, func(elem []byte) bool {
			if elem[0] != '{' {
				return true // vLLM skips what is not a block
			}
			var typ, text, source []byte
			scanObject(elem, valid, func(key, val []byte) bool {
				switch string(key) {
				case "type":
					typ = val
				case "text":
					text = val
				case "source":
					source = val
				}
				return true
			})
			switch t, _ := jsonString(typ, valid); t {
			case "text":
				p, _ := jsonPiece(text, valid)
				texts = append(texts, p)
			case "image":
				if url, ok := imageURL(source, valid); ok {
					images = append(images, url)
				}
			}
			return true
		})
	default:
		return dst, formatErr("messages", "a tool_result block's content must be a string or a list of content blocks.")
	}
	dst = appendMessageHead(dst, "tool", "", id)
	dst = appendPieces(append(dst, 's'), "\n", refs, texts...)
	dst = append(appendField(dst, ""), recordSep)
	if len(images) > 0 {
		mark.begin(dst, "user")
		dst = appendMessageHead(dst, "user", "", "")
		for _, url := range images {
			dst = appendPieces(append(dst, 'i'), "", refs, url...)
		}
		dst = append(appendField(dst, ""), recordSep)
		mark.end(dst)
	}
	return dst, nil
}

// appendMessagesTools writes the tool definitions as vLLM hands them to
// the template: {name, description, input_schema} (cache_control left
// out) as chat's {"type":"function","function":{name, description,
// parameters}}; a tool with any other member, such as a server tool's
// type, as its sorted JSON without cache_control.
func appendMessagesTools(dst, tools []byte, valid bool) ([]byte, error) {
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
		delete(m, "cache_control")
		if t, ok := m["type"]; !ok || t == "custom" {
			fn := map[string]any{}
			for k, val := range m {
				switch k {
				case "type":
				case "name", "description":
					fn[k] = val
				case "input_schema":
					fn["parameters"] = val
				default: // not a plain client tool
					fn = nil
				}
				if fn == nil {
					break
				}
			}
			if fn != nil {
				v = map[string]any{"type": "function", "function": fn}
			}
		}
		dst = append(appendValue(append(dst, 't'), v), recordSep)
		return true
	}) {
		return dst, formatErr("tools", "tools must be a list of tool objects.")
	}
	return dst, nil
}
