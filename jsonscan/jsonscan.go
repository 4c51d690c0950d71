package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"unicode/utf8"
)

// maxDepth is encoding/json's nesting limit; deeper input is left to it.
const maxDepth = 10000

// Object reads b as one JSON object (whitespace around it allowed) and
// calls member with each member's key (unescaped) and raw value (both
// aliasing b, the value without the whitespace around it), in order, stopping when member
// returns false. It reports whether b is a valid object and every member
// call returned true.
func Object(b []byte, member func(key, val []byte) bool) bool {
	return object(scanner{b: b}, member)
}

// ValidObject is [Object] for b already known to be valid JSON in valid
// UTF-8: a value inside a document that Object or Array accepted and that
// utf8.Valid passed. It finds the same members, but reads each string only
// for its closing quote, not checking its escapes and bytes again, which
// is most of the work on a long prompt. On other input it does not panic,
// but what it reports is unspecified.
func ValidObject(b []byte, member func(key, val []byte) bool) bool {
	return object(scanner{b: b, valid: true}, member)
}

func object(s scanner, member func(key, val []byte) bool) bool {
	s.ws()
	if !s.eat('{') {
		return false
	}
	ok := s.list('}', func() bool {
		ks := s.i
		escaped, ok := s.str()
		if !ok {
			return false
		}
		key := s.b[ks+1 : s.i-1] // aliases b: no allocation for the usual key
		if escaped {
			var k string
			if json.Unmarshal(s.b[ks:s.i], &k) != nil {
				return false
			}
			key = []byte(k)
		}
		s.ws()
		if !s.eat(':') {
			return false
		}
		s.ws()
		vs := s.i
		return s.value(1) && member(key, s.b[vs:s.i])
	})
	s.ws()
	return ok && s.i == len(s.b)
}

// Array reads b as one JSON array and calls elem with each element's raw
// value, as [Object] does.
func Array(b []byte, elem func(val []byte) bool) bool {
	return array(scanner{b: b}, elem)
}

// ValidArray is [Array] for b already known to be valid, as
// [ValidObject] is Object.
func ValidArray(b []byte, elem func(val []byte) bool) bool {
	return array(scanner{b: b, valid: true}, elem)
}

func array(s scanner, elem func(val []byte) bool) bool {
	s.ws()
	if !s.eat('[') {
		return false
	}
	ok := s.list(']', func() bool {
		vs := s.i
		return s.value(1) && elem(s.b[vs:s.i])
	})
	s.ws()
	return ok && s.i == len(s.b)
}

// PlainString returns the text of the JSON string raw when it needs no
// decoding: no escapes, no control characters, valid UTF-8. encoding/json
// would return the same bytes; most prompts are such strings, and this
// reads them in one quick pass instead of a validating and a decoding one.
func PlainString(raw []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '"') >= 0 || bytes.IndexByte(in, '\\') >= 0 || hasControl(in) || !utf8.Valid(in) {
		return nil, false
	}
	return in, true
}

// ValidPlainString is [PlainString] for a string already known to be
// valid JSON in valid UTF-8 (see [ValidObject]): only an escape can make
// its text differ from its bytes.
func ValidPlainString(raw []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') >= 0 {
		return nil, false
	}
	return in, true
}

type scanner struct {
	b     []byte
	i     int
	valid bool // b is known to be valid JSON in valid UTF-8 (ValidObject)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string at s.i, reporting whether it holds escapes.
func (s *scanner) str() (escaped, ok bool) {
	if !s.eat('"') {
		return false, false
	}
	if s.valid {
		return s.validStr()
	}
	// Long prompts are almost all plain text: the next quote and the next
	// backslash before it are found with bytes.IndexByte, which is
	// vectorised, and the text between is checked for control characters
	// a word at a time. q, the next quote at or after i, is searched for
	// again only once an escape has stepped past it.
	b := s.b
	q := -1
	for i := s.i; ; {
		if q < i {
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				return false, false
			}
			q = i + j
		}
		end := q
		if k := bytes.IndexByte(b[i:q], '\\'); k >= 0 {
			end = i + k
		}
		if hasControl(b[i:end]) {
			return false, false
		}
		if end == q {
			s.i = q + 1
			return escaped, true
		}
		escaped = true
		i = end // a backslash; q is after it, so b[i+1] exists
		switch b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if i+6 > len(b) {
				return false, false
			}
			for _, h := range b[i+2 : i+6] {
				if !isHex(h) {
					return false, false
				}
			}
			i += 6
		default:
			return false, false
		}
	}
}

// validStr reads the rest of a string known to be valid, its opening
// quote read: up to the first quote not escaped by an odd run of
// backslashes, found with bytes.IndexByte, which is vectorised.
func (s *scanner) validStr() (escaped, ok bool) {
	start := s.i
	for i := start; ; {
		j := bytes.IndexByte(s.b[i:], '"')
		if j < 0 {
			return false, false
		}
		end := i + j
		n := 0
		for end-1-n >= start && s.b[end-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			s.i = end + 1
			return bytes.IndexByte(s.b[start:end], '\\') >= 0, true
		}
		i = end + 1
	}
}

// hasControl reports whether b holds a control character (below 0x20),
// which a JSON string may not, eight bytes at a time with the has-less-than
// trick of Sean Anderson's "Bit Twiddling Hacks" (exact as to whether any
// byte of a word is below 0x20).
func hasControl(b []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+32 <= len(b); i += 32 {
		w0 := binary.LittleEndian.Uint64(b[i:])
		w1 := binary.LittleEndian.Uint64(b[i+8:])
		w2 := binary.LittleEndian.Uint64(b[i+16:])
		w3 := binary.LittleEndian.Uint64(b[i+24:])
		if ((w0-ones*0x20)&^w0|(w1-ones*0x20)&^w1|(w2-ones*0x20)&^w2|(w3-ones*0x20)&^w3)&highs != 0 {
			return true
		}
	}
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		if (w-ones*0x20)&^w&highs != 0 {
			return true
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return true
		}
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// value reads one value at s.i (no leading whitespace).
func (s *scanner) value(depth int) bool {
	if s.i >= len(s.b) || depth > maxDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.str()
		return ok
	case c == '{':
		s.i++
		return s.list('}', func() bool {
			if _, ok := s.str(); !ok {
				return false
			}
			s.ws()
			if !s.eat(':') {
				return false
			}
			s.ws()
			return s.value(depth + 1)
		})
	case c == '[':
		s.i++
		return s.list(']', func() bool { return s.value(depth + 1) })
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	}
	return false
}

// list reads the members of an object or array up to its closing byte,
// the opening one already read; member reads one member.
func (s *scanner) list(closing byte, member func() bool) bool {
	s.ws()
	if s.eat(closing) {
		return true
	}
	for {
		s.ws()
		if !member() {
			return false
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		return s.eat(closing)
	}
}

func (s *scanner) lit(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	s.eat('-')
	switch {
	case s.eat('0'):
	case s.i < len(s.b) && '1' <= s.b[s.i] && s.b[s.i] <= '9':
		s.digits()
	default:
		return false
	}
	if s.eat('.') {
		if !s.digits() {
			return false
		}
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits reads one or more digits.
func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
