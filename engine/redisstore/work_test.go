package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestBigBatchOffFastPathBoundedCalls: a 10,000-request single-key batch
// of a limit the fast path does not take (limbs: capacity 2^62; bands:
// four of them), whose requests cost the script 8 to 25 times a fast-path
// one, is still split into calls that hold Redis about as long as the fast
// path's (SLOWLOG of a private server): the median under 2 ms, nine in ten
// under 5 (calls were split by request count: 4 ms and 12 ms each). The
// batch is decided exactly: the first 5,000 admitted. SLOWLOG times a call
// by the wall clock, which a loaded machine stretches when it preempts
// Redis mid-call, as TestBigSingleKeyBatchBoundedCalls says: the batch runs
// three times, each on a key of its own in the same state, and each call
// counts its least time of the three. One caller's batches, as in
// TestBigBatchesMatchEngine: not under the race detector, which watches the
// same splitting in TestBigSingleKeyBatchBoundedCalls.
func TestBigBatchOffFastPathBoundedCalls(t *testing.T) {
	skipUnderRace(t)
	bands, err := policy.NewBands(
		policy.Band{Name: "m", Capacity: 1 << 60, Refill: policy.PerMinute(1 << 40)},
		policy.Band{Name: "h", Capacity: 1 << 61, Refill: policy.Rate{Tokens: 1 << 41, Per: time.Hour}},
		policy.Band{Name: "d", Capacity: 1 << 62, Refill: policy.Rate{Tokens: 1 << 42, Per: 24 * time.Hour}},
	)
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		p     policy.Policy
		least int64 // the smallest capacity of its bands
	}{
		{"limbs", policy.Policy{Version: 1, Capacity: 1 << 62, TokensPerSecond: 3}, 1 << 62},
		{"bands", policy.Policy{Version: 1, Capacity: 1 << 62, TokensPerSecond: 3, Bands: bands}, 1 << 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startPrivate(t)
			c := client(t, srv.Addr())
			ctx := context.Background()
			s := realStores(t, srv.Addr(), 1, redisstore.Config{Policy: tc.p, Timeout: 20 * time.Second, Clock: clock.NewManual(1e18)})[0]
			_, err := s.Allow(ctx, "warm", 1)
			require.NoError(t, err)
			const n = 10_000
			took := leastCallTimes(t, c, s, n, 3, func(key string) {
				// leave 5,000 tokens in the smallest band
				d, err := s.Allow(ctx, key, tc.least-5000)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}, func(redis.SlowLog) {})
			slices.Sort(took)
			t.Logf("%d requests on one key: %d script calls, median %s, p90 %s, longest %s", n, len(took), took[len(took)/2], took[len(took)*9/10], took[len(took)-1])
			require.Less(t, took[len(took)/2], 2*time.Millisecond, "the median script call held Redis too long")
			require.Less(t, took[len(took)*9/10], 5*time.Millisecond, "script calls held Redis too long")
		})
	}
}
