package redisstore_test

import (
	"context"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestPendingFlagNeedsTheLock: a process whose cutover lock expired (it
// stalled) must not set the pending flag over the one of the process that
// took the lock after it; it would later delete it, and buckets would get
// expiries under the old limit while the other prepares a lengthening
// cutover.
func TestPendingFlagNeedsTheLock(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	c := client(t, addr)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 10}
	_, _, pendings := redisstore.ShardStateKeys(p)
	realStores(t, addr, 1, redisstore.Config{Client: c, Prefix: p, Policy: v1})
	// A's first script on the lock and the pending flag (a lengthening
	// cutover's first sets the flag) waits for release.
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ca := client(t, addr)
	ca.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if k := scriptKeys(cmd); len(k) > 1 && k[0] == redisstore.GlobalKey(p, "lock") && k[1] == pendings[0] {
			once.Do(func() { close(reached); <-release })
		}
		return next(ctx, cmd)
	}})
	a, err := redisstore.New(context.Background(), redisstore.Config{Client: ca, Prefix: p, Policy: v1})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		done <- a.ReplacePolicy(context.Background(), policy.Policy{Version: 2, Capacity: 1000, TokensPerSecond: 10}, 1)
	}()
	<-reached
	// A's lock expires; B takes it and sets its own flag
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, redisstore.GlobalKey(p, "lock"), "B", 0).Err())
	for _, k := range pendings {
		require.NoError(t, c.HSet(ctx, k, "B", "1").Err())
	}
	close(release)
	require.ErrorIs(t, <-done, redisstore.ErrUnavailable, "A lost its lock: its cutover fails")
	for _, k := range pendings {
		require.Equal(t, map[string]string{"B": "1"}, c.HGetAll(ctx, k).Val(), "B's flag untouched, and A's not set")
	}
	require.Equal(t, "B", c.Get(ctx, redisstore.GlobalKey(p, "lock")).Val(), "B's lock untouched")
	require.Equal(t, int64(1), a.Policy().Version)
}

// TestPendingFlagOfAnotherType: a value at a shard's pending flag of a type
// no store writes there (a string: an operator's) is no cutover's flag, so
// the shard's buckets keep their expiries; were it taken for one, every
// bucket written on the shard would keep its memory for good.
func TestPendingFlagOfAnotherType(t *testing.T) {
	exactBalances(t)
	c := client(t, redisAddr(t))
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, nil)
	ctx := context.Background()
	_, _, pendings := redisstore.ShardStateKeys(p)
	for _, k := range pendings {
		require.NoError(t, c.Set(ctx, k, "1", 0).Err())
		t.Cleanup(func() { c.Del(context.Background(), k) })
	}
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed && !d.Degraded, "%+v", d)
	require.Positive(t, c.PTTL(ctx, redisstore.BucketKey(p, "k")).Val(), "the bucket expires when full")
}
