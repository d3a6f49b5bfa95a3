package engine_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestMaxLimitsResolveAcrossCutover: a policy with policy.MaxLimits distinct
// limits, the last one a pattern at the top LimitIndex, decides every key
// under its own limit, and keeps it across a cutover.
func TestMaxLimitsResolveAcrossCutover(t *testing.T) {
	ovs := make([]policy.Override, policy.MaxLimits)
	for i := range ovs {
		ovs[i] = policy.Override{Match: "k" + strconv.Itoa(i), Capacity: int64(i + 1), TokensPerSecond: 1}
	}
	ovs[len(ovs)-1].Match = "last*"
	set, err := policy.NewOverrideSet(ovs...)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 7, TokensPerSecond: 1, Overrides: set}
	e, err := engine.New(engine.Config{Policy: p, Clock: clock.NewManual(0), Shards: 2})
	require.NoError(t, err)
	defer e.Close()
	ctx := context.Background()
	d, err := e.Allow(ctx, "lastone", 1)
	require.NoError(t, err)
	require.Equal(t, int64(policy.MaxLimits), d.Limit)
	d, err = e.Allow(ctx, "k5", 1)
	require.NoError(t, err)
	require.Equal(t, int64(6), d.Limit)
	d, err = e.Allow(ctx, "other", 1)
	require.NoError(t, err)
	require.Equal(t, int64(7), d.Limit)
	p2 := p
	p2.Version = 2
	require.NoError(t, e.ReplacePolicy(ctx, p2, 1))
	d, err = e.Peek(ctx, "lastone")
	require.NoError(t, err)
	require.Equal(t, int64(policy.MaxLimits), d.Limit)
	require.Equal(t, int64(policy.MaxLimits-1), d.Remaining)
}
