package engine_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// TestStatsKeysOfAllowAll pins what Stats says of the keys an AllowAll
// creates: KeyCount counts them as the call returns, and Stats' Keys by
// the shard's next answer (here, to an Allow of a key it already tracks,
// read right after that Allow returns), or else once it parks.
func TestStatsKeysOfAllowAll(t *testing.T) {
	ctx := context.Background()
	t.Run("next answer", func(t *testing.T) {
		for round := range 50 {
			e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 1, Clock: clock.NewManual(0)})
			require.NoError(t, err)
			_, err = e.Allow(ctx, "old", 1)
			require.NoError(t, err)
			d, _, err := e.AllowAll(ctx, []engine.Request{{Key: "x", Cost: 1}, {Key: "y", Cost: 2}})
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, 3, e.KeyCount(), "round %d: counted as the call returns", round)
			_, err = e.Allow(ctx, "old", 1)
			require.NoError(t, err)
			require.Equal(t, int64(3), e.Stats().Total.Keys, "round %d: published by the next answer", round)
			require.NoError(t, e.Close())
		}
	})
	t.Run("park", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 3, Clock: clock.NewManual(0)})
			require.NoError(t, err)
			defer e.Close()
			reqs := []engine.Request{{Key: "x", Cost: 1}, {Key: "y", Cost: 1}, {Key: "z", Cost: 1}, {Key: "w", Cost: 1}}
			d, _, err := e.AllowAll(ctx, reqs)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, 4, e.KeyCount())
			synctest.Wait() // every shard parks
			st := e.Stats()
			require.Equal(t, int64(4), st.Total.Keys)
			var sum int64
			for _, s := range st.Shards {
				sum += s.Keys
			}
			require.Equal(t, int64(4), sum)
		})
	})
}
