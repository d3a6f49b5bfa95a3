package model

import "time"

// Decision is the model's answer to one admission request. Its fields are
// the engine's Decision's, in the same order and with the same meaning, so
// a caller converts one to the other with a plain type conversion; an
// error always comes with the zero Decision, and a denial is a Decision
// with Allowed false, never an error. A Decision is a plain value: copy it
// freely.
type Decision struct {
	// Allowed reports whether the cost was taken from every band.
	Allowed bool
	// Remaining is the whole tokens left in the binding band after the
	// decision, floored.
	Remaining int64
	// RetryAfter is 0 when allowed; when denied, the time until every band
	// would hold the cost at its current rate (the binding band's wait,
	// the longest), rounded up to the nanosecond and saturated.
	RetryAfter time.Duration
	// Version is the version of the policy that decided.
	Version int64
	// Limit is the capacity of the binding band of the limit that decided:
	// the key's own, from its override, or the policy's default.
	Limit int64
	// ResetAfter is the time until the binding band is full again, rounded
	// up and saturated; 0 when full.
	ResetAfter time.Duration
	// Band names the binding band: on a denial the band with the longest
	// wait, when allowed the one with the fewest whole tokens left, ties
	// going to the primary band, then to the bands in order. The primary
	// band's name is its override's Name, or "" for the policy's own.
	Band string
}

// Request is one request of a batch.
type Request struct {
	Key  string
	Cost int64
}

// Result is the answer to one Request: a Decision, or an error with the
// zero Decision.
type Result struct {
	Decision Decision
	Err      error
}
