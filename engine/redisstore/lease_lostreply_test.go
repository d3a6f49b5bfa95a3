package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseLostRepliesAskNoMore: while Redis decides calls whose replies
// never come back (a server stalled past the deadline that then runs what
// queued up), a lease asked for in such a call is taken from the bucket
// and heard of by nobody. The key must not ask for another lease with
// every failed call, draining the bucket for every process: until Redis
// answers again, the tokens lost are at most the one lease that was in
// flight plus what the failed requests themselves cost. The clock stands
// still, so the bucket gets no refill and the count is exact.
func TestLeaseLostRepliesAskNoMore(t *testing.T) {
	const capacity = 16_000 // a lease holds at most 1000
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1}
	var lose atomic.Bool
	c := client(t, redisAddr(t))
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		err := next(ctx, cmds)
		if lose.Load() { // Redis ran the call; its reply is lost
			return context.DeadlineExceeded
		}
		return err
	}))
	pfx := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p, Leases: &redisstore.Leases{}}, clk)
	ctx := context.Background()
	var admitted int64
	allow := func() bool {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		if d.Allowed && !d.Degraded {
			admitted++
		}
		return d.Degraded
	}
	for range 3000 { // demand enough for leases of the largest size
		require.False(t, allow())
	}
	require.NotZero(t, s.Stats().Local)
	lose.Store(true)
	failed := int64(0)
	for i := 0; i < 5000 && failed < 50; i++ { // the lease runs out, then calls fail
		if allow() {
			failed++
			// A cost above capacity is answered by the failure rule with an
			// error, not Degraded: that is no answer from Redis either.
			_, err := s.Allow(ctx, "k", capacity+1)
			require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
		}
	}
	require.Equal(t, int64(50), failed, "the lease covered every request")
	lose.Store(false)
	require.NoError(t, s.Close())
	pk, err := newStore(t, redisstore.Config{Prefix: pfx, Policy: p}, clk).Peek(ctx, "k")
	require.NoError(t, err)
	lost := capacity - admitted - pk.Remaining
	bound := capacity/16 + failed // the lease in flight, and each failed request's cost
	require.LessOrEqual(t, lost, bound, "%d failed calls lost %d tokens (admitted %d, remaining %d, stats %+v)", failed, lost, admitted, pk.Remaining, s.Stats())
}
