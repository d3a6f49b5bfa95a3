//go:build !purego

package shard

import "unsafe"

// sum is the runtime's own seeded hash of key, the one maps and hash/maphash
// use: AES rounds where the CPU has them, keyed at start-up with random bytes
// as well as with seed, so one seed gives other sums in another process. It
// links to the runtime because maphash.String, which reaches the same hash
// through two more calls and a seed check, costs about a nanosecond a key
// (BenchmarkHash's impl=maphash) and so a few percent of each decision in a
// hot key's batches (BenchmarkDecide in package bench, whose Performance
// notes give the figures). -tags purego builds the portable path instead,
// xxhash seeded with seed (hash_purego.go). The runtime's hash is a
// uintptr: on a 32-bit platform two of them make the 64 bits, the second
// seeded with seed's high half and the first, so that equal halves do not
// make the two equal.
func sum(seed uint64, key string) uint64 {
	p, n := unsafe.Pointer(unsafe.StringData(key)), uintptr(len(key))
	if unsafe.Sizeof(uintptr(0)) == 8 {
		return uint64(memhash(p, uintptr(seed), n))
	}
	lo := memhash(p, uintptr(uint32(seed)), n)
	hi := memhash(p, uintptr(seed>>32)^lo, n)
	return uint64(hi)<<32 | uint64(uint32(lo))
}

// memhash is the runtime's hash of the n bytes at p, seeded with h. The
// runtime keeps it for packages that link to it (go.dev/issue/67401).
//
//go:linkname memhash runtime.memhash
//go:noescape
func memhash(p unsafe.Pointer, h, n uintptr) uintptr
