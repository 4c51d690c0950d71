package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// BytesPerToken is how many bytes of prompt text the emulated engines count
// as one token, as llmlb assumes for English text.
const BytesPerToken = 4

// Tokens returns the token ids the emulated engines give text: each
// BytesPerToken bytes read as a little-endian number; bytes short of a
// whole token at the end count for none, as the engines' token counts
// (len(text)/BytesPerToken) have it. It is the emulation's tokenizer, what
// its /tokenize answers.
func Tokens(text []byte) []uint32 {
	out := make([]uint32, 0, len(text)/BytesPerToken)
	for off := 0; off+BytesPerToken <= len(text); off += BytesPerToken {
		out = append(out, binary.LittleEndian.Uint32(text[off:]))
	}
	return out
}

// tokensAt is the token ids of a tokenizer reading bpt bytes a token: the
// first bytes of each bpt, up to four, read as a little-endian number.
func tokensAt(text []byte, bpt int) []uint32 {
	out := make([]uint32, 0, len(text)/bpt)
	var buf [4]byte
	for off := 0; off+bpt <= len(text); off += bpt {
		clear(buf[:])
		copy(buf[:], text[off:off+bpt])
		out = append(out, binary.LittleEndian.Uint32(buf[:]))
	}
	return out
}

// BlockHashes appends to dst the chained hashes of text's full blocks of
// blockBytes: block i's hash covers seed and every byte up to the block's
// end, so equal hashes mean equal prefixes. The seed separates what must
// not share a cache (adapters, models).
func BlockHashes(dst []uint64, seed uint64, text []byte, blockBytes int) []uint64 {
	var d xxhash.Digest
	var buf [8]byte
	prev := seed
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		_, _ = d.Write(text[off : off+blockBytes])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}
