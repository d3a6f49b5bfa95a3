package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// A request the lease cannot cover takes what the lease holds and asks
// Redis for the rest; denied, it leaves those tokens to the lease, and its
// Remaining counts them besides the bucket's own: what a request of one
// token would still find in the process, as a Peek's does.
func TestLeaseDenialRemainingCountsHeldTokens(t *testing.T) {
	clk := clock.NewManual(0)
	a, b := leasedBeside(t, policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}, clk)
	held := holding(t, a, b, "k", 100)
	ctx := context.Background()
	rest := peek(t, b, "k").Remaining
	d, err := b.Allow(ctx, "k", rest) // the bucket empty, the lease untouched
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = a.Allow(ctx, "k", held+1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.False(t, d.Degraded)
	require.Equal(t, held, d.Remaining, "the bucket's 0 and the lease's %d", held)
	// A Peek counts them too, and so admits a request of one token now.
	require.Zero(t, peek(t, b, "k").Remaining)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: held, Limit: 1000, Version: 1, ResetAfter: 1000 * time.Second}, peek(t, a, "k"))
}
