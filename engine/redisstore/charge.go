package redisstore

import (
	"context"

	"github.com/tokenshard/tokenshard/engine"
)

// modeCharge is the script's mode of a Charge: bring the bucket up to date,
// then take the tokens from every band, each down to minus its capacity.
const modeCharge = "d"

// Charge takes tokens (>= 1, else engine.ErrInvalidCost) from key without
// a decision, with the meaning of engine.Engine.Charge: every band of the
// key's bucket is brought up to the server's TIME and loses tokens, down
// to minus its own capacity at most (the rest is forgiven), so a charge is
// never denied and may leave the key in debt, which later requests repay
// before any of them is admitted. Nothing is rounded. A key not in Redis
// is created full, then charged. Its errors are Allow's but
// engine.ErrCostExceedsCapacity: tokens may exceed every capacity; a Redis
// out of memory is engine.ErrKeyCapacity.
//
// The Decision is allowed and describes the band with the fewest whole
// tokens left (ties to the primary, then the bands in order): Remaining
// may be negative, ResetAfter is the time to repay the debt and refill to
// full. A bucket in debt is not full: EvictFull keeps it, and its expiry
// covers the repayment and the refill. Stats counts a charge as Allowed, as
// the engine does.
//
// If Redis cannot answer by the context's deadline (or Config.Timeout, if
// sooner), the charge cannot be known to be taken: whatever the fail-open
// or fail-closed rule, the answer is allowed (a charge is never denied),
// with nothing Remaining, marked engine.Decision.Degraded, and the error
// is nil; Config.OnError is told and Stats counts it under Failures and
// DegradedAllowed. A charge whose answer is lost may or may not have been
// taken; it is never taken twice. The context's error is returned only if
// it is done before the call starts, or canceled during it. With
// Config.Leases, the key's lease goes back to Redis before the charge, and
// is given up if Redis does not take it: a charge during an outage ends
// this process's lease on the key (see the package doc's Leases section).
func (s *Store) Charge(ctx context.Context, key string, tokens int64) (engine.Decision, error) {
	return s.one(ctx, modeCharge, key, tokens)
}
