package shard

// Hasher is the seeded key hash an engine routes with and its shards index
// their tables with, so a key is hashed once per request. Its zero value
// hashes with seed 0: make one with NewHasher. It is internal to tokenshard:
// only package engine uses it, beside the shards.
type Hasher struct {
	seed uint64
}

// NewHasher returns a Hasher seeded with seed. An engine picks the seed at
// random, so nobody can choose keys that land on one shard or one slot. Sums
// are fixed for a seed only within one process (see sum), so nothing may
// keep them across a restart. It is internal to tokenshard: only package
// engine calls it.
func NewHasher(seed uint64) Hasher { return Hasher{seed: seed} }

// Sum returns the hash of key (see sum for how it is computed).
func (h *Hasher) Sum(key string) uint64 { return sum(h.seed, key) }
