package engine

import (
	"context"

	"github.com/tokenshard/tokenshard/policy"
)

// Admitter is what every tokenshard admission backend offers with the same
// meaning: the in-process Engine, and the Redis store (package
// engine/redisstore) that shares one quota per key across processes. Code
// written against Admitter (middleware, a service's own handlers) runs on
// either; engine/admissiontest is the behaviour suite both pass.
//
// KeyCount is not part of it: the Engine's is exact and never blocks, while a
// store's needs a round trip and can only be approximate.
//
// AllowAll decides 1 to MaxAllowAll requests as one, all or nothing across
// their keys, with the binding request's Decision and its index, and the
// errors in the order Engine.AllowAll gives them. An implementation states
// how it answers when it cannot decide (the Redis store's fail-open or
// fail-closed rule); whatever it answers, it never takes from some keys of
// the call and not others. On every implementation, an AllowAll is starved
// under saturation by Allows and AllowBatches on its keys: it needs every
// key's cost at one instant, and they take each token as it refills (in an
// adversarial run of 48 goroutines, half of them calling Allow, 0.02% of the
// AllowAlls were admitted, and under 1% in every run since). Where its share
// matters, send every request for those keys through AllowAll, each with all
// the keys it is limited by (see Engine.AllowAll).
//
// Charge and Refund settle a cost known only once the work is done: Charge
// takes tokens without a decision, into a debt bounded by each band's
// floor, and Refund gives back an over-estimate, capped at the capacity
// (see Engine.Charge and Engine.Refund: a refund late enough for the bucket
// to have refilled gives back tokens the refill already restored).
type Admitter interface {
	Allow(ctx context.Context, key string, cost int64) (Decision, error)
	AllowBatch(ctx context.Context, reqs []Request, out []Result) error
	AllowAll(ctx context.Context, reqs []Request) (Decision, int, error)
	// Charge takes tokens from key without a decision, into debt if need
	// be, each band down to minus its capacity (see Engine.Charge).
	Charge(ctx context.Context, key string, tokens int64) (Decision, error)
	// Refund credits tokens back to key, each band capped at its capacity
	// (see Engine.Refund).
	Refund(ctx context.Context, key string, tokens int64) (Decision, error)
	EvictFull(ctx context.Context) (int, error)
	ReplacePolicy(ctx context.Context, next policy.Policy, expectedVersion int64) error
	Policy() policy.Policy
	Close() error
}

var _ Admitter = (*Engine)(nil)
