package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// reader reads the msgpack values an event batch is made of
// (https://github.com/msgpack/msgpack/blob/master/spec.md). It reads only
// what the schema asks for and skips the rest, bounds every length by the
// bytes left, and never allocates by a length it has not checked, so a
// hostile payload costs no more than its size.
type reader struct {
	b   []byte
	off int
}

var errShort = errors.New("msgpack: unexpected end of data")

// maxDepth bounds nesting in skipped values.
const maxDepth = 32

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) uint(n int) (uint64, error) {
	p, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	default:
		return binary.BigEndian.Uint64(p), nil
	}
}

// peek returns the next format byte without consuming it.
func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

// nil reports whether the next value is nil, consuming it if so.
func (r *reader) nil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// length reads a length of n bytes and checks that at least min bytes
// per element remain for it.
func (r *reader) length(n, per int) (int, error) {
	v, err := r.uint(n)
	if err != nil {
		return 0, err
	}
	if v > uint64(len(r.b)-r.off)/uint64(per) {
		return 0, errShort
	}
	return int(v), nil
}

// arrayLen reads an array header.
func (r *reader) arrayLen() (int, error) {
	c, err := r.byte()
	if err != nil {
		return 0, err
	}
	switch {
	case c&0xf0 == 0x90:
		n := int(c & 0x0f)
		if n > len(r.b)-r.off {
			return 0, errShort
		}
		return n, nil
	case c == 0xdc:
		return r.length(2, 1)
	case c == 0xdd:
		return r.length(4, 1)
	}
	return 0, fmt.Errorf("msgpack: want an array, have format 0x%02x", c)
}

// mapLen reads a map header.
func (r *reader) mapLen() (int, error) {
	c, err := r.byte()
	if err != nil {
		return 0, err
	}
	switch {
	case c&0xf0 == 0x80:
		n := int(c & 0x0f)
		if 2*n > len(r.b)-r.off {
			return 0, errShort
		}
		return n, nil
	case c == 0xde:
		return r.length(2, 2)
	case c == 0xdf:
		return r.length(4, 2)
	}
	return 0, fmt.Errorf("msgpack: want a map, have format 0x%02x", c)
}

// str reads a string; the bytes alias the payload.
func (r *reader) str() ([]byte, error) {
	c, err := r.byte()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9:
		n, err = r.length(1, 1)
	case c == 0xda:
		n, err = r.length(2, 1)
	case c == 0xdb:
		n, err = r.length(4, 1)
	default:
		return nil, fmt.Errorf("msgpack: want a string, have format 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

// bin reads a byte string; the bytes alias the payload.
func (r *reader) bin() ([]byte, error) {
	c, err := r.byte()
	if err != nil {
		return nil, err
	}
	var n int
	switch c {
	case 0xc4:
		n, err = r.length(1, 1)
	case 0xc5:
		n, err = r.length(2, 1)
	case 0xc6:
		n, err = r.length(4, 1)
	default:
		return nil, fmt.Errorf("msgpack: want bytes, have format 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

// isBin reports whether the next value is a byte string.
func (r *reader) isBin() bool {
	c, err := r.peek()
	return err == nil && c >= 0xc4 && c <= 0xc6
}

// int reads an integer as its two's-complement 64 bits: a uint64 above
// MaxInt64 and the int64 with the same bits read alike.
func (r *reader) int() (uint64, error) {
	c, err := r.byte()
	if err != nil {
		return 0, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), nil
	case c >= 0xcc && c <= 0xcf:
		return r.uint(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3:
		n := 1 << (c - 0xd0)
		v, err := r.uint(n)
		if err != nil {
			return 0, err
		}
		shift := 64 - 8*n
		return uint64(int64(v<<shift) >> shift), nil
	}
	return 0, fmt.Errorf("msgpack: want an integer, have format 0x%02x", c)
}

// float reads a float, or an integer as a float.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		v, err := r.uint(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.off++
		v, err := r.uint(8)
		return math.Float64frombits(v), err
	}
	v, err := r.int()
	if c >= 0xd0 && c <= 0xd3 || c >= 0xe0 {
		return float64(int64(v)), err
	}
	return float64(v), err
}

// skip reads past one value of any kind.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("msgpack: nested too deep")
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case c&0xf0 == 0x80 || c == 0xde || c == 0xdf:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xf0 == 0x90 || c == 0xdc || c == 0xdd:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xe0 == 0xa0 || c >= 0xd9 && c <= 0xdb:
		_, err := r.str()
		return err
	case c >= 0xc4 && c <= 0xc6:
		_, err := r.bin()
		return err
	case c >= 0xcc && c <= 0xd3:
		_, err := r.int()
		return err
	case c == 0xca || c == 0xcb:
		_, err := r.float()
		return err
	case c >= 0xd4 && c <= 0xd8: // fixext: type byte and 1-16 bytes
		r.off++
		_, err := r.take(1 + 1<<(c-0xd4))
		return err
	case c >= 0xc7 && c <= 0xc9: // ext 8/16/32: length, type byte, data
		r.off++
		n, err := r.length(1<<(c-0xc7), 1)
		if err != nil {
			return err
		}
		_, err = r.take(1 + n)
		return err
	}
	return fmt.Errorf("msgpack: format 0x%02x is never used", c)
}
