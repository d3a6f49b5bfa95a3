package shard

import (
	"fmt"
	"math/bits"
	"testing"
)

// TestHasherSeeded: a key's sum is the same every time, for a copy of the
// Hasher too and for another Hasher with the same seed; a Hasher with
// another seed gives other sums, whichever half of the seed differs (on a
// 32-bit platform each half seeds one of the two runtime hashes).
func TestHasherSeeded(t *testing.T) {
	const seed = 0x0123456789abcdef
	h, twin := NewHasher(seed), NewHasher(seed)
	c := h
	others := map[string]Hasher{
		"low half":  NewHasher(seed ^ 1),
		"high half": NewHasher(seed ^ 1<<63),
		"zero":      {},
	}
	same := map[string]int{}
	for i := range 64 {
		k := fmt.Sprintf("user:%d", i)
		s := h.Sum(k)
		if h.Sum(k) != s || c.Sum(k) != s || twin.Sum(k) != s {
			t.Fatalf("Sum(%q) changed between calls, in a copy or for the same seed", k)
		}
		for name, o := range others {
			if o.Sum(k) == s {
				same[name]++
			}
		}
	}
	for name, n := range same {
		t.Errorf("a seed that differs in its %s agrees on %d of 64 keys", name, n)
	}
}

// TestHasherSpreads: the engine takes a shard from a sum's high bits
// (multiply-shift) and the tables mix all of it, so 4096 keys that differ
// in a byte or two spread evenly over 16 shards by the high bits and over
// 16 by the low, on 32-bit platforms too, where the 64 bits are two
// runtime hashes. Each count's mean is 256 and its deviation 15.5: the
// bounds are 8 deviations away.
func TestHasherSpreads(t *testing.T) {
	for _, seed := range []uint64{0, 1, 0x9e3779b97f4a7c15} {
		h := NewHasher(seed)
		var hi, lo [16]int
		for i := range 4096 {
			s := h.Sum(fmt.Sprintf("tenant:%d", i))
			top, _ := bits.Mul64(s, 16)
			hi[top]++
			lo[s&15]++
		}
		for i := range 16 {
			if hi[i] < 132 || hi[i] > 380 || lo[i] < 132 || lo[i] > 380 {
				t.Fatalf("seed %#x: uneven spread: high bits %v, low bits %v", seed, hi, lo)
			}
		}
	}
}
