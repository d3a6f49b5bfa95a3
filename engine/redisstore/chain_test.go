package redisstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestManyBucketsBehindOverrides: buckets behind a retained version with
// overrides need their own limits under it from the client; a chunk of many
// such buckets gets them all in one more round trip, not one per bucket
// (found by the stress harness's differential traces: the ninth bucket used
// to run out of attempts and be answered fail-closed).
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
