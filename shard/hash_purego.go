//go:build purego

package shard

import "math/bits"

// sum is XXH64 of key seeded with seed: the seed starts the hash's lanes,
// so keys that collide under one seed (anyone can make XXH64 collisions for
// a known seed) part under another. XOR-ing a seed into an unseeded sum,
// even through a bijective finalizer, would keep every such collision under
// every seed. It gives the sums of xxhash's Digest made with NewWithSeed,
// in one pass over key, without the Digest's buffer: in about half the
// time a key (BenchmarkHash with -tags purego).
func sum(seed uint64, key string) uint64 {
	s, h := key, seed+xxPrime5
	if len(s) >= 32 {
		v1, v2, v3, v4 := seed+xxPrime1+xxPrime2, seed+xxPrime2, seed, seed-xxPrime1
		for ; len(s) >= 32; s = s[32:] {
			v1 = xxRound(v1, le64(s))
			v2 = xxRound(v2, le64(s[8:]))
			v3 = xxRound(v3, le64(s[16:]))
			v4 = xxRound(v4, le64(s[24:]))
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(xxMerge(xxMerge(xxMerge(h, v1), v2), v3), v4)
	}
	h += uint64(len(key))
	for ; len(s) >= 8; s = s[8:] {
		h = bits.RotateLeft64(h^xxRound(0, le64(s)), 27)*xxPrime1 + xxPrime4
	}
	if len(s) >= 4 {
		h = bits.RotateLeft64(h^uint64(le32(s))*xxPrime1, 23)*xxPrime2 + xxPrime3
		s = s[4:]
	}
	for i := range len(s) {
		h = bits.RotateLeft64(h^uint64(s[i])*xxPrime5, 11) * xxPrime1
	}
	h = (h ^ h>>33) * xxPrime2
	h = (h ^ h>>29) * xxPrime3
	return h ^ h>>32
}

const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

// xxRound mixes one 8-byte word into a lane.
func xxRound(acc, x uint64) uint64 { return bits.RotateLeft64(acc+x*xxPrime2, 31) * xxPrime1 }

// xxMerge folds a lane into the hash of a key of 32 bytes or more.
func xxMerge(h, v uint64) uint64 { return (h^xxRound(0, v))*xxPrime1 + xxPrime4 }

// le64 and le32 read s's first bytes little-endian (one load where the
// compiler combines them).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}
