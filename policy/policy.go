package policy

import "fmt"

// UnitsPerToken is the fixed-point scale: one token is 1e9 units, so a rate
// of r tokens per second adds exactly r units per nanosecond.
const UnitsPerToken = 1_000_000_000

// Policy is the limit every key gets: a bucket of Capacity tokens refilled at
// TokensPerSecond, unless Overrides gives the key a limit of its own,
// identified by a Version that only ever increases across cutovers. It is a
// comparable value, safe to copy and share (Overrides is immutable and
// compared by reference). The zero value is invalid (Version 0).
type Policy struct {
	Version         int64
	Capacity        int64
	TokensPerSecond int64
	// Overrides gives some keys their own limits; nil means none. Build it
	// with NewOverrideSet.
	Overrides *OverrideSet
}

// Validate reports whether p can be used. A valid policy has Version,
// Capacity and TokensPerSecond all >= 1; any such int64 is legal, up to
// math.MaxInt64. The error wraps ErrInvalid and names the first bad field.
// An OverrideSet can only be made valid (by NewOverrideSet, which checks
// every entry) or empty (by hand), so Overrides needs no check here.
func (p Policy) Validate() error {
	switch {
	case p.Version < 1:
		return fmt.Errorf("%w: version %d, want >= 1", ErrInvalid, p.Version)
	case p.Capacity < 1:
		return fmt.Errorf("%w: capacity %d, want >= 1", ErrInvalid, p.Capacity)
	case p.TokensPerSecond < 1:
		return fmt.Errorf("%w: tokens per second %d, want >= 1", ErrInvalid, p.TokensPerSecond)
	}
	return nil
}

// Limit returns the bucket shape p gives a key.
func (p Policy) Limit() Limit {
	return Limit{Capacity: p.Capacity, TokensPerSecond: p.TokensPerSecond}
}

// Limit is the shape of one bucket: at most Capacity tokens, refilled at
// TokensPerSecond. Bucket functions require both to be >= 1 (a valid Policy
// guarantees it). It is a comparable value, safe to copy.
type Limit struct {
	Capacity        int64
	TokensPerSecond int64
}
