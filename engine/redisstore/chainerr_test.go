package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestChainErrorDropsLaterChunks: chunk 0 stops for a chain, chunk 1
// (same pipeline) is decided by Redis; fetching the chain fails. Chunk 1's
// decisions must still be answered (exec used to return before reading its
// reply, answering it by the fail-closed rule although Redis had taken its
// tokens: found in review).
func TestChainErrorDropsLaterChunks(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	var failing atomic.Bool // LRANGE (the chain fetch) fails while set
	c.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if failing.Load() && cmd.Name() == "lrange" {
			err := errors.New("injected: connection reset")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}})
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	_, err := s.Allow(ctx, "old", 10)
	require.NoError(t, err)
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 1}, 2))

	reqs := make([]engine.Request, redisstore.ChunkSize+1)
	reqs[0] = engine.Request{Key: "old", Cost: 1}
	for i := 1; i < redisstore.ChunkSize; i++ {
		reqs[i] = engine.Request{Key: fmt.Sprint("filler", i), Cost: 1}
	}
	reqs[redisstore.ChunkSize] = engine.Request{Key: "y", Cost: 3}
	out := make([]engine.Result, len(reqs))
	failing.Store(true)
	require.NoError(t, s.AllowBatch(ctx, reqs, out))
	failing.Store(false)
	y := c.Get(ctx, p+"k:y").Val()
	t.Logf("y answered %+v; y in Redis %q; old %+v; stats %+v", out[redisstore.ChunkSize], y, out[0], s.Stats())
	require.Equal(t, "2000000000 0 3 5 1", y, "Redis decided y: 3 of 5 taken")
	require.Equal(t, engine.Result{Decision: engine.Decision{Allowed: true, Remaining: 2, Version: 3, Limit: 5, ResetAfter: 3e9}}, out[redisstore.ChunkSize],
		"y must get the decision Redis made, not the fail-closed rule")
}
