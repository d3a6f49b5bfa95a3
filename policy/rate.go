package policy

import (
	"fmt"
	"math/bits"
	"time"
)

// Rate is a refill rate: Tokens tokens every Per, added continuously (a
// fraction of a token every nanosecond), not in steps. Both are >= 1; every
// such int64 is legal, up to math.MaxInt64 tokens per 1ns or 1 token per
// math.MaxInt64 ns. The zero Rate means "not set".
//
// One token of a band whose rate has period Per is Per units (Per in ns), so
// a refill over elapsed ns adds exactly elapsed x Tokens units: no rate is
// rounded, 100 per minute no more than 7 per 3 seconds. A rate of n per
// second is therefore the 1e9-unit scheme of UnitsPerToken.
//
// Per is the period as written, not reduced: a band whose Per is above 2^32
// ns (about 4.29 s) keeps its balance in the general form (Limit.Compact),
// which costs the engine about half as much again per decision in a batch.
// The same rate written with a shorter period decides alike (but for where
// a cutover to another period rounds): Rate{5, 3 * time.Second} is
// PerMinute(100) in the compact form.
type Rate struct {
	Tokens int64
	Per    time.Duration
}

// PerSecond returns a Rate of n tokens per second.
func PerSecond(n int64) Rate { return Rate{Tokens: n, Per: time.Second} }

// PerMinute returns a Rate of n tokens per minute.
func PerMinute(n int64) Rate { return Rate{Tokens: n, Per: time.Minute} }

// PerHour returns a Rate of n tokens per hour.
func PerHour(n int64) Rate { return Rate{Tokens: n, Per: time.Hour} }

// PerDay returns a Rate of n tokens per day (24 hours).
func PerDay(n int64) Rate { return Rate{Tokens: n, Per: 24 * time.Hour} }

// IsZero reports whether r is the zero Rate, the one that means "not set".
func (r Rate) IsZero() bool { return r == Rate{} }

// String formats r as tokens per period, "100/1m0s".
func (r Rate) String() string { return fmt.Sprintf("%d/%v", r.Tokens, r.Per) }

// validate checks a set rate.
func (r Rate) validate() error {
	switch {
	case r.Tokens < 1:
		return fmt.Errorf("refill tokens %d, want >= 1", r.Tokens)
	case r.Per < 1:
		return fmt.Errorf("refill period %v, want >= 1ns", r.Per)
	}
	return nil
}

// WindowSeconds returns the seconds this rate takes to refill capacity
// tokens from empty, rounded up: ceil(capacity x Per / Tokens / 1e9),
// saturated at math.MaxInt64. It is the "w" of an IETF RateLimit-Policy
// header for a band of that capacity. It requires a set rate and capacity >=
// 1.
func (r Rate) WindowSeconds(capacity int64) int64 {
	hi, lo := bits.Mul64(uint64(capacity), uint64(r.Per))
	// ceil(x / (Tokens*1e9)) in two steps, each exact: ceil(ceil(x/a)/b)
	// == ceil(x/(a*b)) for positive integers.
	qhi, qlo := ceilDiv128(hi, lo, uint64(r.Tokens))
	return ceilDiv(qhi, qlo, UnitsPerToken) // saturates
}

// ceilDiv128 returns ceil((hi<<64 | lo) / d) for d >= 1 as a 128-bit value.
func ceilDiv128(hi, lo, d uint64) (uint64, uint64) {
	qhi := hi / d
	qlo, r := bits.Div64(hi%d, lo, d)
	if r != 0 {
		var c uint64
		qlo, c = bits.Add64(qlo, 1, 0)
		qhi += c
	}
	return qhi, qlo
}
