package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// gatedClock reads 0; gated, each read waits for one send on step (or for
// step to close).
type gatedClock struct {
	gated atomic.Bool
	step  chan struct{}
}

func (c *gatedClock) Now() int64 {
	if c.gated.Load() {
		<-c.step
	}
	return 0
}

// TestSweepKeepsAllowAllAndItsKeysWaiting pins the exception EvictFull's
// and AllowAll's docs state to a sweep holding no request up for more than
// one slice: an AllowAll part that reaches a shard being swept waits for
// the sweep to end, and so does an Allow for its key that comes after it,
// slice after slice; both are served once the sweep has ended. Neither
// counts in MailboxDepth meanwhile, as ShardStats says.
func TestSweepKeepsAllowAllAndItsKeysWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &gatedClock{step: make(chan struct{})}
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 1, Clock: clk, SweepEvery: -1})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		keys := longKeys(40 * 1024)
		fill(t, e, keys, 1) // none full: the sweep keeps them all
		k := keys[0]

		clk.gated.Store(true)
		swept := make(chan error, 1)
		go func() { _, err := e.EvictFull(ctx); swept <- err }()
		synctest.Wait() // the first slice waits on the clock
		allDone := make(chan error, 1)
		go func() { _, _, err := e.AllowAll(ctx, []engine.Request{{Key: k, Cost: 1}}); allDone <- err }()
		synctest.Wait()
		clk.step <- struct{}{} // the first slice; then the AllowAll's part waits for the sweep
		synctest.Wait()
		allowed := make(chan error, 1)
		go func() { _, err := e.Allow(ctx, k, 1); allowed <- err }()
		synctest.Wait()
		readings := 0
		for len(swept) == 0 {
			require.Zero(t, len(allowed), "the Allow was answered during the sweep, after %d readings", readings)
			clk.step <- struct{}{}
			synctest.Wait()
			readings++
		}
		require.Greater(t, readings, 3, "the sweep took several slices")
		assert.Zero(t, e.Stats().Shards[0].MailboxDepth, "taken, and kept waiting: not in the depth, as Stats says")
		assert.Zero(t, len(allowed), "the Allow waits for the sweep")
		assert.Zero(t, len(allDone), "the AllowAll waits for the sweep")
		close(clk.step)
		require.NoError(t, <-swept)
		require.NoError(t, <-allDone)
		require.NoError(t, <-allowed)
		d, err := e.Peek(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, int64(2), d.Remaining, "both took their token")
	})
}
