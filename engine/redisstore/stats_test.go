package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestStatsCountEveryCall: a known sequence of Allows, AllowBatches,
// AllowAlls, Peeks and Refunds, decided by Redis, refused before Redis, and
// answered by the failure rule, is counted exactly: each request Redis
// decides by outcome (an AllowAll's requests all allowed or all denied),
// each error by kind, each failure answer as a failure, each AllowAll call
// once; and the counts add up to the calls and requests made.
func TestStatsCountEveryCall(t *testing.T) {
	exactBalances(t)
	c := client(t, redisAddr(t))
	var failing atomic.Bool
	c.AddHook(failPipelines(&failing))
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Policy: p}, clock.NewManual(0)) // no refill meanwhile
	ctx := context.Background()
	allow := func(key string, cost int64, want bool) {
		t.Helper()
		d, err := s.Allow(ctx, key, cost)
		require.NoError(t, err)
		require.Equal(t, want, d.Allowed)
	}
	allowAll := func(want bool, reqs ...engine.Request) {
		t.Helper()
		d, _, err := s.AllowAll(ctx, reqs)
		require.NoError(t, err)
		require.Equal(t, want, d.Allowed)
	}

	allow("a", 4, true)  // a: 6
	allow("a", 7, false) // allowed 1, denied 1
	_, err := s.Allow(ctx, "", 1)
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	out := make([]engine.Result, 5)
	require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 2}, {Key: "b", Cost: 9}, {Key: "", Cost: 1}, {Key: "c", Cost: 11}}, out))
	require.True(t, out[0].Decision.Allowed)  // a: 5
	require.True(t, out[1].Decision.Allowed)  // b: 8
	require.False(t, out[2].Decision.Allowed) // allowed 3, denied 2
	require.ErrorIs(t, out[3].Err, engine.ErrInvalidKey)
	require.ErrorIs(t, out[4].Err, engine.ErrCostExceedsCapacity, "decided by Redis, counted as an invalid cost")
	allowAll(true, engine.Request{Key: "a", Cost: 2}, engine.Request{Key: "b", Cost: 1}, engine.Request{Key: "a", Cost: 1}) // a: 2, b: 7; allowed 6
	allowAll(false, engine.Request{Key: "a", Cost: 3}, engine.Request{Key: "b", Cost: 1})                                   // denied 4
	_, _, err = s.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 11}})
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	_, _, err = s.AllowAll(ctx, nil)
	require.ErrorIs(t, err, engine.ErrAllowAllSize)
	_, err = s.Peek(ctx, "a")
	require.NoError(t, err)
	_, err = s.Refund(ctx, "a", 1)
	require.NoError(t, err)
	_, err = s.Peek(ctx, "")
	require.ErrorIs(t, err, engine.ErrInvalidKey)

	failing.Store(true) // fail closed: denied, Degraded
	allow("a", 1, false)
	allowAll(false, engine.Request{Key: "a", Cost: 1}, engine.Request{Key: "b", Cost: 1})
	require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}}, out))
	require.True(t, out[0].Decision.Degraded && out[1].Decision.Degraded)
	_, err = s.Peek(ctx, "a")
	require.ErrorIs(t, err, redisstore.ErrUnavailable)

	st := s.Stats()
	require.Equal(t, uint64(6), st.Allowed)
	require.Equal(t, uint64(4), st.Denied)
	require.Equal(t, engine.Errors{InvalidKey: 3, InvalidCost: 1, Other: 1}, st.Errors)
	require.Equal(t, uint64(1), st.Peeks)
	require.Equal(t, uint64(1), st.Refunds)
	require.Equal(t, uint64(1+2+2), st.Failures)
	require.Equal(t, st.Failures, st.DegradedDenied)
	require.Zero(t, st.DegradedAllowed)
	require.Equal(t, engine.AllowAllStats{Admitted: 1, Refused: 2, Errors: engine.Errors{InvalidCost: 1, Other: 1}}, st.AllowAll)
	// 4 Allows, 3 Peeks, 1 Refund, 7 batch requests, 3+2+2 requests of
	// AllowAlls that returned a Decision.
	require.Equal(t, uint64(4+3+1+7+3+2+2), st.Allowed+st.Denied+st.Failures+st.Peeks+st.Refunds+st.Errors.Sum())
	require.Equal(t, uint64(2+4+3+2+1), st.Decisions, "Redis decided the Allows, the batch's requests but the bad key, and the AllowAlls' (a sum above capacity too)")
}

// TestRetriesCountEachCallSentAgain: a batch over a cluster's shards, sent
// under a version another store has since replaced, is sent again call by
// call, and Retries counts every call sent again, not one per round.
func TestRetriesCountEachCallSentAgain(t *testing.T) {
	exactBalances(t)
	c := clusterClient(t, redistest.ClusterAddrs(t))
	var calls atomic.Int64
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			if redisstore.IsDecideCall(cmd) {
				calls.Add(1)
			}
		}
		return next(ctx, cmds)
	}))
	pfx := prefix(t)
	p1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p1}, clock.NewManual(0))
	o := newStore(t, redisstore.Config{Client: clusterClient(t, redistest.ClusterAddrs(t)), Prefix: pfx, Policy: p1}, clock.NewManual(0))
	reqs := make([]engine.Request, 40)
	for i := range reqs {
		reqs[i] = engine.Request{Key: fmt.Sprint("k", i), Cost: 1}
	}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, s.AllowBatch(context.Background(), reqs, out)) // the script loaded on every master
	calls.Store(0)
	require.NoError(t, s.AllowBatch(context.Background(), reqs, out))
	first := calls.Load() // one call per shard, none sent again
	require.NoError(t, o.ReplacePolicy(context.Background(), policy.Policy{Version: 2, Capacity: 9, TokensPerSecond: 1}, 1))
	calls.Store(0)
	r0 := s.Stats().Retries
	require.NoError(t, s.AllowBatch(context.Background(), reqs, out))
	require.Greater(t, first, int64(1), "a batch over several shards")
	require.Equal(t, 2*first, calls.Load(), "every call met the new version and was sent again")
	require.Equal(t, uint64(first), s.Stats().Retries-r0, "each call sent again counts")
}
