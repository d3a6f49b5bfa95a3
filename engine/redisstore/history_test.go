package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLostHistoryRestartsEmpty: a bucket written under a version Redis no
// longer retains (its policy keys were lost, not its buckets) cannot replay
// what it earned since; it restarts empty at the current cutover, a denial
// too many rather than a free burst or a failure on every later call.
func TestLostHistoryRestartsEmpty(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	_, err := s.Allow(ctx, "k", 5) // 5 of 10 left, under version 1
	require.NoError(t, err)
	clk.Advance(time.Second)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}, 1))
	_, hs, _ := redisstore.ShardStateKeys(p)
	for _, k := range append(hs, redisstore.GlobalKey(p, "history")) {
		require.NoError(t, c.LTrim(ctx, k, -1, -1).Err()) // version 1 is forgotten
	}
	clk.Advance(time.Second)
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	// empty at the cutover (t=1 s), one token refilled since: taken
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 10, ResetAfter: 10 * time.Second}, d)
	require.Zero(t, s.Stats().Failures)
}

// TestTrimWithChains: once HistoryVersions versions are retained, the
// next cutover brings every bucket up first, and must do so when many
// buckets of a SCAN page need chains: a trim that gave up would make every
// later ReplacePolicy give up too.
func TestTrimWithChains(t *testing.T) {
	srv := startPrivate(t)
	clk := clock.NewManual(0)
	c := client(t, srv.Addr())
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	for i := range 20 {
		_, err := s.Allow(ctx, fmt.Sprint("key", i), 10)
		require.NoError(t, err)
	}
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
	for v := int64(3); v <= redisstore.HistoryVersions; v++ {
		require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: v, Capacity: 5, TokensPerSecond: v}, v-1))
	}
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: redisstore.HistoryVersions + 1, Capacity: 5, TokensPerSecond: 100}, redisstore.HistoryVersions))
}
