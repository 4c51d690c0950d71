package prefix

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Seed returns the seed of a prompt's hash chain: the target model and the
// request's cache_salt. Requests for different models, or with different
// salts, never share a block, as they never share a cache entry on a server
// (vLLM mixes cache_salt into its first block hash for the same reason).
func Seed(model, salt string) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(model)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(salt)
	return d.Sum64()
}

// AppendHashes appends to dst the chained hashes of data's first max full
// blocks of blockBytes bytes: block i's hash is XXH64 of block i seeded with
// block i-1's hash (block 0 is seeded with seed). So a block's hash names its
// whole prefix, as an engine's prefix-cache block hash does, and the hashes
// of a prompt's prefix are a prefix of the prompt's hashes. A trailing
// partial block is not hashed: engines cache only full blocks.
func AppendHashes(dst []uint64, seed uint64, data []byte, blockBytes, max int) []uint64 {
	if blockBytes <= 0 {
		return dst
	}
	h := seed
	var d xxhash.Digest
	for n := 0; n < max && len(data) >= blockBytes; n++ {
		d.ResetWithSeed(h)
		_, _ = d.Write(data[:blockBytes])
		h = d.Sum64()
		dst = append(dst, h)
		data = data[blockBytes:]
	}
	return dst
}

// Key returns a hash of data's first blockBytes bytes (all of data when it is
// shorter) with seed: the same for every request that starts alike, and for
// every balancer replica, so it can break ties the same way everywhere.
func Key(seed uint64, data []byte, blockBytes int) uint64 {
	if blockBytes > 0 && len(data) > blockBytes {
		data = data[:blockBytes]
	}
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(data)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	_, _ = d.Write(n[:])
	return d.Sum64()
}
