// Package model is the sequential specification of tokenshard: the
// admission contract written in the simplest way that can be checked by eye,
// in math/big, with no sharding, no lazy conversion and no concurrency. The
// engine's behaviour suite and the stress harness compare an engine with it
// (differential replay), and the harness checks concurrent histories against
// it (linearizability).
//
// The model sits at the bottom of the import graph beside policy and clock
// (it imports only policy, internal/decision and the standard library), so
// every layer may test against it. It has its own Request, Result and
// errors, which mirror the engine's, and answers with the Decision of
// internal/decision, the one definition of a decision's fields below
// package engine, which the shards write too; package internal/enginemodel
// wraps a Model to answer in the engine's types.
//
// Besides Allow and AllowBatch it answers Peek, Refund and Charge (a cost
// taken without a decision, which may leave a band in debt down to minus
// its capacity) as the engine does, and AllowAll, the all-or-nothing decision over several keys, as one
// step: the engine's AllowAll is linearizable, so its specification is a
// single transition over every key it names.
//
// The model has one observed time for the whole engine. That equals the
// engine's per-shard observed times whenever the clock never steps back,
// which is how the harness drives it (clock.Manual); clock regressions are
// compared against an engine with one shard.
//
// # Bands and rates
//
// A key's limit is one or more bands: the primary (the Capacity and rate of
// its Policy or Override) and the bands of its BandSet. The model keeps each
// band's balance as an exact rational number of tokens (math/big.Rat): a
// band of N tokens per P ns earns elapsed x N/P tokens, up to its capacity,
// with no unit and no rounding, so its answers are the contract's by
// construction rather than by the engine's fixed-point arithmetic, which it
// never calls (it reads policy's types for configuration only). A decision
// is atomic over the bands; Remaining is floored and the waits are ceilings,
// in nanoseconds. The one rounding is at a cutover that changes a band's
// period: the balance is rounded down to a whole unit of the new period,
// 1/P tokens, as the contract requires of the engine.
//
// # Ownership
//
// A Model belongs to its caller: it is not safe for concurrent use, and
// nothing in it is shared with another Model. Clone returns an independent
// copy.
package model
