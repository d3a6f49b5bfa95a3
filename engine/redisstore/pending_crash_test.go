package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// dieAfter returns a client for addr that sends every command until it has
// sent one running the script src, and then fails every later one: the
// process died right after that step of a cutover.
func dieAfter(t *testing.T, addr, src string) redis.UniversalClient {
	c := anyClient(t, addr)
	var dead atomic.Bool
	step := func(cmd redis.Cmder) bool {
		return cmd.Name() == "eval" && len(cmd.Args()) > 1 && fmt.Sprint(cmd.Args()[1]) == src
	}
	c.AddHook(hook{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if dead.Load() {
				cmd.SetErr(errors.New("the process died"))
				return cmd.Err()
			}
			err := next(ctx, cmd)
			dead.Store(step(cmd))
			return err
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			if dead.Load() {
				for _, cmd := range cmds {
					cmd.SetErr(errors.New("the process died"))
				}
				return errors.New("the process died")
			}
			err := next(ctx, cmds)
			for _, cmd := range cmds {
				if step(cmd) {
					dead.Store(true)
				}
			}
			return err
		},
	})
	return c
}

// TestDeadHolderPendingFlagExpires: a process dies in the middle of a
// lengthening cutover, right after it set the cutover's own pending token
// in every shard, and the next New finishes the cutover. The dead process's
// own pending token, which it can no longer remove, must still expire
// within the lock's TTL, as the holder's flags do: a pending flag left for
// good would have every bucket of the prefix written without expiry from
// then on, so that none is ever reclaimed. The cutover's own token used to
// PERSIST the whole flag, the dead holder's token with it.
func TestDeadHolderPendingFlagExpires(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprintf("cluster=%v", cluster), func(t *testing.T) {
			addr := redisAddr(t)
			if cluster {
				addr = clusterAddr(t)
			}
			ctx := context.Background()
			p := prefix(t)
			v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 10}
			cfg := redisstore.Config{Prefix: p, Policy: v1, Timeout: 5 * time.Second}
			user := realStores(t, addr, 1, cfg)[0]
			_, err := user.Allow(ctx, "k", 3)
			require.NoError(t, err)

			dc := cfg
			dc.Client = dieAfter(t, addr, redisstore.FlagScript)
			dc.OnError = func(error) {} // its unlock fails: it died
			dying, err := redisstore.New(ctx, dc)
			require.NoError(t, err)
			t.Cleanup(func() { _ = dying.Close() })
			ttl := redisstore.LockTTL(dying)
			// a higher capacity at the same rate lengthens times-to-full
			v2 := policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 10}
			require.ErrorIs(t, dying.ReplacePolicy(ctx, v2, 1), redisstore.ErrUnavailable)

			c := anyClient(t, addr)
			policies, _, pendings := redisstore.ShardStateKeys(p)
			require.Equal(t, "1", c.HGet(ctx, policies[0], "v").Val(), "died before any shard was prepared")

			fresh := realStores(t, addr, 1, cfg)[0] // New finishes the recorded cutover
			require.Equal(t, int64(2), fresh.Policy().Version)
			for i, k := range policies {
				require.Equal(t, "2", c.HGet(ctx, k, "v").Val(), "shard %d published", i)
			}
			for i, k := range pendings {
				held := c.HGetAll(ctx, k).Val()
				require.Len(t, held, 1, "shard %d's pending flag holds the dead process's token alone, the cutover's gone", i)
				require.NotContains(t, held, "c2", "shard %d: the cutover's token outlived its publish", i)
				left := c.PTTL(ctx, k).Val()
				require.True(t, left > 0 && left <= ttl,
					"shard %d's pending flag %v, held by the dead process alone, expires in %v: want within the lock's TTL, %v", i, c.HGetAll(ctx, k).Val(), left, ttl)
			}
		})
	}
}
