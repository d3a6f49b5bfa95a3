package model

import (
	"errors"
	"fmt"
)

// Errors the model answers with. They are the model's own, so the model
// imports nothing above policy; a caller comparing it with an engine maps
// each to the engine's error of the same name. Test for them with
// errors.Is. An error always comes with the zero Decision.
var (
	// ErrInvalidKey: the key is blank or longer than the model's key
	// length bound.
	ErrInvalidKey = errors.New("model: invalid key")
	// ErrInvalidCost: the cost is below 1 (this very value), or above the
	// capacity of a band of the key's own limit (ErrCostExceedsCapacity,
	// which wraps it).
	ErrInvalidCost = errors.New("model: invalid cost")
	// ErrCostExceedsCapacity: the cost is above the capacity of some band
	// of the key's own limit under the policy in force (no wait could ever
	// admit it). It wraps ErrInvalidCost.
	ErrCostExceedsCapacity = fmt.Errorf("%w: cost exceeds the key's capacity", ErrInvalidCost)
	// ErrKeyCapacity: the key is new and the model tracks its bound of keys.
	ErrKeyCapacity = errors.New("model: key capacity reached")
	// ErrStalePolicy: ReplacePolicy's expectedVersion is not the version in
	// force, or the new version is not above it.
	ErrStalePolicy = errors.New("model: stale policy")
	// ErrClockRegression: the reading is earlier than one a successful
	// operation already observed.
	ErrClockRegression = errors.New("model: clock went backwards")
	// ErrAllowAllSize: AllowAll was given no requests, or more than
	// MaxAllowAll.
	ErrAllowAllSize = errors.New("model: AllowAll takes 1 to MaxAllowAll requests")
)
