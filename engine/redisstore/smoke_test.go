package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

func TestSmokeFirstExample(t *testing.T) {
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}}, clk)
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: false, RetryAfter: 500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d)
	clk.Advance(250 * time.Millisecond)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	clk.Advance(250 * time.Millisecond)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, int64(0), d.Remaining)
	// cutover: capacity 20 rate 4
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4}, 1))
	clk.Advance(250 * time.Millisecond)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed, "%+v", d)
	n, err := s.EvictFull(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, n)
	clk.Advance(10 * time.Second)
	n, err = s.EvictFull(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
