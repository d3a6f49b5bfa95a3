package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestPeekRefundPlain: on a plain key, Peek answers a request of one token
// and takes nothing; Refund credits exactly, capped, keeps the fraction,
// and creates nothing; both bring a bucket across a cutover it missed,
// and Peek writes nothing even then.
func TestPeekRefundPlain(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	cfg := redisstore.Config{Client: c, Prefix: prefix(t), Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}}
	s := newStore(t, cfg, clk)
	v1 := cfg.Policy

	d, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d, "an unknown key is full")
	d, err = s.Refund(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d, "refunding an unknown key")
	n, err := s.KeyCount(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "Peek and Refund created a bucket")

	_, err = s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	clk.Set(250 * time.Millisecond.Nanoseconds()) // half a token
	d, err = s.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, engine.Decision{RetryAfter: 250 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 4750 * time.Millisecond}, d)
	d, err = s.Refund(ctx, "k", 3)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 3, Version: 1, Limit: 10, ResetAfter: 3250 * time.Millisecond}, d,
		"3 tokens and the half token kept")
	d, err = s.Refund(ctx, "k", 1<<62)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d, "capped at the capacity")

	_, err = s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	// A cutover that lengthens no time-to-full, a debt's included, so that
	// no pass brings the buckets up to version 2.
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 2, Refill: policy.PerMinute(60)}, v1.Version))
	clk.Set(time.Second.Nanoseconds())
	before, err := c.Get(ctx, redisstore.BucketKey(cfg.Prefix, "k")).Result()
	require.NoError(t, err)
	d, err = s.Peek(ctx, "k")
	require.NoError(t, err)
	// 0.75s under v2 at 1 per second on top of nothing at 0.25s (emptied
	// then): 0.75 of a token, one token of 6e10 units.
	require.Equal(t, engine.Decision{RetryAfter: 250 * time.Millisecond, Version: 2, Limit: 2, ResetAfter: 1250 * time.Millisecond}, d)
	after, err := c.Get(ctx, redisstore.BucketKey(cfg.Prefix, "k")).Result()
	require.NoError(t, err)
	require.Equal(t, before, after, "a peek across a cutover wrote the bucket")
	require.Equal(t, "1", strings.Fields(redisstore.DecimalBucket(after))[2], "still written under version 1")
}

// TestPeekRefundErrors: the errors come in Allow's order, and when Redis
// cannot answer they are an error wrapping ErrUnavailable, never a
// fail-open or fail-closed answer.
func TestPeekRefundErrors(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	ctx := context.Background()
	srv := startPrivate(t)
	s := realStores(t, srv.Addr(), 1, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
		FailOpen: true, Timeout: 200 * time.Millisecond})[0]
	_, err := s.Peek(ctx, " ")
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	_, err = s.Refund(ctx, " ", 0)
	require.ErrorIs(t, err, engine.ErrInvalidKey, "the key first")
	_, err = s.Refund(ctx, "k", 0)
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	_, err = s.Peek(nilCtx, "k")
	require.ErrorIs(t, err, engine.ErrNilContext)
	_, err = s.Refund(nilCtx, "k", 1)
	require.ErrorIs(t, err, engine.ErrNilContext)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Peek(canceled, "k")
	require.ErrorIs(t, err, context.Canceled)

	srv.Kill()
	d, err := s.Peek(ctx, "k")
	require.ErrorIs(t, err, redisstore.ErrUnavailable, "Peek with Redis down")
	require.Zero(t, d)
	d, err = s.Refund(ctx, "k", 1)
	require.ErrorIs(t, err, redisstore.ErrUnavailable, "Refund with Redis down")
	require.Zero(t, d)
	require.Zero(t, s.Stats().Failures, "no fail-open answer was given")

	require.NoError(t, s.Close())
	_, err = s.Peek(nilCtx, "k")
	require.ErrorIs(t, err, engine.ErrClosed)
	_, err = s.Refund(ctx, "k", 1)
	require.ErrorIs(t, err, engine.ErrClosed)
}

// TestFailureCostAboveBandCapacity: a cost above the capacity of any band
// of the key is refused without Redis, so an outage does not turn it into
// a fail-open admission; a cost every band holds gets the failure rule,
// described by the primary band.
func TestFailureCostAboveBandCapacity(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	bands, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 3, Refill: policy.PerDay(3)})
	require.NoError(t, err)
	over, err := policy.NewOverrideSet(policy.Override{Match: "gold", Name: "gold", Capacity: 50, Refill: policy.PerMinute(50)})
	require.NoError(t, err)
	s := realStores(t, srv.Addr(), 1, redisstore.Config{
		Policy:   policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Bands: bands, Overrides: over},
		FailOpen: true, Timeout: 200 * time.Millisecond,
	})[0]
	srv.Kill()
	_, err = s.Allow(context.Background(), "k", 4)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	d, err := s.Allow(context.Background(), "k", 3)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 10, Degraded: true}, d)
	d, err = s.Allow(context.Background(), "gold", 50)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 50, Band: "gold", Degraded: true}, d)
}

// TestRefundLandingOnCapacityDropsFraction: a refund that brings a
// compact bucket to exactly its capacity in whole tokens, with a fraction
// of a token on top, is capped: the fraction is dropped, never kept above
// full (where a drain at the same instant would keep it as credit).
func TestRefundLandingOnCapacityDropsFraction(t *testing.T) {
	exactBalances(t)
	ctx := context.Background()
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}}, clk)
	d, err := s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	clk.Set(250 * time.Millisecond.Nanoseconds()) // half a token
	d, err = s.Refund(ctx, "k", 10)               // 10.5 tokens, capped at 10
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d, "capped at the capacity")
	d, err = s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, 5*time.Second, d.ResetAfter, "empty: 10 tokens at 2/s")
	clk.Set(500 * time.Millisecond.Nanoseconds()) // half a token since the drain
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{RetryAfter: 250 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 4750 * time.Millisecond}, d,
		"half a token refilled since the drain; the refund's fraction above full was not kept")
}
