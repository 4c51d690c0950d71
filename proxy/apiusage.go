package proxy

import (
	"bytes"
	"encoding/json"

	"github.com/llmlb/llmlb/jsonscan"
)

// The Responses and Messages APIs report usage in their own shapes, and
// stream typed events instead of chat chunks.
//
// Responses (OpenAI; vLLM's vllm/entrypoints/openai/responses/protocol.py,
// ResponseUsage): usage {input_tokens, input_tokens_details.cached_tokens,
// output_tokens}, in the response object, which a stream carries in its
// response.completed (or .incomplete, .failed) event; output comes in
// events whose type ends in ".delta".
//
// Messages (Anthropic; vLLM's vllm/entrypoints/anthropic/serving.py):
// usage {input_tokens, output_tokens, cache_read_input_tokens,
// cache_creation_input_tokens} in the message; a stream sends it in
// message_start's message and, counts so far, in message_delta; output
// comes in content_block_delta events. In Anthropic's definition
// input_tokens leaves out the tokens read from or written to the cache,
// so the prompt is the sum of the three; vLLM sends input_tokens alone,
// the whole prompt, which the sum leaves as it is.

// apiUsage is the usage object of either API; absent fields stay nil.
type apiUsage struct {
	InputTokens        *int `json:"input_tokens"`
	OutputTokens       *int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheRead     *int `json:"cache_read_input_tokens"`
	CacheCreation *int `json:"cache_creation_input_tokens"`
}

// merge sets what u reports into the observed usage; a count u leaves
// out keeps the value an earlier event gave.
func (o *observer) merge(u *apiUsage) {
	if u == nil {
		return
	}
	o.u.Known = true
	if u.InputTokens != nil {
		o.in = *u.InputTokens
	}
	if u.CacheRead != nil {
		o.cacheRead = *u.CacheRead
		o.u.CachedKnown, o.u.Cached = true, *u.CacheRead
	}
	if u.CacheCreation != nil {
		o.cacheWrite = *u.CacheCreation
	}
	if d := u.InputTokensDetails; d != nil && d.CachedTokens != nil {
		o.u.CachedKnown, o.u.Cached = true, *d.CachedTokens
	}
	if u.OutputTokens != nil {
		o.u.Completion = *u.OutputTokens
	}
	o.u.Prompt = o.in
	if o.kind == KindMessages {
		o.u.Prompt = o.in + o.cacheRead + o.cacheWrite
	}
}

// apiBody reads the usage of a whole Responses or Messages answer.
func (o *observer) apiBody(body []byte) {
	var b struct {
		Usage *apiUsage `json:"usage"`
	}
	if json.Unmarshal(body, &b) == nil {
		o.merge(b.Usage)
	}
}

// apiEvent reads one data line of a Responses or Messages stream, records
// the usage it carries, and reports whether it carried output.
func (o *observer) apiEvent(data []byte) bool {
	if len(data) == 0 || data[0] != '{' {
		return false
	}
	var typ []byte
	usage := false
	if !jsonscan.Object(data, func(key, val []byte) bool {
		switch string(key) {
		case "type":
			typ = val
		case "usage":
			usage = true
		case "response", "message":
			usage = usage || bytes.Contains(val, []byte(`"usage"`))
		}
		return true
	}) {
		return false
	}
	var t string
	if json.Unmarshal(typ, &t) != nil {
		return false
	}
	if usage {
		var ev struct {
			Usage    *apiUsage `json:"usage"`
			Response *struct {
				Usage *apiUsage `json:"usage"`
			} `json:"response"`
			Message *struct {
				Usage *apiUsage `json:"usage"`
			} `json:"message"`
		}
		if json.Unmarshal(data, &ev) == nil {
			o.merge(ev.Usage)
			if ev.Response != nil {
				o.merge(ev.Response.Usage)
			}
			if ev.Message != nil {
				o.merge(ev.Message.Usage)
			}
		}
	}
	if o.kind == KindMessages {
		return t == "content_block_delta"
	}
	return len(t) > len(".delta") && t[len(t)-len(".delta"):] == ".delta"
}
