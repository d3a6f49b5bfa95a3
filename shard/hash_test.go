package shard

import (
	"fmt"
	"math/bits"
	"testing"

	"github.com/cespare/xxhash/v2"
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

// xxh64Collision returns two different 64-byte keys with the same unseeded
// XXH64, built as anyone can: each 32-byte stripe feeds four lanes through
// round(acc, x) = rotl(acc + x*prime2, 31) * prime1, which a chosen x can
// steer to any value, so b's second stripe brings its lanes to a's.
func xxh64Collision() (a, b string) {
	const (
		prime1 uint64 = 11400714785074694791
		prime2 uint64 = 14029467366897019727
	)
	inverse := func(x uint64) uint64 { // x odd: x*inverse(x) == 1 mod 2^64
		y := x
		for range 6 {
			y *= 2 - x*y
		}
		return y
	}
	round := func(acc, x uint64) uint64 { return bits.RotateLeft64(acc+x*prime2, 31) * prime1 }
	unround := func(acc, want uint64) uint64 { // the x with round(acc, x) == want
		return (bits.RotateLeft64(want*inverse(prime1), -31) - acc) * inverse(prime2)
	}
	lanes := func(s string, i int) uint64 {
		var v uint64
		for j := 7; j >= 0; j-- {
			v = v<<8 | uint64(s[i*8+j])
		}
		return v
	}
	put := func(buf []byte, v uint64) {
		for j := range 8 {
			buf[j] = byte(v >> (8 * j))
		}
	}
	a = "tenant:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"[:64]
	first := "tenant:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"[:32]
	p1, p2 := prime1, prime2               // variables: the sums wrap
	init := [4]uint64{p1 + p2, p2, 0, -p1} // XXH64's lanes at seed 0
	second := make([]byte, 32)
	for i, v := range init {
		want := round(round(v, lanes(a, i)), lanes(a, 4+i))
		put(second[8*i:], unround(round(v, lanes(first, i)), want))
	}
	return a, first + string(second)
}

// TestHasherSeedsTheHash: the seed goes into the hash itself, not onto an
// unseeded result, so keys that collide without a seed (anyone can make
// such keys for XXH64) do not collide under every seed and cannot all be
// aimed at one shard or one table slot.
func TestHasherSeedsTheHash(t *testing.T) {
	a, b := xxh64Collision()
	if a == b || xxhash.Sum64String(a) != xxhash.Sum64String(b) {
		t.Fatalf("no XXH64 collision: %q and %q", a, b)
	}
	same := 0
	for seed := range uint64(16) {
		h := NewHasher(0x9e3779b97f4a7c15 * (seed + 1))
		if h.Sum(a) == h.Sum(b) {
			same++
		}
	}
	if same > 0 {
		t.Fatalf("keys that collide unseeded collide under %d of 16 seeds", same)
	}
}
