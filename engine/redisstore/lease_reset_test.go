package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseResetAfterNeverNegative: a leased answer's ResetAfter counts
// down from the bucket's last answer; once that much time has passed, the
// bucket is full as far as the process knows, and ResetAfter is 0, never
// below.
func TestLeaseResetAfterNeverNegative(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	a, b := leasedBeside(t, p, clk)
	holding(t, a, b, "k", 100)
	clk.Advance(200 * time.Second) // past any ResetAfter the bucket gave
	ctx := context.Background()
	local := a.Stats().Local
	d, err := a.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, local+1, a.Stats().Local, "the lease did not decide")
	require.GreaterOrEqual(t, d.ResetAfter, time.Duration(0), "%+v", d)
}
