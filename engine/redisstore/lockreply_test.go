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

// TestLockReplyLostReleasesLock: a ReplacePolicy whose context ends while
// the reply to its SET NX of the cutover lock is in flight has taken the
// lock in Redis without knowing it. It returns the context's error and
// changes nothing, the lock included: the next ReplacePolicy, from another
// store, goes through at once rather than wait out the lock's TTL (10 s).
func TestLockReplyLostReleasesLock(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	p1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	other := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: p1})[0]

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := client(t, addr)
	lockKey := redisstore.GlobalKey(p, "lock")
	var fired atomic.Bool
	ac.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); cmd.Name() == "set" && len(a) > 1 && a[1] == lockKey && err == nil && !fired.Swap(true) {
			cancel() // the caller gives up with the reply in flight
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return err
	}})
	admin, err := redisstore.New(context.Background(), redisstore.Config{Client: ac, Prefix: p, Policy: p1, Timeout: time.Second})
	require.NoError(t, err)
	defer admin.Close()
	err = admin.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1)
	require.True(t, fired.Load(), "the lock's reply was lost")
	require.ErrorIs(t, err, context.Canceled)

	c := client(t, addr)
	require.Zero(t, c.Exists(context.Background(), lockKey).Val(), "the abandoned lock is left behind")
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	require.NoError(t, other.ReplacePolicy(rctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1),
		"the next cutover waits for a lock nobody holds")
}

// TestLockSetSentTwiceTakesLock: go-redis sends a command again when its
// reply is lost on the way (an EOF), so the SET NX of the cutover lock can
// reach Redis twice: the second finds the lock taken, by this very call.
// The call knows its own token and goes on; before, it waited for its own
// lock until its context ended, leaving it held for the lock's TTL.
func TestLockSetSentTwiceTakesLock(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	p1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	ac := client(t, addr)
	t.Cleanup(func() { cleanPrefix(ac, p) })
	lockKey := redisstore.GlobalKey(p, "lock")
	var fired atomic.Bool
	ac.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); cmd.Name() == "set" && len(a) > 1 && a[1] == lockKey && err == nil && !fired.Swap(true) {
			return next(ctx, cmd) // the first reply lost, the SET sent again
		}
		return err
	}})
	admin, err := redisstore.New(context.Background(), redisstore.Config{Client: ac, Prefix: p, Policy: p1, Timeout: time.Second})
	require.NoError(t, err)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	require.NoError(t, admin.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1))
	require.True(t, fired.Load(), "the SET was sent twice")
	require.Equal(t, int64(2), admin.Policy().Version)
	require.Zero(t, client(t, addr).Exists(context.Background(), lockKey).Val(), "the lock is released")
}
