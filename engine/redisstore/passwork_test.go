package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestPassCallsBounded: the script calls of a pass over the keyspace (here
// a lengthening cutover's, which brings every bucket through the cutover)
// hold Redis about as long as a batch's calls of ChunkSize requests on the
// fast path, not many times as long: each bucket a pass brings up to date
// replays a cutover, which costs the script several fast-path requests,
// and counts as such in the bound on a call's work (calls of ChunkSize
// such buckets held Redis 15 ms on average, up to 116 ms, stalling every
// other call meanwhile). SLOWLOG of a private server times each call; a
// loaded machine stretches both kinds alike, so the test compares their
// medians, each the least of three runs.
func TestPassCallsBounded(t *testing.T) {
	skipUnderRace(t)
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
	require.NoError(t, c.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
	const n = 16 * redisstore.ChunkSize
	calls := func() []time.Duration {
		logs, err := c.SlowLogGet(ctx, -1).Result()
		require.NoError(t, err)
		var took []time.Duration
		for _, l := range logs {
			if len(l.Args) > 1 && (l.Args[0] == "fcall" || l.Args[0] == "evalsha") {
				took = append(took, l.Duration)
			}
		}
		require.NoError(t, c.Do(ctx, "SLOWLOG", "RESET").Err())
		return took
	}
	median := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
	var batch, pass []time.Duration
	for run := range 3 {
		s := realStores(t, srv.Addr(), 1, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 1 << 30, TokensPerSecond: 1}, Timeout: 20 * time.Second})[0]
		reqs := make([]engine.Request, n)
		for i := range reqs {
			reqs[i] = engine.Request{Key: "k" + strconv.Itoa(i), Cost: 5}
		}
		out := make([]engine.Result, n)
		require.NoError(t, s.AllowBatch(ctx, reqs, out)) // the buckets made, the script loaded
		calls()
		require.NoError(t, s.AllowBatch(ctx, reqs, out))
		b := calls()
		require.GreaterOrEqual(t, len(b), n/redisstore.ChunkSize)
		require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1 << 31, TokensPerSecond: 1}, 1)) // lengthens: a pass
		p := calls()
		require.GreaterOrEqual(t, len(p), n/redisstore.ChunkSize)
		bm, pm := median(b), median(p)
		t.Logf("run %d: %d batch calls, median %s; %d pass calls, median %s", run, len(b), bm, len(p), pm)
		batch, pass = append(batch, bm), append(pass, pm)
	}
	bm, pm := slices.Min(batch), slices.Min(pass)
	require.Less(t, pm, 2*bm, fmt.Sprintf("a pass's median call %s, a batch's %s", pm, bm))
}
