package model

import "time"

// Decision is the model's answer to one admission request. Its fields are
// the engine's Decision's, in the same order and with the same meaning, so
// a caller converts one to the other with a plain type conversion; an
// error always comes with the zero Decision, and a denial is a Decision
// with Allowed false, never an error. A Decision is a plain value: copy it
// freely.
type Decision struct {
	// Allowed reports whether the cost was taken from the bucket.
	Allowed bool
	// Remaining is the whole tokens left after the decision, floored.
	Remaining int64
	// RetryAfter is 0 when allowed; when denied, the time until the bucket
	// would hold the cost at the current rate, rounded up to the nanosecond
	// and saturated.
	RetryAfter time.Duration
	// Version is the version of the policy that decided.
	Version int64
	// Limit is the capacity of the limit that decided: the key's own, from
	// its override, or the policy's default.
	Limit int64
	// ResetAfter is the time until the bucket is full again, rounded up and
	// saturated; 0 when full.
	ResetAfter time.Duration
	// Band names the binding band, as the engine's does.
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
