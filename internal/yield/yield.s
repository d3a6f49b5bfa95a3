//go:build !purego

// This file lets yield.go declare Local without a body: go:linkname gives
// it runtime.goyield's.
