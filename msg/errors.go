package msg

import (
	"errors"
	"fmt"
)

// The errors a shard or the engine can answer with. They live here, at the
// bottom of the import graph, so a shard can return the very values the
// engine exports (engine.ErrKeyCapacity == msg.ErrKeyCapacity) without
// importing it. They are preallocated: rejecting a request allocates nothing.
// They are internal to tokenshard: package engine exports each of them under
// its own name, and only engine and shard use these.
var (
	ErrInvalidKey      = errors.New("engine: invalid key")
	ErrInvalidCost     = errors.New("engine: invalid cost")
	ErrKeyCapacity     = errors.New("engine: key capacity reached")
	ErrStalePolicy     = errors.New("engine: stale policy")
	ErrClockRegression = errors.New("engine: clock went backwards")
	ErrClosed          = errors.New("engine: closed")
	ErrInvalidConfig   = errors.New("engine: invalid config")
	ErrNilContext      = errors.New("engine: nil context")
	// ErrNotInitialized names no type: a zero redisstore.Store returns it
	// too, and its user never made an Engine.
	ErrNotInitialized = errors.New("engine: used before it was created by New: a zero value or a nil pointer")

	// ErrCostExceedsCapacity wraps ErrInvalidCost, so errors.Is matches it
	// to both; made once here, so returning it allocates nothing either.
	ErrCostExceedsCapacity = fmt.Errorf("%w: cost exceeds the key's capacity", ErrInvalidCost)
)
