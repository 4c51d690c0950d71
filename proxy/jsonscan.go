package proxy

import (
	"encoding/json"
)

// maxDepth is encoding/json's nesting limit; deeper input is left to it,
// so that it reports the error.
const maxDepth = 10000

// splitObject reads body as one JSON object and calls set with each
// member's key (unescaped) and raw value (aliasing body, without the
// whitespace around it), in order. It validates as it goes, in one pass,
// and reports false for anything encoding/json would refuse (and for
// anything it is unsure of, such as nesting past encoding/json's limit):
// the caller then asks encoding/json, whose error message it passes on.
// It is the fast path of [ParseRequest]: prompts of hundreds of kilobytes
// are mostly string bytes, which it skips a byte at a time instead of
// running encoding/json's validator and then its decoder over them.
func splitObject(body []byte, set func(key string, val []byte)) bool {
	s := scanner{b: body}
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
		key := string(s.b[ks+1 : s.i-1])
		if escaped && json.Unmarshal(s.b[ks:s.i], &key) != nil {
			return false
		}
		s.ws()
		if !s.eat(':') {
			return false
		}
		s.ws()
		vs := s.i
		if !s.value(1) {
			return false
		}
		set(key, s.b[vs:s.i])
		return true
	})
	s.ws()
	return ok && s.i == len(s.b)
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
