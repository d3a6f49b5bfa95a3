package engine

import (
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// Errors returned by the engine. Test for them with errors.Is: rare paths wrap
// them with the facts, while the hot path returns these very values, so a
// rejected request allocates nothing. An error always comes with the zero
// Decision.
var (
	// ErrInvalidKey: the key is blank or longer than Config.MaxKeyBytes.
	ErrInvalidKey = msg.ErrInvalidKey
	// ErrInvalidCost: the cost is below 1 (this very value), or above the
	// key's own capacity (ErrCostExceedsCapacity, which wraps it).
	ErrInvalidCost = msg.ErrInvalidCost
	// ErrCostExceedsCapacity: the cost is above the key's own capacity under
	// the policy in force (its override's, or the default; with bands, the
	// least of its bands' capacities), so no wait would ever admit it. It wraps ErrInvalidCost: errors.Is(err, ErrInvalidCost)
	// holds for it, and Stats counts it as an invalid cost.
	ErrCostExceedsCapacity = msg.ErrCostExceedsCapacity
	// ErrKeyCapacity: the key is new and Config.MaxKeys keys are tracked.
	ErrKeyCapacity = msg.ErrKeyCapacity
	// ErrStalePolicy: ReplacePolicy's expectedVersion is not the version in
	// force, or the new version is not above it.
	ErrStalePolicy = msg.ErrStalePolicy
	// ErrClockRegression: the shard's clock read earlier than a reading it
	// already acted on.
	ErrClockRegression = msg.ErrClockRegression
	// ErrClosed: the engine is closed, or closed before the request reached
	// its shard.
	ErrClosed = msg.ErrClosed
	// ErrInvalidConfig: a Config field out of its range (a negative one,
	// Shards above 65536, EventBuffer above 1<<24), or an AllowBatch out
	// slice shorter than its requests.
	ErrInvalidConfig = msg.ErrInvalidConfig
	// ErrInvalidPolicy is policy.ErrInvalid: the policy fails Validate.
	ErrInvalidPolicy = policy.ErrInvalid
	// ErrNilContext: a method was given a nil context.Context. It comes
	// where the context's own error would in each method's error order.
	ErrNilContext = msg.ErrNilContext
	// ErrNotInitialized: the Engine is the zero Engine or a nil *Engine,
	// not one made by New or Restore (an adapter's store, such as a zero
	// redisstore.Store, returns it too). It comes before every other error.
	ErrNotInitialized = msg.ErrNotInitialized
)
