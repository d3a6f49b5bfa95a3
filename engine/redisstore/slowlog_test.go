package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestBigSingleKeyBatchBoundedCalls: a batch of 10,000 requests on one key
// is decided in order and exactly (the first 5,000 admitted, at one
// instant), by script calls of at most ChunkSize requests each, none of
// which holds Redis for more than a few ms (SLOWLOG of a private server,
// which logs every command): the median under 2 ms, nine in ten under 5,
// every one under 25 (a shared 2-core machine preempts Redis at times; a
// single call of them all took 115 ms).
func TestBigSingleKeyBatchBoundedCalls(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	s := realStores(t, srv.Addr(), 1, redisstore.Config{
		Policy: policy.Policy{Version: 1, Capacity: 5000, TokensPerSecond: 1}, Timeout: 20 * time.Second,
		Clock: clock.NewManual(1e9),
	})[0]
	_, err := s.Allow(ctx, "warm", 1) // the script loaded
	require.NoError(t, err)
	require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
	require.NoError(t, c.ConfigSet(ctx, "slowlog-max-len", "10000").Err())
	require.NoError(t, c.Do(ctx, "SLOWLOG", "RESET").Err())

	const n = 10_000
	reqs := make([]engine.Request, n)
	for i := range reqs {
		reqs[i] = engine.Request{Key: "hot", Cost: 1}
	}
	out := make([]engine.Result, n)
	require.NoError(t, s.AllowBatch(ctx, reqs, out))
	for i, r := range out {
		require.NoError(t, r.Err, "request %d", i)
		require.Equal(t, i < 5000, r.Decision.Allowed, "request %d: %+v", i, r.Decision)
	}
	require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err())

	logs, err := c.SlowLogGet(ctx, 10_000).Result()
	require.NoError(t, err)
	var took []time.Duration
	for _, l := range logs {
		if len(l.Args) < 3 || (l.Args[0] != "fcall" && l.Args[0] != "evalsha") {
			continue
		}
		var keys int
		_, err := fmt.Sscan(l.Args[2], &keys)
		require.NoError(t, err, "%v", l.Args)
		require.LessOrEqual(t, keys-3, redisstore.ChunkSize, "a call of %d requests", keys-3)
		took = append(took, l.Duration)
	}
	slices.Sort(took)
	t.Logf("%d requests on one key: %d script calls, median %s, longest %s", n, len(took), took[len(took)/2], took[len(took)-1])
	require.GreaterOrEqual(t, len(took), n/redisstore.ChunkSize)
	// A call takes ~0.3 ms alone; a busy machine (-race) preempts Redis.
	require.Less(t, took[len(took)/2], 2*time.Millisecond, "the median script call held Redis too long")
	require.Less(t, took[len(took)*9/10], 5*time.Millisecond, "script calls held Redis too long")
	require.Less(t, took[len(took)-1], 25*time.Millisecond, "a script call held Redis too long")
}
