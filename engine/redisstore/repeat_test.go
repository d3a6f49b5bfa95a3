package redisstore_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestRepeatedKeyBatchLinear: a batch of one key repeated n times costs the
// client about the same per request whatever n: its requests past the first
// ChunkSize go in later rounds, and each round takes its own requests
// rather than sorting every request still held (which made 100,000
// requests take 1.3 s and 200,000 take 7 s, with the bytes the client
// allocated per request growing with n). Bytes allocated, unlike time, do
// not depend on how loaded the machine is: those per request of 80
// ChunkSizes stay within twice those of 8.
func TestRepeatedKeyBatchLinear(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1},
		Timeout: 30 * time.Second}, clock.NewManual(1e9))
	perRequest := func(key string, n int) float64 {
		reqs := make([]engine.Request, n)
		for i := range reqs {
			reqs[i] = engine.Request{Key: key, Cost: 1}
		}
		out := make([]engine.Result, n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		require.NoError(t, s.AllowBatch(ctx, reqs, out))
		runtime.ReadMemStats(&after)
		for i, r := range out {
			require.NoError(t, r.Err, "request %d", i)
			require.True(t, r.Decision.Allowed, "request %d: %+v", i, r.Decision)
			require.False(t, r.Decision.Degraded, "request %d: %+v", i, r.Decision)
		}
		return float64(after.TotalAlloc-before.TotalAlloc) / float64(n)
	}
	small := perRequest("small", 8*redisstore.ChunkSize)
	big := perRequest("big", 80*redisstore.ChunkSize)
	t.Logf("bytes allocated per request: %.0f for %d requests, %.0f for %d", small, 8*redisstore.ChunkSize, big, 80*redisstore.ChunkSize)
	require.Less(t, big, 2*small, "the client's cost per request grows with the batch")
}
