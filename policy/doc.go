// Package policy defines what a limit means: the Policy a service configures
// and the exact fixed-point token-bucket arithmetic behind every decision.
//
// A limit refills N tokens every P nanoseconds (a Rate; TokensPerSecond n is
// N = n, P = 1s), and one of its tokens is P units, so a refill over elapsed
// ns adds exactly elapsed x N units and no rate is ever rounded. For a rate
// per second a token is UnitsPerToken (1e9) units. A balance is held as
// whole tokens plus a fraction in units: a Bucket (24 bytes, the compact
// form, for periods up to 2^32 ns) or a Level (any period). Every
// intermediate that can exceed 64 bits (capacity x P, elapsed x N) is
// computed in 128 bits with math/bits: both factors are below 2^63, so such
// a product is below 2^126; a debt's deficit, up to 2^64-2 tokens times P,
// stays below 2^127 (debt.go states each bound).
//
// A key's limit is a Shape: its primary band and the bands of a BandSet,
// decided at once by DecideLevels. A cutover carries each band over by name
// (CutoverLevels); where a band's period changes its fraction moves to the
// new unit rounding down (Level.Convert), the only rounding there is.
// A charge (Level.Charge, ChargeLevels) takes tokens without a decision and
// may leave a band in debt, down to minus its capacity; every operation
// holds for such a balance, and debt.go says why its arithmetic stays in
// range. The arithmetic uses no floating point and allocates nothing; every
// int64 capacity, rate, cost and time is legal up to math.MaxInt64. Results
// that do not fit in int64 nanoseconds saturate at math.MaxInt64, as
// documented on each function.
//
// The arithmetic is pure functions of their arguments, and time is always a
// parameter (now, in nanoseconds of some clock.Clock), never read here. The
// Limiters (TokenBucket, FixedWindow, SlidingLog) keep state between calls,
// but they too take the time from the caller.
//
// # Ownership
//
// Policy and Limit are immutable values, and so are a BandSet and an
// OverrideSet once built. A Bucket is a plain value owned by whoever holds
// it; in the engine, by exactly one shard goroutine. A Limiter has one owner
// too, who serializes its calls.
package policy
