//go:build (amd64 || arm64) && !purego

package shard

import "unsafe"

// canPrefetch reports whether prefetch does anything on this build.
const canPrefetch = true

// prefetch asks the CPU to bring the cache line at p into the caches and
// returns at once, without waiting for it (PREFETCHT0 on amd64, PRFM
// PLDL1KEEP on arm64). A prefetch never faults. Go has no prefetch of its
// own outside the runtime, and a plain load is no substitute: it holds the
// reorder buffer until its line arrives, so only a few of a batch's misses
// are in flight at once, where prefetches put as many in flight as the
// core's miss buffers hold.
//
//go:noescape
func prefetch(p unsafe.Pointer)
