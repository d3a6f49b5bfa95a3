//go:build purego

package shard

import (
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestSumIsSeededXXH64: sum gives the sums of xxhash's Digest seeded with
// the same seed, for every length up to 100 bytes (each tail the one-pass
// loop handles: words, a half word, bytes, with and without 32-byte
// stripes) and for long keys, under random seeds and the extreme ones.
func TestSumIsSeededXXH64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4099)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	lengths := []int{127, 128, 129, 255, 1000, 4096, 4099}
	for n := range 101 {
		lengths = append(lengths, n)
	}
	seeds := []uint64{0, 1, 1 << 63, ^uint64(0), ^xxPrime1 + 1, ^xxPrime2 + 1} // the last two make lanes zero
	for range 40 {
		seeds = append(seeds, r.Uint64())
	}
	for _, n := range lengths {
		for _, seed := range seeds {
			off := r.IntN(len(buf) - n + 1)
			key := string(buf[off : off+n])
			d := xxhash.NewWithSeed(seed)
			_, _ = d.WriteString(key)
			if got, want := sum(seed, key), d.Sum64(); got != want {
				t.Fatalf("sum(%#x, %d bytes) = %#x, xxhash's seeded Digest %#x", seed, n, got, want)
			}
		}
	}
}
