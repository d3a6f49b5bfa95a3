package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestBigBatchesMatchEngine: batches of up to 1500 requests over few
// keys (one key with far more than ChunkSize requests), with cutovers that
// add and drop overrides in between (buckets behind overridden versions
// need chains; a call's requests have up to 15 limits), against the engine
// on the same clock.
func TestBigBatchesMatchEngine(t *testing.T) {
	skipUnderRace(t)
	exactBalances(t)
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 3))
			clk := clock.NewManual(0)
			p := policy.Policy{Version: 1, Capacity: 50, TokensPerSecond: 7}
			e, err := engine.New(engine.Config{Policy: p, Clock: clk, Shards: 1})
			require.NoError(t, err)
			defer e.Close()
			s := newStore(t, redisstore.Config{Policy: p}, clk)
			ctx := context.Background()
			nkeys := 400
			for round := range 40 {
				switch r.IntN(4) {
				case 0:
					clk.Advance(time.Duration(r.Int64N(3e9)))
				case 1:
					v := p.Version + 1
					var ov *policy.OverrideSet
					if r.IntN(2) == 0 {
						// up to 10 patterns and 4 exact keys: a call's
						// requests then have up to 15 limits
						var ovs []policy.Override
						for j := range 1 + r.IntN(14) {
							m := fmt.Sprintf("k%d*", j)
							if j >= 10 {
								m = fmt.Sprint("k", r.IntN(nkeys))
							}
							ovs = append(ovs, policy.Override{Match: m, Capacity: 1 + r.Int64N(60), TokensPerSecond: 1 + r.Int64N(9)})
						}
						ov, err = policy.NewOverrideSet(ovs...)
						require.NoError(t, err)
					}
					next := policy.Policy{Version: v, Capacity: 1 + r.Int64N(60), TokensPerSecond: 1 + r.Int64N(9), Overrides: ov}
					require.NoError(t, e.ReplacePolicy(ctx, next, p.Version))
					require.NoError(t, s.ReplacePolicy(ctx, next, p.Version))
					p = next
				}
				n := 1 + r.IntN(1500)
				reqs := make([]engine.Request, n)
				for i := range reqs {
					k := fmt.Sprint("k", r.IntN(nkeys))
					if r.IntN(3) == 0 {
						k = "hot"
					}
					reqs[i] = engine.Request{Key: k, Cost: 1 + r.Int64N(5)}
				}
				want := make([]engine.Result, n)
				got := make([]engine.Result, n)
				require.NoError(t, e.AllowBatch(ctx, reqs, want))
				require.NoError(t, s.AllowBatch(ctx, reqs, got))
				for i := range reqs {
					require.Equal(t, want[i], got[i], "round %d request %d %+v", round, i, reqs[i])
				}
			}
			require.Zero(t, s.Stats().Failures)
		})
	}
}
