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

// TestManyBucketsBehindOverrides: buckets behind a retained version with
// overrides need their own limits under it from the client; a chunk of many
// such buckets gets them all in one more round trip, not one per bucket,
// which would leave the ninth bucket out of attempts and answer it by the
// fail-closed rule.
func TestManyBucketsBehindOverrides(t *testing.T) {
	ctx := context.Background()
	over, err := policy.NewOverrideSet(policy.Override{Match: "k1*", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	for _, n := range []int{1, 8, 40, redisstore.ChunkSize + 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			clk := clock.NewManual(0)
			s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
			reqs := make([]engine.Request, n)
			for i := range reqs {
				reqs[i] = engine.Request{Key: fmt.Sprint("k", i), Cost: 9}
			}
			out := make([]engine.Result, n)
			require.NoError(t, s.AllowBatch(ctx, reqs, out))
			require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: over}, 1))
			clk.Advance(2e9)
			require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 1}, 2))
			clk.Advance(1e9)
			for i := range reqs {
				reqs[i].Cost = 1
			}
			require.NoError(t, s.AllowBatch(ctx, reqs, out))
			for i, r := range out {
				require.NoError(t, r.Err)
				// 1 token at v1, +2 by the second cutover (k1* capped at 5
				// under v2 changes nothing at 3), then +1 under v3: 4, minus 1
				require.Equal(t, engine.Decision{Allowed: true, Remaining: 3, Version: 3, Limit: 5, ResetAfter: 2e9}, r.Decision, "%s", reqs[i].Key)
			}
			require.Zero(t, s.Stats().Failures)
		})
	}
}

// TestChainManyKeysDenied: buckets last written under v1, then a cutover to
// v2 with overrides (a safe one: no pass), then v3. Every bucket now needs a
// chain for v2. One AllowBatch of 20 such keys must decide every one of them
// (all depleted: all denied), even with FailOpen, where a request the store
// gave up on would be admitted.
func TestChainManyKeysDenied(t *testing.T) {
	clk := clock.NewManual(0)
	var errs []error
	s := newStore(t, redisstore.Config{
		Policy:   policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
		FailOpen: true,
		OnError:  func(err error) { errs = append(errs, err) },
	}, clk)
	ctx := context.Background()
	const n = 20
	reqs := make([]engine.Request, n)
	for i := range reqs {
		reqs[i] = engine.Request{Key: fmt.Sprint("key", i), Cost: 5}
		d, err := s.Allow(ctx, reqs[i].Key, 10)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 2}, 2))
	clk.Advance(time.Second) // 2 tokens at most: a cost of 5 must be denied
	out := make([]engine.Result, n)
	require.NoError(t, s.AllowBatch(ctx, reqs, out))
	for i, r := range out {
		require.NoError(t, r.Err, "request %d", i)
		require.False(t, r.Decision.Allowed, "request %d admitted: %+v (store errors: %v)", i, r.Decision, errs)
	}
	require.Zero(t, s.Stats().Failures)
}

// TestChainEvictFull: the same chain, judged by EvictFull: it must not
// fail on a keyspace of buckets that need chains.
func TestChainEvictFull(t *testing.T) {
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	for i := range 20 {
		_, err := s.Allow(ctx, fmt.Sprint("key", i), 10)
		require.NoError(t, err)
	}
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 2}, 2))
	n, err := s.EvictFull(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestBatchOrderAcrossChunks: a batch's results are those of the same Allow
// calls made one by one in request order, also when a chunk stops for a
// chain and is sent again. Request 1 (key y, cost 5) precedes request 256
// (key y, cost 1), in the next chunk, and the first chunk stops at request 0
// for a chain: deciding the second chunk before the first is sent again
// would reverse the two requests on y.
func TestBatchOrderAcrossChunks(t *testing.T) {
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	_, err := s.Allow(ctx, "old", 10)
	require.NoError(t, err)
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 2}, 2))

	reqs := make([]engine.Request, redisstore.ChunkSize+1)
	reqs[0] = engine.Request{Key: "old", Cost: 1}
	reqs[1] = engine.Request{Key: "y", Cost: 5}
	for i := 2; i < redisstore.ChunkSize; i++ {
		reqs[i] = engine.Request{Key: fmt.Sprint("filler", i), Cost: 1}
	}
	reqs[redisstore.ChunkSize] = engine.Request{Key: "y", Cost: 1}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, s.AllowBatch(ctx, reqs, out))
	require.True(t, out[1].Decision.Allowed, "request 1, y cost 5 on a fresh bucket of 5: %+v", out[1])
	require.False(t, out[redisstore.ChunkSize].Decision.Allowed, "request 256, y cost 1 after y was emptied: %+v", out[redisstore.ChunkSize])
}
