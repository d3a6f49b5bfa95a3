package shard

import (
	"fmt"
	"hash/maphash"
	"strings"
	"testing"
)

// BenchmarkHash is Hasher.Sum (impl=Sum) beside hash/maphash.String
// (impl=maphash), the supported way to the runtime's hash that Sum links
// to, on 256 distinct keys of each length, built before the timer; ns/op is
// per key. With -tags purego, impl=Sum is the portable path, xxhash.
func BenchmarkHash(b *testing.B) {
	h, seed := NewHasher(0x9e3779b97f4a7c15), maphash.MakeSeed()
	for _, n := range []int{8, 17, 23, 64} {
		keys := make([]string, 256)
		for i := range keys {
			keys[i] = (fmt.Sprintf("k%07d", i) + strings.Repeat("x", n))[:n]
		}
		b.Run(fmt.Sprintf("key=%d/impl=Sum", n), func(b *testing.B) {
			var sum uint64
			i := 0
			for b.Loop() {
				sum += h.Sum(keys[i%len(keys)])
				i++
			}
			hashSink = sum
		})
		b.Run(fmt.Sprintf("key=%d/impl=maphash", n), func(b *testing.B) {
			var sum uint64
			i := 0
			for b.Loop() {
				sum += maphash.String(seed, keys[i%len(keys)])
				i++
			}
			hashSink = sum
		})
	}
}

// hashSink keeps BenchmarkHash's sums live.
var hashSink uint64
