package engine

import (
	"time"

	"github.com/tokenshard/tokenshard/internal/decision"
)

// Decision is the answer to one admission request. An error always comes
// with the zero Decision; a denial is a Decision with Allowed false, never an
// error.
type Decision struct {
	// Allowed reports whether the cost was taken from the bucket.
	Allowed bool
	// Remaining is the whole tokens left after the decision, floored: below
	// zero for a bucket in debt (see Engine.Charge), down to minus the
	// capacity.
	Remaining int64
	// RetryAfter is 0 when allowed; when denied, the time until the bucket
	// would hold the cost at the current rate with no other callers, rounded
	// up to the nanosecond and saturated. An estimate, not a reservation.
	RetryAfter time.Duration
	// Version is the version of the policy that decided.
	Version int64
	// Limit is the capacity of the band that decided (see Band): the key's
	// own, from its override, or the policy's default.
	Limit int64
	// ResetAfter is the time until the bucket is full again, rounded up,
	// repaying any debt first; 0 when full.
	ResetAfter time.Duration
	// Band names the band that bound the decision, for a key whose limit
	// has several (see policy.BandSet): when denied, the band with the
	// longest wait (as RetryAfter reports it, saturated at math.MaxInt64,
	// so waits past 292 years tie); when allowed, the one with the fewest
	// whole tokens left; ties go to the primary band, then to the bands in
	// order.
	// Remaining, Limit and ResetAfter describe that band. The primary band
	// is named by the key's override (its Name), "" for the policy's own
	// limit: a key with one band always has Band == "" or its override's
	// Name.
	Band string
	// Degraded reports that the answer was not a bucket's: a store that
	// could not reach its backing server (engine/redisstore, with Redis
	// unreachable) answered by its failure rule, admitting (fail open) or
	// denying (fail closed) without consulting any bucket. Remaining,
	// RetryAfter and the others are then the failure rule's, not a
	// balance's, and a denial is the server's fault, not the caller's
	// limit: answer it as unavailability (HTTP 503, gRPC Unavailable), not
	// as a rate limit. It is false for every decision a bucket made, and
	// the Engine never sets it. Only the answer is the failure rule's: a
	// request whose reply the store lost (Redis hung past the deadline) may
	// still have been decided by Redis, its cost taken.
	Degraded bool
}

// set makes d the decision w that a shard (or the model) wrote: the one
// place where the shards' form of a decision (internal/decision, which
// package msg carries) becomes the public one. Decision may have fields
// that w does not, ones the engine never sets: set zeroes them, so adding
// one to Decision changes nothing here or below the engine.
// TestDecisionFields checks that every field of w's type is one of
// Decision's and is copied, and that the others are zeroed. It writes d
// field by field, in place, rather than returning a value: a struct
// returned by value is stored in words and copied out in wider loads that
// wait for those stores to retire.
func (d *Decision) set(w *decision.Decision) {
	*d = Decision{}
	d.Allowed = w.Allowed
	d.Remaining = w.Remaining
	d.RetryAfter = w.RetryAfter
	d.Version = w.Version
	d.Limit = w.Limit
	d.ResetAfter = w.ResetAfter
	d.Band = w.Band.String()
}

// Request is one admission request of a batch.
type Request struct {
	Key  string
	Cost int64
}

// Result is the answer to one Request: a Decision, or an error with the zero
// Decision.
type Result struct {
	Decision Decision
	Err      error
}
