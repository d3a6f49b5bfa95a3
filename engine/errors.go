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
	// ErrInvalidCost: the cost is below 1 or above the key's own capacity
	// under the policy in force (its override's, or the default).
	ErrInvalidCost = msg.ErrInvalidCost
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
	// ErrInvalidConfig: a negative Config field, or an AllowBatch out slice
	// shorter than its requests.
	ErrInvalidConfig = msg.ErrInvalidConfig
	// ErrInvalidPolicy is policy.ErrInvalid: the policy fails Validate.
	ErrInvalidPolicy = policy.ErrInvalid
)
