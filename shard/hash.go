package shard

import "github.com/cespare/xxhash/v2"

// Hasher is the seeded key hash an engine routes with and its shards index
// their tables with, so a key is hashed once per request. Its zero value is
// not usable: make one with NewHasher.
type Hasher struct {
	seeded xxhash.Digest // reset with the seed; copied per key
}

// NewHasher returns a Hasher seeded with seed. An engine picks the seed at
// random, so nobody can choose keys that collide on one shard or one slot.
func NewHasher(seed uint64) Hasher {
	var h Hasher
	h.seeded.ResetWithSeed(seed)
	return h
}

// Sum returns the hash of key.
func (h *Hasher) Sum(key string) uint64 {
	d := h.seeded // a copy: the seeded state costs nothing to reuse
	_, _ = d.WriteString(key)
	return d.Sum64()
}
