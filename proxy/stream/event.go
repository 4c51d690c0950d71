package stream

import (
	"bytes"
	"encoding/json"

	"github.com/llmlb/llmlb/jsonscan"
)

// chunk is one data line of an event, parsed once: what every stage reads
// of it. Byte slices alias the line; text is the reader's scratch buffer.
type chunk struct {
	data []byte // the payload, spaces trimmed
	done bool   // `[DONE]`
	obj  bool   // a JSON object jsonscan read

	// Completions and chat.
	id, created []byte // raw values, nil if absent
	usage       []byte // raw usage object, nil if absent or null
	choices     int
	texts       int    // choices whose text or content was not empty
	text        []byte // their text, decoded
	roleOnly    bool   // one choice: a role with no content, no finish_reason and no tool call (chat's preamble)
	finish      bool   // a choice had a finish_reason
	tool        bool   // a choice carried tool calls
	reasoning   bool   // a choice carried reasoning text
	failed      bool   // an error event: {"error": {...}}, or {"object": "error"}
	// wu is usage decoded, once, by wire; decoded says it was.
	wu      wireUsage
	decoded bool
	wuOK    bool

	// odd: a key repeated or spelt in another case, which encoding/json
	// would take; choices and usage were read by it, and usage does not
	// alias the line.
	odd bool

	// Responses and Messages.
	typ      []byte // "type", undecoded
	hasUsage bool   // a usage member at the top level or in response or message
	seq      int    // sequence_number (Responses), -1 if absent
	stop     bool   // Messages: message_delta with a stop_reason
	toolUse  bool   // Messages: a tool_use or thinking block, or its delta
}

// parse reads data, the payload of one data line, into c for api,
// appending the text it carries to scratch, where c.text points; it
// returns scratch, grown.
func (c *chunk) parse(api API, data, scratch []byte) []byte {
	*c = chunk{data: data, seq: -1}
	if len(data) == 0 || data[0] != '{' {
		c.done = string(data) == "[DONE]"
		return scratch
	}
	if api == Responses || api == Messages {
		c.obj = jsonscan.Object(data, c.apiMember)
		return scratch
	}
	text := scratch
	c.obj = jsonscan.Object(data, func(key, val []byte) bool {
		switch string(key) {
		case "id":
			c.id = val
		case "created":
			c.created = val
		case "usage":
			c.odd = c.odd || c.usage != nil
			c.usage = val
			if string(val) == "null" {
				c.usage = nil
			}
		case "error":
			c.failed = c.failed || string(val) != "null"
		case "object":
			c.failed = c.failed || string(val) == `"error"`
		case "choices":
			c.choices = 0
			return string(val) == "null" || jsonscan.ValidArray(val, func(v []byte) bool {
				c.choices++
				text = c.choice(v, text)
				return true
			})
		default:
			c.odd = c.odd || foldsTo(key, chunkKeys)
		}
		return true
	})
	c.text = text[len(scratch):]
	if c.obj && c.odd {
		c.decode()
	}
	if c.choices != 1 {
		c.roleOnly = false
	}
	return text
}

// wire returns the chunk's usage, decoded on the first call only, as
// encoding/json decodes it; nil if it has none.
func (c *chunk) wire() *wireUsage {
	if c.usage == nil {
		return nil
	}
	if !c.decoded {
		c.decoded = true
		u := &c.wu
		c.wuOK = scanUsage(c.usage, &u) && u != nil
		if !c.wuOK {
			c.wu = wireUsage{}
			c.wuOK = json.Unmarshal(c.usage, &c.wu) == nil
		}
	}
	if !c.wuOK {
		return nil
	}
	return &c.wu
}

// chunkKeys are the members of a chunk whose count and value the stages
// read.
var chunkKeys = []string{"choices", "usage"}

