package jsonscan

import (
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
	s := scanner{b: b}
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
	s := scanner{b: b}
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
	for _, c := range in {
		if c == '"' || c == '\\' || c < 0x20 {
			return nil, false
		}
	}
	if !utf8.Valid(in) {
		return nil, false
	}
	return in, true
}

type scanner struct {
	b []byte
	i int
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
	b := s.b
	for i := s.i; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return escaped, true
		case c < 0x20:
			return false, false
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return false, false
			}
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
		default:
			i++
		}
	}
	return false, false
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
