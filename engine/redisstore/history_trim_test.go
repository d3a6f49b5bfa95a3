package redisstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// HistoryVersions versions are retained: the cutover that would retain one
// more trims the history to the version it replaces and its own.
func TestHistoryTrimmedPastHistoryVersions(t *testing.T) {
	clk := clock.NewManual(0)
	pfx := prefix(t)
	c := client(t, redisAddr(t))
	s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	history := redisstore.GlobalKey(pfx, "history")
	for v := int64(2); v <= redisstore.HistoryVersions; v++ {
		require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: v, Capacity: 10, TokensPerSecond: 1}, v-1))
	}
	require.Equal(t, int64(redisstore.HistoryVersions), c.LLen(ctx, history).Val())
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: redisstore.HistoryVersions + 1, Capacity: 10, TokensPerSecond: 1}, redisstore.HistoryVersions))
	require.Equal(t, int64(2), c.LLen(ctx, history).Val(), "the version replaced and the new one")
}
