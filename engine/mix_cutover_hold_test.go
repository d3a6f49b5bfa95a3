package engine_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestCutoverAddsBandWhileAllowAllHolds: a cutover that adds a band
// reaches a shard while an AllowAll holds a key there (its other part not
// yet answered: shard 1 stalls on the clock). The shard gives the hold up
// and the call starts over: at once, where it may be decided under the old
// policy before the cutover prepares, or, interrupted again, once the
// cutover has returned, under the new one. Either way the charged key
// keeps its balance in the primary band, the new band starts full (it
// only restricts), and the Decision carries the version that decided it.
// The clock reads 0 throughout.
func TestCutoverAddsBandWhileAllowAllHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, a, b := haPair(t)
		defer e.Close()
		ctx := context.Background()
		_, err := e.Charge(ctx, a, 3) // 2 left
		require.NoError(t, err)

		allowed := stallOn(ctx, e, clk, b) // shard 1 stalls on the clock
		type all struct {
			d   engine.Decision
			at  int
			err error
		}
		allDone := make(chan all, 1)
		go func() {
			d, at, err := e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 2}, {Key: b, Cost: 1}})
			allDone <- all{d, at, err}
		}()
		synctest.Wait() // shard 0 holds a
		next := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1,
			Bands: bands(t, policy.Band{Name: "x", Capacity: 3, Refill: policy.PerMinute(3)})}
		replaced := make(chan error, 1)
		go func() { replaced <- e.ReplacePolicy(ctx, next, 1) }()
		synctest.Wait() // shard 0 gave its hold up for the readiness check
		assert.Equal(t, uint64(1), e.Stats().Shards[0].HoldsAborted)
		close(clk.gate)
		require.NoError(t, <-allowed)
		require.NoError(t, <-replaced)
		r := <-allDone
		require.NoError(t, r.err)
		assert.Equal(t, 0, r.at)
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: r.d.Version, Limit: 5, ResetAfter: 5 * time.Second}, r.d,
			"a: 2 left in the primary band, all taken (under version 2, its new band x started full at 3)")
		// b: 5, less the Allow's token and the call's; under version 2 its
		// band x starts full at 3, and then the call takes one of it too.
		wantB := engine.Decision{Allowed: true, Remaining: 3, Version: 2, Limit: 5, ResetAfter: 2 * time.Second}
		if r.d.Version == 2 {
			wantB = engine.Decision{Allowed: true, Remaining: 2, Version: 2, Limit: 3, ResetAfter: 20 * time.Second, Band: "x"}
		}
		for key, want := range map[string]engine.Decision{
			a: {Remaining: 0, RetryAfter: time.Second, Version: 2, Limit: 5, ResetAfter: 5 * time.Second},
			b: wantB,
		} {
			d, err := e.Peek(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, want, d, "key %s", key)
		}
	})
}
