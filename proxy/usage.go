package proxy

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/llmlb/llmlb/jsonscan"
)

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
	chunkKeys   = []string{"choices", "usage"}
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

// scanChunk decodes a stream chunk as encoding/json decodes it into
// {Choices []json.RawMessage; Usage *wireUsage}: how many choices, and
// the usage.
func scanChunk(data []byte) (choices int, u *wireUsage, ok bool) {
	ok = jsonscan.Object(data, func(key, val []byte) bool {
		switch string(key) {
		case "choices":
			if string(val) == "null" {
				choices = 0
				return true
			}
			n := 0
			if !jsonscan.Array(val, func([]byte) bool { n++; return true }) {
				return false
			}
			choices = n
			return true
		case "usage":
			return scanUsage(val, &u)
		}
		return !foldsTo(key, chunkKeys)
	})
	return choices, u, ok
}
