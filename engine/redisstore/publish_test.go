package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestPublishThenContextEnds: once publish has begun, ReplacePolicy completes
// and returns nil. Here the context ends while the publish's reply is in
// flight: the call must still return nil and run the pass that sets expiries
// again, not return the context's error and leave buckets without expiries.
func TestPublishThenContextEnds(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	c := client(t, addr)
	s := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}})[0]
	_, err := s.Allow(context.Background(), "k", 5)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := client(t, addr)
	// The cutover's record (the intent script, the store's only one with
	// three keys the last of which is the lock) is written in Redis; then
	// the caller's context is canceled before its reply is read, as a
	// context ending while the reply is in flight.
	var fired atomic.Bool
	ac.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if k := scriptKeys(cmd); len(k) == 3 && k[2] == redisstore.GlobalKey(p, "lock") && err == nil && !fired.Swap(true) {
			cancel()
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return err
	}})
	admin, err := redisstore.New(context.Background(), redisstore.Config{Client: ac, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Timeout: time.Second})
	require.NoError(t, err)
	err = admin.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1}, 1)
	t.Logf("ReplacePolicy: %v; version in Redis: %s; PEXPIRETIME of k: %d", err, c.HGet(context.Background(), redisstore.GlobalKey(p, "policy"), "v").Val(), pexpireTime(t, c, redisstore.BucketKey(p, "k")))
	require.True(t, fired.Load(), "the publish's reply was lost")
	require.Equal(t, "2", c.HGet(context.Background(), redisstore.GlobalKey(p, "policy"), "v").Val())
	require.NoError(t, err, "published, so the call must complete")
	b := readBucket(t, c, redisstore.BucketKey(p, "k"))
	require.Equal(t, int64(2), b.version, "the pass after the publish ran")
	b.checkExpiry(t, "after the pass")
}
