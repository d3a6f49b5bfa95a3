//go:build !purego

// This file lets hash_runtime.go declare memhash without a body:
// go:linkname gives it runtime.memhash's.
