// Package enginemodel is the sequential model of package internal/model
// answering in the engine's types: engine.Decision, engine.Request,
// engine.Result and the engine's error values. It is the one place where the
// model's types meet the engine's, shared by everything that compares an
// engine.Admitter with the model: the behaviour suite (engine/admissiontest),
// the engine's own tests and the stress harness.
//
// The model itself imports nothing above policy; this package sits above
// engine, beside engine/admissiontest (a package below engine importing it
// would be an import cycle).
//
// # Ownership
//
// A Model belongs to its caller, as the model it wraps does: it is not safe
// for concurrent use, and Clone returns an independent copy.
package enginemodel

import (
	"errors"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// Model is a model.Model whose answers are the engine's types. The zero
// Model is not usable (New makes one); a Model must not be copied, as Clone
// exists for that.
type Model struct {
	m *model.Model
}

// New returns an empty model serving p, tracking at most maxKeys keys of at
// most maxKeyBytes bytes; zero bounds take the engine's defaults.
func New(p policy.Policy, maxKeys, maxKeyBytes int) *Model {
	return &Model{m: model.New(p, maxKeys, maxKeyBytes)}
}

// Clone returns a deep copy.
func (m *Model) Clone() *Model { return &Model{m: m.m.Clone()} }

// Policy returns the policy in force.
func (m *Model) Policy() policy.Policy { return m.m.Policy() }

// KeyCount returns the number of tracked keys.
func (m *Model) KeyCount() int { return m.m.KeyCount() }

// Keys returns the tracked keys, in no particular order.
func (m *Model) Keys() []string { return m.m.Keys() }

// Bucket returns key's bucket as last stored (not refilled), and whether the
// key is tracked. The Units are a copy.
func (m *Model) Bucket(key string) (model.Bucket, bool) { return m.m.Bucket(key) }

// Allow decides one request at now, as model.Model.Allow does.
func (m *Model) Allow(now int64, key string, cost int64) (engine.Decision, error) {
	d, err := m.m.Allow(now, key, cost)
	return decisionOf(d), engineErr(err)
}

// AllowBatch decides reqs at now, as model.Model.AllowBatch does.
func (m *Model) AllowBatch(now int64, reqs []engine.Request) []engine.Result {
	in := make([]model.Request, len(reqs))
	for i, r := range reqs {
		in[i] = model.Request(r)
	}
	out := make([]engine.Result, len(reqs))
	for i, r := range m.m.AllowBatch(now, in) {
		out[i] = engine.Result{Decision: decisionOf(r.Decision), Err: engineErr(r.Err)}
	}
	return out
}

// AllowAll decides reqs as one at now, as model.Model.AllowAll does: the
// binding request's Decision, its index, or an error with the index of the
// request at fault (-1 for none).
func (m *Model) AllowAll(now int64, reqs []engine.Request) (engine.Decision, int, error) {
	in := make([]model.Request, len(reqs))
	for i, r := range reqs {
		in[i] = model.Request(r)
	}
	d, at, err := m.m.AllowAll(now, in)
	return decisionOf(d), at, engineErr(err)
}

// Peek answers a request of one token for key at now, taking nothing, as
// model.Model.Peek does.
func (m *Model) Peek(now int64, key string) (engine.Decision, error) {
	d, err := m.m.Peek(now, key)
	return decisionOf(d), engineErr(err)
}

// Refund credits tokens back to key at now, as model.Model.Refund does.
func (m *Model) Refund(now int64, key string, tokens int64) (engine.Decision, error) {
	d, err := m.m.Refund(now, key, tokens)
	return decisionOf(d), engineErr(err)
}

// Charge takes tokens from key at now without a decision, as
// model.Model.Charge does.
func (m *Model) Charge(now int64, key string, tokens int64) (engine.Decision, error) {
	d, err := m.m.Charge(now, key, tokens)
	return decisionOf(d), engineErr(err)
}

// EvictIfFull removes key's bucket if it is full at now, as
// model.Model.EvictIfFull does.
func (m *Model) EvictIfFull(now int64, key string) (bool, error) {
	ok, err := m.m.EvictIfFull(now, key)
	return ok, engineErr(err)
}

// EvictFull removes every bucket that is full at now, as
// model.Model.EvictFull does.
func (m *Model) EvictFull(now int64) (int, error) {
	n, err := m.m.EvictFull(now)
	return n, engineErr(err)
}

// ReplacePolicy cuts over to next at now, as model.Model.ReplacePolicy does.
func (m *Model) ReplacePolicy(now int64, next policy.Policy, expectedVersion int64) error {
	return engineErr(m.m.ReplacePolicy(now, next, expectedVersion))
}

// errPairs pairs each of the model's errors with the engine's of the same
// name. ErrCostExceedsCapacity comes before ErrInvalidCost, which it wraps.
var errPairs = [...]struct{ model, engine error }{
	{model.ErrInvalidKey, engine.ErrInvalidKey},
	{model.ErrCostExceedsCapacity, engine.ErrCostExceedsCapacity},
	{model.ErrInvalidCost, engine.ErrInvalidCost},
	{model.ErrKeyCapacity, engine.ErrKeyCapacity},
	{model.ErrStalePolicy, engine.ErrStalePolicy},
	{model.ErrClockRegression, engine.ErrClockRegression},
	{model.ErrAllowAllSize, engine.ErrAllowAllSize},
}

// engineErr returns the engine's error for the model's err. Any other error
// (nil, or policy's Validate error, which both already share) is returned
// as it is.
func engineErr(err error) error {
	if err == nil {
		return nil
	}
	for _, p := range errPairs {
		if errors.Is(err, p.model) {
			return p.engine
		}
	}
	return err
}

// decisionOf is the model's decision d as an engine.Decision: the one place
// this package converts one, field by field, so a field engine.Decision has
// and the model does not (one the engine never sets either) stays zero
// without a change here. TestDecisionOf checks that every field of d is
// copied.
func decisionOf(d model.Decision) engine.Decision {
	return engine.Decision{
		Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter, Version: d.Version,
		Limit: d.Limit, ResetAfter: d.ResetAfter, Band: d.Band.String(),
	}
}
