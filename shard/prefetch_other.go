//go:build !(amd64 || arm64) || purego

package shard

import "unsafe"

// canPrefetch reports whether prefetch does anything on this build: not on
// this architecture, or with the purego tag, so no batch is warmed.
const canPrefetch = false

func prefetch(unsafe.Pointer) {}
