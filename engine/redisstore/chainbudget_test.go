package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestHeavyHistoryTrimmed: while the retained versions with overrides hold
// the bound's worth of stored policy, a cutover first brings every bucket
// up to the version in force and retains no more, as one past
// HistoryVersions does: a bucket behind them would make every process
// that meets it read and decode each one (19 versions of 100,000
// overrides, 120 MB in Redis, took one Allow 10 s and 227 MB of heap). A
// bucket left behind is decided exactly all the same.
func TestHeavyHistoryTrimmed(t *testing.T) {
	ctx := context.Background()
	c := client(t, redisAddr(t))
	pol := func(v int64) policy.Policy {
		os := make([]policy.Override, 1000)
		for i := range os {
			os[i] = policy.Override{Match: "tenant:" + strconv.Itoa(i), Capacity: 1_000_000 + int64(i) - 10*v, TokensPerSecond: 1}
		}
		set, err := policy.NewOverrideSet(os...)
		require.NoError(t, err)
		return policy.Policy{Version: v, Capacity: 1000, TokensPerSecond: 1, Overrides: set}
	}
	blob := int64(len(redisstore.PolicyBlob(pol(1))))
	defer redisstore.SetChainBytes(3 * blob)()
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: pol(1), Timeout: 20 * time.Second}, nil)
	d, err := s.Allow(ctx, "tenant:7", 900_000)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	for v := int64(2); v <= 8; v++ {
		require.NoError(t, s.ReplacePolicy(ctx, pol(v), v-1)) // lowers every override: no pass of its own
		n, err := c.LLen(ctx, redisstore.GlobalKey(p, "history")).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, n, int64(4), "version %d: %d versions retained", v, n)
	}
	d, err = s.Allow(ctx, "tenant:7", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed, "%+v", d)
	require.Equal(t, int64(1_000_000+7-80), d.Limit)
	left := int64(1_000_000 + 7 - 10 - 900_000 - 1) // version 1's capacity, less both costs
	require.GreaterOrEqual(t, d.Remaining, left)
	require.Less(t, d.Remaining, left+60, "%+v", d) // a minute's refill at most
}

// TestHeavyHistoryTrimsOnlyWhatItDrops: a cutover passes over the keyspace
// for the bound only when the trim that follows drops a retained version
// with overrides: one from a policy in force that alone holds the bound's
// worth, the version the trim keeps, left every bucket reading that one
// policy all the same, so the pass (seconds on a large keyspace, under the
// caller's context) bought nothing. The next cutover, which drops it, still
// passes.
func TestHeavyHistoryTrimsOnlyWhatItDrops(t *testing.T) {
	ctx := context.Background()
	var passCalls atomic.Int64
	c := client(t, redisAddr(t))
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			if k := scriptKeys(cmd); redisstore.IsDecideCall(cmd) && k != nil && cmd.Args()[3+len(k)] == "c" {
				passCalls.Add(1)
			}
		}
		return next(ctx, cmds)
	}))
	pol := func(v int64) policy.Policy {
		os := make([]policy.Override, 1000)
		for i := range os {
			os[i] = policy.Override{Match: "tenant:" + strconv.Itoa(i), Capacity: 1_000_000 + int64(i) - 10*v, TokensPerSecond: 1}
		}
		set, err := policy.NewOverrideSet(os...)
		require.NoError(t, err)
		return policy.Policy{Version: v, Capacity: 1000, TokensPerSecond: 1, Overrides: set}
	}
	defer redisstore.SetChainBytes(int64(len(redisstore.PolicyBlob(pol(1)))))()
	s := newStore(t, redisstore.Config{Client: c, Policy: pol(1), Timeout: 20 * time.Second}, nil)
	for i := range 10 {
		_, err := s.Allow(ctx, "tenant:"+strconv.Itoa(i), 1)
		require.NoError(t, err)
	}
	require.NoError(t, s.ReplacePolicy(ctx, pol(2), 1)) // lowers every override: no pass of its own
	require.Zero(t, passCalls.Load(), "a pass before a trim that drops nothing")
	require.NoError(t, s.ReplacePolicy(ctx, pol(3), 2))
	require.NotZero(t, passCalls.Load(), "no pass before the trim that drops version 1")
}
