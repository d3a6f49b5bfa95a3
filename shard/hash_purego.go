//go:build purego

package shard

import "github.com/cespare/xxhash/v2"

// sum is xxhash of key seeded with seed: the seed starts the hash's lanes,
// so keys that collide under one seed (anyone can make XXH64 collisions for
// a known seed) part under another. XOR-ing a seed into an unseeded sum,
// even through a bijective finalizer, would keep every such collision under
// every seed. The Digest lives on the stack.
func sum(seed uint64, key string) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.WriteString(key)
	return d.Sum64()
}
