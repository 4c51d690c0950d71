package prefix

import "github.com/cespare/xxhash/v2"

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
