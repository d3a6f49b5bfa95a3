package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseRefundEndsKeptDenial: a denial Redis gave is kept in the
// process until its RetryAfter, but a Refund goes to Redis and ends it: the
// bucket then holds the refunded tokens, and the same request, at the same
// instant, is admitted.
func TestLeaseRefundEndsKeptDenial(t *testing.T) {
	clk := clock.NewManual(0)
	s := leased(t, policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, clk, prefix(t))
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Second, d.RetryAfter)
	r, err := s.Refund(ctx, "k", 5)
	require.NoError(t, err)
	require.Equal(t, int64(5), r.Remaining)
	d, err = s.Allow(ctx, "k", 1) // the clock has not moved: only the refund admits it
	require.NoError(t, err)
	require.True(t, d.Allowed, "a denial kept past a Refund that made room: %+v", d)
	require.Equal(t, int64(4), d.Remaining)
}
