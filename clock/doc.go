// Package clock provides the time sources tokenshard reads: Monotonic for
// production and Manual for tests.
//
// A Clock reports nanoseconds since its own origin as an int64 that never
// goes below zero. The engine decides only at readings taken inside the
// goroutine that owns the state being decided, one per message, so a decision
// and the time it was made at always belong together; it reads the clock
// elsewhere only to schedule (background sweeps, Wait's sleeps).
//
// # Ownership
//
// Monotonic is immutable after construction. Manual's reading is one atomic
// value: any goroutine may read or move it.
package clock