// decode reads choices and usage as encoding/json does, for a chunk whose
// keys the fast reading is unsure of.
func (c *chunk) decode() {
	type delta struct {
		Role             *string         `json:"role"`
		Content          *string         `json:"content"`
		ToolCalls        json.RawMessage `json:"tool_calls"`
		ReasoningContent *string         `json:"reasoning_content"`
		Reasoning        *string         `json:"reasoning"`
	}
	var v struct {
		Choices []struct {
			Text         *string `json:"text"`
			Delta        delta   `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(c.data, &v) != nil {
		c.obj = false
		return
	}
	c.choices, c.usage = len(v.Choices), nil
	if v.Usage != nil {
		c.usage, _ = json.Marshal(v.Usage)
	}
	var text []byte
	c.texts, c.finish, c.tool, c.reasoning, c.roleOnly = 0, false, false, false, false
	for _, ch := range v.Choices {
		d := ch.Delta
		n := len(text)
		if ch.Text != nil {
			text = append(text, *ch.Text...)
		}
		if d.Content != nil {
			text = append(text, *d.Content...)
		}
		content := len(text) > n
		if content {
			c.texts++
		}
		c.finish = c.finish || ch.FinishReason != nil
		c.tool = c.tool || len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" && string(d.ToolCalls) != "[]"
		c.reasoning = c.reasoning || d.ReasoningContent != nil && *d.ReasoningContent != "" || d.Reasoning != nil && *d.Reasoning != ""
		c.roleOnly = len(v.Choices) == 1 && d.Role != nil && !content && ch.FinishReason == nil && !c.tool
	}
	c.text = text
}

// The keys of a choice and of its delta that the stages read.
var (
	choiceKeys = []string{"text", "finish_reason", "delta"}
	deltaKeys  = []string{"role", "content", "tool_calls", "reasoning_content", "reasoning"}
)

// choice reads one element of choices, appending its text to text. A key
// repeated, or one of choiceKeys or deltaKeys spelt in another case, makes
// the chunk odd: encoding/json reads it another way.
func (c *chunk) choice(v, text []byte) []byte {
	role, content, finish := false, false, false
	var seen, seenDelta uint8
	once := func(mask *uint8, i int) {
		if *mask&(1<<i) != 0 {
			c.odd = true
		}
		*mask |= 1 << i
	}
	jsonscan.ValidObject(v, func(key, val []byte) bool {
		switch string(key) {
		case "text":
			once(&seen, 0)
			n := len(text)
			text = appendString(text, val)
			content = content || len(text) > n
		case "finish_reason":
			once(&seen, 1)
			finish = string(val) != "null"
		case "delta":
			once(&seen, 2)
			jsonscan.ValidObject(val, func(key, val []byte) bool {
				switch string(key) {
				case "role":
					once(&seenDelta, 0)
					role = string(val) != "null"
				case "content":
					once(&seenDelta, 1)
					n := len(text)
					text = appendString(text, val)
					content = content || len(text) > n
				case "tool_calls":
					once(&seenDelta, 2)
					c.tool = c.tool || string(val) != "null" && string(val) != "[]"
				case "reasoning_content", "reasoning":
					c.reasoning = c.reasoning || string(val) != "null" && string(val) != `""`
				default:
					c.odd = c.odd || foldsTo(key, deltaKeys)
				}
				return true
			})
		default:
			c.odd = c.odd || foldsTo(key, choiceKeys)
		}
		return true
	})
	if content {
		c.texts++
	}
	c.finish = c.finish || finish
	c.roleOnly = role && !content && !finish && !c.tool
	return text
}

// apiMember reads one top-level member of a Responses or Messages event.
func (c *chunk) apiMember(key, val []byte) bool {
	switch string(key) {
	case "type":
		c.typ = val
	case "usage":
		c.hasUsage = c.hasUsage || string(val) != "null"
	case "response", "message":
		c.hasUsage = c.hasUsage || bytes.Contains(val, []byte(`"usage"`))
		if bytes.Contains(val, []byte(`"tool_use"`)) || bytes.Contains(val, []byte(`"thinking"`)) {
			c.toolUse = true
		}
	case "sequence_number":
		if !scanInt(val, &c.seq) {
			c.seq = -1
		}
	case "delta", "content_block":
		if val[0] != '{' {
			return true // Responses: the delta is the text itself
		}
		jsonscan.ValidObject(val, func(key, val []byte) bool {
			switch string(key) {
			case "stop_reason":
				c.stop = string(val) != "null"
			case "type":
				switch string(val) {
				case `"tool_use"`, `"input_json_delta"`, `"thinking"`, `"thinking_delta"`, `"redacted_thinking"`, `"signature_delta"`:
					c.toolUse = true
				}
			}
			return true
		})
	}
	return true
}

// is reports whether the chunk's type is t.
func (c *chunk) is(t string) bool {
	return len(c.typ) == len(t)+2 && string(c.typ[1:len(c.typ)-1]) == t
}

// delta reports whether the chunk is a Responses or Messages event that
// carries output: Messages' content_block_delta, any Responses type that
// ends in ".delta".
func (c *chunk) delta(api API) bool {
	if api == Messages {
		return c.is("content_block_delta")
	}
	return bytes.HasSuffix(c.typ, []byte(`.delta"`))
}

// appendString appends the text of the JSON string raw to dst; anything
// else appends nothing.
func appendString(dst, raw []byte) []byte {
	if s, ok := jsonscan.PlainString(raw); ok { // escapes and bad UTF-8 go to encoding/json
		return append(dst, s...)
	}
	if len(raw) == 0 || raw[0] != '"' {
		return dst
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return dst
	}
	return append(dst, s...)
}

// eventEnd returns the length of the first complete event of b, blank line
// included, or -1.
func eventEnd(b []byte) int {
	i := bytes.Index(b, []byte("\n\n"))
	j := bytes.Index(b, []byte("\r\n\r\n"))
	switch {
	case i < 0 && j < 0:
		return -1
	case j < 0 || (i >= 0 && i < j):
		return i + 2
	default:
		return j + 4
	}
}

// nextLine splits the first line of b, its line end included, from the
// rest.
func nextLine(b []byte) (line, rest []byte) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i+1], b[i+1:]
	}
	return b, nil
}

// dataOf returns the payload of an SSE data line, spaces trimmed, and
// whether line is one.
func dataOf(line []byte) ([]byte, bool) {
	d, ok := bytes.CutPrefix(line, []byte("data:"))
	return bytes.TrimSpace(d), ok
}
