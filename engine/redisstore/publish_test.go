package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// cancelAfterPublish lets the replace script (the only script with 5 keys)
// run in Redis, then cancels the caller's context before the reply is read,
// as a context ending while the reply is in flight does.
type cancelAfterPublish struct{ cancel context.CancelFunc }

func (h *cancelAfterPublish) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cancelAfterPublish) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *cancelAfterPublish) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(a) > 2 && fmt.Sprint(a[2]) == "5" && err == nil {
			h.cancel()
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return err
	}
}

// TestPublishThenContextEnds: DESIGN 3.8: once publish has begun,
// ReplacePolicy completes and returns nil. Here the context ends while the
// publish's reply is in flight: the call must still return nil and run the
// pass that sets expiries again (it returned the context's error and
// skipped the pass: found in review).
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
	ac.AddHook(&cancelAfterPublish{cancel: cancel})
	admin, err := redisstore.New(context.Background(), redisstore.Config{Client: ac, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Timeout: time.Second})
	require.NoError(t, err)
	err = admin.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1}, 1)
	t.Logf("ReplacePolicy: %v; version in Redis: %s; PEXPIRETIME of k: %d", err, c.HGet(context.Background(), p+"policy", "v").Val(), pexpireTime(t, c, p+"k:k"))
	require.Equal(t, "2", c.HGet(context.Background(), p+"policy", "v").Val())
	require.NoError(t, err, "published, so the call must complete")
}
