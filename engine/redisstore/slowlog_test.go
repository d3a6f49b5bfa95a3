package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
// every one under 25 (a single call of them all took 115 ms). SLOWLOG
// times a call by the wall clock, which a shared 2-core machine stretches
// when it preempts Redis mid-call (one call of 40 took 44 ms so); the work
// of a call does not change. So the batch runs three times, each on a key
// of its own, as the same calls on the same bucket states, and each call
// counts its least time of the three.
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
	const n, runs = 10_000, 3
	took := leastCallTimes(t, c, s, n, runs, func(string) {}, func(l redis.SlowLog) {
		var keys int
		_, err := fmt.Sscan(l.Args[2], &keys)
		require.NoError(t, err, "%v", l.Args)
		require.LessOrEqual(t, keys-3, redisstore.ChunkSize, "a call of %d requests", keys-3)
	})
	require.GreaterOrEqual(t, len(took), n/redisstore.ChunkSize)
	slices.Sort(took)
	t.Logf("%d requests on one key: %d script calls, least of %d runs: median %s, longest %s", n, len(took), runs, took[len(took)/2], took[len(took)-1])
	// A call takes ~0.3 ms alone.
	require.Less(t, took[len(took)/2], 2*time.Millisecond, "the median script call held Redis too long")
	require.Less(t, took[len(took)*9/10], 5*time.Millisecond, "script calls held Redis too long")
	require.Less(t, took[len(took)-1], 25*time.Millisecond, "a script call held Redis too long")
}

// leastCallTimes runs a batch of n requests of cost 1 on one key, runs
// times, each on a key of its own ("hot" and the run), which prepare
// readies first, and requires each decided as the first 5,000 admitted. It
// returns each script call's least time in SLOWLOG (of c, the store's
// private server) over the runs, in the order sent, after giving check
// each call's entry.
func leastCallTimes(t *testing.T, c *redis.Client, s *redisstore.Store, n, runs int, prepare func(key string), check func(redis.SlowLog)) []time.Duration {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
	require.NoError(t, c.ConfigSet(ctx, "slowlog-max-len", "10000").Err())
	defer func() { require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err()) }()
	var took []time.Duration
	for run := range runs {
		key := fmt.Sprint("hot", run)
		prepare(key)
		require.NoError(t, c.Do(ctx, "SLOWLOG", "RESET").Err())
		reqs := make([]engine.Request, n)
		for i := range reqs {
			reqs[i] = engine.Request{Key: key, Cost: 1}
		}
		out := make([]engine.Result, n)
		require.NoError(t, s.AllowBatch(ctx, reqs, out))
		for i, r := range out {
			require.NoError(t, r.Err, "request %d", i)
			require.Equal(t, i < 5000, r.Decision.Allowed, "request %d: %+v", i, r.Decision)
		}
		logs, err := c.SlowLogGet(ctx, 10_000).Result()
		require.NoError(t, err)
		slices.Reverse(logs) // SLOWLOG GET gives the newest first
		var calls []time.Duration
		for _, l := range logs {
			if len(l.Args) >= 3 && (l.Args[0] == "fcall" || l.Args[0] == "evalsha") {
				check(l)
				calls = append(calls, l.Duration)
			}
		}
		if run == 0 {
			took = calls
			continue
		}
		require.Len(t, calls, len(took), "run %d: the same calls as the first", run)
		for i, d := range calls {
			took[i] = min(took[i], d)
		}
	}
	return took
}
