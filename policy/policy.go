package policy

import "fmt"

// UnitsPerToken is the fixed-point scale of a rate per second: one token is
// 1e9 units, so a rate of r tokens per second adds exactly r units per
// nanosecond. In general one token is Per units for a Rate (see Rate).
const UnitsPerToken = 1_000_000_000

// Policy is the limit every key gets: a bucket of Capacity tokens refilled at
// TokensPerSecond, or at Refill when TokensPerSecond is 0, and with more
// bands if Bands is set; unless Overrides gives the key a limit of its own.
// It is identified by a Version that only ever increases across cutovers.
// It is a comparable value, safe to copy and share (Bands and Overrides are
// immutable and compared by reference). The zero value is invalid (Version
// 0).
//
// Exactly one of TokensPerSecond and Refill is set. TokensPerSecond n means
// exactly Refill Rate{n, time.Second}: the same decisions, bit for bit. A
// Policy is kept as it was given (the engine's Policy returns it unchanged),
// never converted from one form to the other.
type Policy struct {
	Version         int64
	Capacity        int64
	TokensPerSecond int64
	// Refill is the rate when TokensPerSecond is 0: Tokens every Per, for
	// rates that are not a whole number per second (PerMinute(100)).
	Refill Rate
	// Bands adds bands to the limit of every key that gets the policy's
	// own limit (see BandSet); nil means none. An override's limit has its
	// own Bands instead. Build it with NewBands.
	Bands *BandSet
	// Overrides gives some keys their own limits; nil means none. Build it
	// with NewOverrideSet.
	Overrides *OverrideSet
}

// Validate reports whether p can be used. A valid policy has Version and
// Capacity >= 1 and exactly one rate: TokensPerSecond >= 1, or
// TokensPerSecond 0 and a Refill with Tokens and Per >= 1. Any such int64
// is legal, up to math.MaxInt64. The error wraps ErrInvalid and names the
// first bad field. A BandSet or an OverrideSet can only be made valid (by
// NewBands and NewOverrideSet, which check every entry) or empty (by hand),
// so Bands and Overrides need no check here.
func (p Policy) Validate() error {
	if p.Version < 1 {
		return fmt.Errorf("%w: version %d, want >= 1", ErrInvalid, p.Version)
	}
	if err := p.Limit().validate(); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err)
	}
	return nil
}

// Limit returns the primary band's shape p gives a key: Capacity and the
// rate, as given.
func (p Policy) Limit() Limit {
	return Limit{Capacity: p.Capacity, TokensPerSecond: p.TokensPerSecond, Refill: p.Refill}
}

// Rate returns p's refill rate: Rate{TokensPerSecond, time.Second} when
// TokensPerSecond is set, else Refill.
func (p Policy) Rate() Rate { return p.Limit().Rate() }

// Limit is the shape of one band: at most Capacity tokens, refilled at
// TokensPerSecond, or at Refill when TokensPerSecond is 0. Bucket and Level
// functions require a valid Limit (Capacity >= 1 and exactly one rate, as
// Policy.Validate checks). It is a comparable value, safe to copy.
type Limit struct {
	Capacity        int64
	TokensPerSecond int64
	Refill          Rate
}

// Rate returns l's refill rate: Rate{TokensPerSecond, time.Second} when
// TokensPerSecond is set, else Refill.
func (l Limit) Rate() Rate {
	if l.TokensPerSecond != 0 {
		return PerSecond(l.TokensPerSecond)
	}
	return l.Refill
}

// Compact reports whether a Bucket can hold l's balance: whether its
// period, the units per token, fits the Bucket's 32-bit fraction. Every
// rate per second does; any period up to 2^32 ns (about 4.29 s) does.
func (l Limit) Compact() bool { return l.period() <= 1<<32 }

// rate returns N and P of l's rate, N tokens per P ns, as unsigned values.
func (l Limit) rate() (n, per uint64) {
	if l.TokensPerSecond != 0 {
		return uint64(l.TokensPerSecond), UnitsPerToken
	}
	return uint64(l.Refill.Tokens), uint64(l.Refill.Per)
}

// period returns P, l's units per token.
func (l Limit) period() uint64 {
	_, per := l.rate()
	return per
}

// validate checks l, naming the first bad field.
func (l Limit) validate() error {
	switch {
	case l.Capacity < 1:
		return fmt.Errorf("capacity %d, want >= 1", l.Capacity)
	case l.TokensPerSecond < 0:
		return fmt.Errorf("tokens per second %d, want >= 1", l.TokensPerSecond)
	case l.TokensPerSecond > 0 && !l.Refill.IsZero():
		return fmt.Errorf("tokens per second %d and refill %v both set, want exactly one", l.TokensPerSecond, l.Refill)
	case l.TokensPerSecond > 0:
		return nil
	case l.Refill.IsZero():
		return fmt.Errorf("tokens per second 0 and no refill, want exactly one rate")
	}
	return l.Refill.validate()
}
