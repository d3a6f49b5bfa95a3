// Package model is the sequential specification of tokenshard: the
// admission contract written in the simplest way that can be checked by eye,
// in math/big, with no sharding, no lazy conversion and no concurrency. The
// engine's behaviour suite and the stress harness compare an engine with it
// (differential replay), and the harness checks concurrent histories against
// it (linearizability).
//
// The model sits at the bottom of the import graph beside policy and clock
// (it imports only policy and the standard library), so every layer may
// test against it. It has its own Decision, Request, Result and
// errors, which mirror the engine's; package internal/enginemodel wraps a
// Model to answer in the engine's types.
//
// The model has one observed time for the whole engine. That equals the
// engine's per-shard observed times whenever the clock never steps back,
// which is how the harness drives it (clock.Manual); clock regressions are
// compared against an engine with one shard.
//
// # Ownership
//
// A Model belongs to its caller: it is not safe for concurrent use, and
// nothing in it is shared with another Model. Clone returns an independent
// copy.
package model
