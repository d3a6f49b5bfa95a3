package engine

import (
	"context"

	"github.com/tokenshard/tokenshard/msg"
)

// Charge takes tokens (>= 1, else ErrInvalidCost) from key's bucket
// without a decision: for a cost known only once the work is done (the
// tokens of a completion, the bytes of a response). It is never denied for
// lack of tokens. Every band of the key is refilled to now and then loses
// tokens; a band may fall below zero, into a debt that later requests repay
// before any of them is admitted (a request is still allowed only when the
// balance covers its whole cost). A band never falls below minus its own
// capacity, its floor: a charge that would go further leaves it at the
// floor and the rest is forgiven, so one overrun locks a key out for at
// most two refills of that band. Nothing is rounded: a debt is exact in
// units.
//
// An unknown key is created full, under the key bound, then charged. The
// errors come in Allow's order, less ErrCostExceedsCapacity (tokens may
// exceed every capacity; the floor bounds the debt): ErrNotInitialized,
// ErrInvalidKey, ErrInvalidCost, ErrClosed, ErrNilContext or the context's
// error, then ErrClockRegression and ErrKeyCapacity. An error changes
// nothing.
//
// The Decision is allowed and describes the band with the fewest whole
// tokens left (ties go to the primary band, then to the bands in order):
// Remaining is floor(units / P), negative in debt; ResetAfter is the time
// to repay the debt and refill to full; RetryAfter is 0. A bucket in debt
// is not full, so it is never evicted; Snapshot keeps its debt and Restore
// brings it back; a cutover keeps it (see the package doc). It blocks and
// returns like Allow, and does not allocate.
func (e *Engine) Charge(ctx context.Context, key string, tokens int64) (Decision, error) {
	d, _, err := e.single(ctx, msg.OpCharge, key, tokens)
	return d, err
}
