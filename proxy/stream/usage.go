package stream

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/jsonscan"
)

// Usage is the token counts a server reported for one request, from the
// usage object of its answer or of its stream's events, and the timing of
// the stream's token events.
type Usage struct {
	Known                bool // the server reported usage
	Prompt, Completion   int
	CachedKnown          bool // it reported the prompt tokens its cache served
	Cached               int
	TokenEvents          int // stream events that carried output
	FirstToken, LastSeen time.Time
}

// wireUsage is OpenAI's usage object as vLLM, SGLang and trtllm-serve send
// it; prompt_tokens_details is null unless the server is asked to report
// it (vLLM: --enable-prompt-tokens-details).
type wireUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *Usage) set(w *wireUsage) {
	u.Known, u.Prompt, u.Completion = true, w.PromptTokens, w.CompletionTokens
	if d := w.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		u.CachedKnown, u.Cached = true, *d.CachedTokens
	}
}

// The Responses and Messages APIs report usage in their own shapes.
//
// Responses (OpenAI; vLLM's vllm/entrypoints/openai/responses/protocol.py,
// ResponseUsage): usage {input_tokens, input_tokens_details.cached_tokens,
// output_tokens}, in the response object, which a stream carries in its
// response.completed (or .incomplete, .failed) event.
//
// Messages (Anthropic; vLLM's vllm/entrypoints/anthropic/serving.py):
// usage {input_tokens, output_tokens, cache_read_input_tokens,
// cache_creation_input_tokens} in the message; a stream sends it in
// message_start's message and, counts so far, in message_delta. In
// Anthropic's definition input_tokens leaves out the tokens read from or
// written to the cache, so the prompt is the sum of the three; vLLM sends
// input_tokens alone, the whole prompt, which the sum leaves as it is.

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

// apiCounts is what a Responses or Messages stream reported so far: later
// events may update each count on its own.
type apiCounts struct {
	in, cacheRead, cacheWrite int
}

// merge sets what w reports into u; a count w leaves out keeps the value
// an earlier event gave.
func (c *apiCounts) merge(u *Usage, api API, w *apiUsage) {
	if w == nil {
		return
	}
	u.Known = true
	if w.InputTokens != nil {
		c.in = *w.InputTokens
	}
	if w.CacheRead != nil {
		c.cacheRead = *w.CacheRead
		u.CachedKnown, u.Cached = true, *w.CacheRead
	}
	if w.CacheCreation != nil {
		c.cacheWrite = *w.CacheCreation
	}
	if d := w.InputTokensDetails; d != nil && d.CachedTokens != nil {
		u.CachedKnown, u.Cached = true, *d.CachedTokens
	}
	if w.OutputTokens != nil {
		u.Completion = *w.OutputTokens
	}
	u.Prompt = c.in
	if api == Messages {
		u.Prompt = c.in + c.cacheRead + c.cacheWrite
	}
}

