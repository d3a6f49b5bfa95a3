package redisstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// nilCtx is the nil context these tests pass on purpose. A variable, not
// the literal, so that staticcheck (SA1012) keeps flagging real code.
var nilCtx context.Context

// TestNilContextLeased is TestNilContext on a store with leases, whose
// calls take another path to the same answers.
func TestNilContextLeased(t *testing.T) {
	defer func(was bool) { leaseMode = was }(leaseMode)
	leaseMode = true
	TestNilContext(t)
}

// TestNilContext: every call that takes a context answers a nil one with
// engine.ErrNilContext, after the checks that need no context and after
// engine.ErrClosed, without reaching Redis and changing nothing.
func TestNilContext(t *testing.T) {
	_, err := redisstore.New(nilCtx, redisstore.Config{})
	require.ErrorIs(t, err, engine.ErrNilContext, "New")

	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Policy: p}, &setClock{})

	d, err := s.Allow(nilCtx, "k", 1)
	require.ErrorIs(t, err, engine.ErrNilContext, "Allow")
	require.Zero(t, d)
	_, err = s.Allow(nilCtx, " ", 1)
	require.ErrorIs(t, err, engine.ErrInvalidKey, "Allow: the key is checked first")
	_, err = s.Allow(nilCtx, "k", 0)
	require.ErrorIs(t, err, engine.ErrInvalidCost, "Allow: the cost is checked first")

	reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "", Cost: 1}, {Key: "k", Cost: -1}}
	out := make([]engine.Result, len(reqs))
	require.ErrorIs(t, s.AllowBatch(nilCtx, reqs, out), engine.ErrNilContext, "AllowBatch")
	for i, want := range []error{engine.ErrNilContext, engine.ErrInvalidKey, engine.ErrInvalidCost} {
		require.ErrorIs(t, out[i].Err, want, "AllowBatch: out[%d]", i)
		require.Zero(t, out[i].Decision, "AllowBatch: out[%d]", i)
	}

	n, err := s.EvictFull(nilCtx)
	require.ErrorIs(t, err, engine.ErrNilContext, "EvictFull")
	require.Zero(t, n)
	require.ErrorIs(t, s.ReplacePolicy(nilCtx, policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1),
		engine.ErrNilContext, "ReplacePolicy")
	require.ErrorIs(t, s.ReplacePolicy(nilCtx, policy.Policy{}, 1), engine.ErrInvalidPolicy,
		"ReplacePolicy: the policy is checked first")
	n, err = s.KeyCount(nilCtx)
	require.ErrorIs(t, err, engine.ErrNilContext, "KeyCount")
	require.Zero(t, n)

	n, err = s.KeyCount(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "no call with a nil context made a bucket")
	require.Equal(t, p, s.Policy(), "no call with a nil context changed the policy")

	require.NoError(t, s.Close())
	_, err = s.Allow(nilCtx, "k", 1)
	require.ErrorIs(t, err, engine.ErrClosed, "Allow after Close")
	require.ErrorIs(t, s.AllowBatch(nilCtx, reqs, out), engine.ErrClosed, "AllowBatch after Close")
	_, err = s.EvictFull(nilCtx)
	require.ErrorIs(t, err, engine.ErrClosed, "EvictFull after Close")
	require.ErrorIs(t, s.ReplacePolicy(nilCtx, policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1),
		engine.ErrClosed, "ReplacePolicy after Close")
	n, err = s.KeyCount(context.Background())
	require.NoError(t, err, "KeyCount keeps answering after Close, as the engine's does")
	require.Zero(t, n)
}

// TestZeroStore: a zero Store, and the nil *Store a New that failed
// returns, answer every call with engine.ErrNotInitialized, as a zero
// engine.Engine does, and never panic.
func TestZeroStore(t *testing.T) {
	ctx := context.Background()
	reqs := []engine.Request{{Key: "k", Cost: 1}}
	for _, s := range []*redisstore.Store{{}, nil} {
		_, err := s.Allow(ctx, "k", 1)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		_, err = s.Charge(ctx, "k", 1)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		// The store's user made no Engine: the message must not send them
		// looking for one.
		require.NotContains(t, err.Error(), "Engine", "a zero Store's error names the type its user has not got")
		_, err = s.Peek(ctx, "k")
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		_, err = s.Refund(ctx, "k", 1)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		_, err = s.Wait(ctx, "k", 1)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		require.ErrorIs(t, s.AllowBatch(ctx, reqs, make([]engine.Result, 1)), engine.ErrNotInitialized)
		// out may hold an earlier batch's answers: each is overwritten with
		// the error, as a zero engine.Engine does, so none reads as admitted.
		out := []engine.Result{{Decision: engine.Decision{Allowed: true, Remaining: 3, Version: 1, Limit: 5}}}
		require.ErrorIs(t, s.AllowBatch(ctx, reqs, out), engine.ErrNotInitialized)
		require.Equal(t, []engine.Result{{Err: engine.ErrNotInitialized}}, out, "AllowBatch on a zero Store writes its error into out")
		two := []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}}
		out = []engine.Result{{Decision: engine.Decision{Allowed: true}}} // short: the room it has
		require.ErrorIs(t, s.AllowBatch(ctx, two, out), engine.ErrNotInitialized)
		require.Equal(t, []engine.Result{{Err: engine.ErrNotInitialized}}, out, "AllowBatch on a zero Store, out short")
		_, at, err := s.AllowAll(ctx, reqs)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		require.Equal(t, -1, at)
		require.ErrorIs(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 1), engine.ErrNotInitialized)
		_, err = s.EvictFull(ctx)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		_, err = s.KeyCount(ctx)
		require.ErrorIs(t, err, engine.ErrNotInitialized)
		require.Zero(t, s.Policy())
		require.Zero(t, s.Stats())
		require.NoError(t, s.Close())
	}
}

// TestAllowBatchShortOut: an out shorter than reqs is the engine's error,
// in the engine's words (how many of each), and nothing is decided.
func TestAllowBatchShortOut(t *testing.T) {
	ctx := context.Background()
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Policy: p}, clock.NewManual(1))
	e, err := engine.New(engine.Config{Policy: p})
	require.NoError(t, err)
	defer func() { _ = e.Close() }()

	reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}}
	want := e.AllowBatch(ctx, reqs, make([]engine.Result, 1))
	err = s.AllowBatch(ctx, reqs, make([]engine.Result, 1))
	require.ErrorIs(t, err, engine.ErrInvalidConfig)
	require.EqualError(t, err, want.Error(), "the engine's message, which says the lengths")
	n, err := s.KeyCount(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing decided")
}
