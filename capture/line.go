package capture

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendLine appends l as one JSON line: the Mooncake trace's fields
// first (timestamp in ms from the capture's start, input_length,
// output_length, hash_ids), then block_tokens unless it is the format's
// 512, then routing's. A field that is not known is
// left out rather than written as 0.
func (w *Writer) appendLine(dst []byte, l *Line) []byte {
	ts := max(0, l.Arrived.Sub(w.start).Milliseconds())
	dst = append(dst, `{"timestamp":`...)
	dst = strconv.AppendInt(dst, ts, 10)
	dst = append(dst, `,"input_length":`...)
	dst = strconv.AppendInt(dst, int64(l.InputLength), 10)
	dst = append(dst, `,"output_length":`...)
	dst = strconv.AppendInt(dst, int64(l.OutputLength), 10)
	dst = append(dst, `,"hash_ids":[`...)
	for i, id := range l.HashIDs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, id, 10)
	}
	dst = append(dst, ']')
	if w.block != BlockTokens {
		dst = append(dst, `,"block_tokens":`...)
		dst = strconv.AppendInt(dst, int64(w.block), 10)
	}
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, l.Model)
	if l.Target != "" {
		dst = append(dst, `,"target":`...)
		dst = appendString(dst, l.Target)
	}
	dst = append(dst, `,"api":`...)
	dst = appendString(dst, l.API)
	dst = append(dst, `,"stream":`...)
	dst = strconv.AppendBool(dst, l.Stream)
	dst = append(dst, `,"priority":`...)
	dst = strconv.AppendInt(dst, int64(l.Priority), 10)
	if l.MaxTokens > 0 {
		dst = append(dst, `,"max_tokens":`...)
		dst = strconv.AppendInt(dst, int64(l.MaxTokens), 10)
	}
	if l.Session != 0 {
		dst = append(dst, `,"session":`...)
		dst = strconv.AppendUint(dst, l.Session, 10)
	}
	if l.Conversation != 0 {
		dst = append(dst, `,"conversation":`...)
		dst = strconv.AppendUint(dst, l.Conversation, 10)
	}
	if l.Usage {
		dst = append(dst, `,"prompt_tokens":`...)
		dst = strconv.AppendInt(dst, int64(l.PromptTokens), 10)
		if l.CachedKnown {
			dst = append(dst, `,"cached_tokens":`...)
			dst = strconv.AppendInt(dst, int64(l.CachedTokens), 10)
		}
	}
	if l.Backend != "" {
		dst = append(dst, `,"backend":`...)
		dst = appendString(dst, l.Backend)
	}
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(l.Status), 10)
	if l.TTFT > 0 {
		dst = append(dst, `,"ttft_ms":`...)
		dst = appendMillis(dst, l.TTFT)
	}
	dst = append(dst, `,"duration_ms":`...)
	dst = appendMillis(dst, l.Duration)
	return append(dst, "}\n"...)
}

func appendMillis(dst []byte, d time.Duration) []byte {
	return strconv.AppendFloat(dst, float64(d.Microseconds())/1000, 'f', -1, 64)
}

// appendString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20 || c == 0x7f:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}