// mergeEvent reads the usage a Responses or Messages event carries: at its
// top level (message_delta), in its response (response.completed) or in
// its message (message_start).
func (c *apiCounts) mergeEvent(u *Usage, api API, data []byte) {
	var ev struct {
		Usage    *apiUsage `json:"usage"`
		Response *struct {
			Usage *apiUsage `json:"usage"`
		} `json:"response"`
		Message *struct {
			Usage *apiUsage `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	c.merge(u, api, ev.Usage)
	if ev.Response != nil {
		c.merge(u, api, ev.Response.Usage)
	}
	if ev.Message != nil {
		c.merge(u, api, ev.Message.Usage)
	}
}

// BodyUsage reads the usage of a whole JSON answer of api; Known is false
// when it has none or the body does not parse.
func BodyUsage(api API, body []byte) Usage {
	var u Usage
	if api == Responses || api == Messages {
		var b struct {
			Usage *apiUsage `json:"usage"`
		}
		if json.Unmarshal(body, &b) == nil {
			var c apiCounts
			c.merge(&u, api, b.Usage)
		}
		return u
	}
	if w := bodyUsage(body); w != nil {
		u.set(w)
	}
	return u
}

// bodyUsage reads the "usage" object of a JSON answer; nil when it has
// none. jsonscan finds the member without decoding the rest (a
// completion's text); a body it is unsure of goes to encoding/json.
func bodyUsage(body []byte) *wireUsage {
	var raw []byte
	if !jsonscan.Object(body, func(key, val []byte) bool {
		if string(key) == "usage" {
			raw = val
		}
		return true
	}) {
		var b struct {
			Usage *wireUsage `json:"usage"`
		}
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		return b.Usage
	}
	var u *wireUsage
	if raw == nil {
		return nil
	}
	if !scanUsage(raw, &u) {
		u = nil
		if json.Unmarshal(raw, &u) != nil {
			return nil
		}
	}
	return u
}

// The fast readers below decode a usage object and a stream chunk as
// encoding/json decodes them into wireUsage and {choices, usage}, reading
// only what is needed and allocating nothing but the cached-tokens detail;
// each reports false when unsure (invalid JSON, a value of another type
// or shape, a key that differs from a field's only in case, which
// encoding/json would take), and the caller asks encoding/json. Every
// answer and every stream chunk with a usage member goes through them:
// encoding/json was a twentieth of llmlb's CPU on small requests.

var (
	usageKeys   = []string{"prompt_tokens", "completion_tokens", "prompt_tokens_details"}
	detailsKeys = []string{"cached_tokens"}
)

// foldsTo reports whether key is one of keys but for case: encoding/json
// would match it, the fast readers do not.
func foldsTo(key []byte, keys []string) bool {
	for _, k := range keys {
		if strings.EqualFold(string(key), k) {
			return true
		}
	}
	return false
}

// scanInt reads a JSON integer that fits an int into dst; null leaves dst
// as it is, as encoding/json does.
func scanInt(val []byte, dst *int) bool {
	if string(val) == "null" {
		return true
	}
	digits := val
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	n, err := strconv.Atoi(string(val))
	*dst = n
	return err == nil
}

// scanUsage decodes a usage value (an object or null) as encoding/json
// decodes it into *dst: null sets it to nil, an object decodes into the
// struct *dst points to, a new one if nil.
func scanUsage(raw []byte, dst **wireUsage) bool {
	raw = bytes.Trim(raw, " \t\n\r") // JSON's whitespace, not Unicode's
	if string(raw) == "null" {
		*dst = nil
		return true
	}
	if *dst == nil {
		*dst = new(wireUsage)
	}
	u := *dst
	return jsonscan.Object(raw, func(key, val []byte) bool {
		switch string(key) {
		case "prompt_tokens":
			return scanInt(val, &u.PromptTokens)
		case "completion_tokens":
			return scanInt(val, &u.CompletionTokens)
		case "prompt_tokens_details":
			return scanDetails(val, u)
		}
		return !foldsTo(key, usageKeys)
	})
}

// scanDetails decodes prompt_tokens_details into u; a repeated member
// decodes into the same struct, as encoding/json does.
func scanDetails(val []byte, u *wireUsage) bool {
	if string(val) == "null" {
		u.PromptTokensDetails = nil
		return true
	}
	if u.PromptTokensDetails == nil {
		u.PromptTokensDetails = &struct {
			CachedTokens *int `json:"cached_tokens"`
		}{}
	}
	d := u.PromptTokensDetails
	return jsonscan.Object(val, func(key, v []byte) bool {
		if string(key) == "cached_tokens" {
			if string(v) == "null" {
				d.CachedTokens = nil
				return true
			}
			if d.CachedTokens == nil {
				d.CachedTokens = new(int)
			}
			return scanInt(v, d.CachedTokens)
		}
		return !foldsTo(key, detailsKeys)
	})
}
