//go:build purego

package shard

import "github.com/cespare/xxhash/v2"

// sum is xxhash of key, with the seed folded in by a bijective finalizer
// (MurmurHash3's fmix64), so every bit of the result depends on the seed.
func sum(seed uint64, key string) uint64 {
	x := xxhash.Sum64String(key) ^ seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
