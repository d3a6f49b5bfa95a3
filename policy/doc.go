// Package policy defines what a limit means: the Policy a service configures
// and the exact fixed-point token-bucket arithmetic behind every decision.
//
// One token is UnitsPerToken (1e9) units. A bucket's balance is held as whole
// tokens plus a fraction in units, so a Bucket is 24 bytes, and every
// intermediate that can exceed 64 bits (capacity x 1e9, elapsed x rate) is
// computed in 128 bits with math/bits. There is no floating point and no
// allocation here; every int64 capacity, rate, cost and time is legal up to
// math.MaxInt64. Results that do not fit in int64 nanoseconds saturate at
// math.MaxInt64, as documented on each function.
//
// Everything in this package is a pure function of its arguments: time is a
// parameter (now, in nanoseconds of some clock.Clock), never read here.
//
// # Ownership
//
// Policy and Limit are immutable values. A Bucket is a plain value owned by
// whoever holds it; in the engine, by exactly one shard goroutine.
package policy
