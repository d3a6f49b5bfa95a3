package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

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

// sweepingWithAllowAll starts, in a synctest bubble, an EvictFull over
// one shard of many keys, none full, each of its slices waiting for a step
// of clk, and once its first slice is done, an AllowAll of one of those
// keys, k, whose part the shard keeps waiting for the sweep to end.
func sweepingWithAllowAll(t *testing.T) (e *engine.Engine, clk *gatedClock, k string, swept, allDone <-chan error) {
	clk = &gatedClock{step: make(chan struct{})}
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 1, Clock: clk, SweepEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	ctx := context.Background()
	keys := longKeys(40 * 1024)
	fill(t, e, keys, 1) // none full: the sweep keeps them all
	k = keys[0]

	clk.gated.Store(true)
	sw := make(chan error, 1)
	go func() { _, err := e.EvictFull(ctx); sw <- err }()
	synctest.Wait() // the first slice waits on the clock
	all := make(chan error, 1)
	go func() { _, _, err := e.AllowAll(ctx, []engine.Request{{Key: k, Cost: 1}}); all <- err }()
	synctest.Wait()
	clk.step <- struct{}{} // the first slice; then the AllowAll's part waits for the sweep
	synctest.Wait()
	return e, clk, k, sw, all
}

// TestSweepKeepsAllowAllAndItsKeysWaiting pins the exception EvictFull's
// and AllowAll's docs state to a sweep holding no request up for more than
// one slice: an AllowAll part that reaches a shard being swept waits for
// the sweep to end, and so does an Allow for its key that comes after it,
// slice after slice; both are served once the sweep has ended. Neither
// counts in MailboxDepth meanwhile, as ShardStats says.
func TestSweepKeepsAllowAllAndItsKeysWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, k, swept, allDone := sweepingWithAllowAll(t)
		ctx := context.Background()
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

// TestWaitAnsweredPastDeadlineBehindSweep pins Wait's doc: it never sleeps
// past its context's deadline, but a decision it asked for that the shard
// has taken is answered as an Allow's is, whatever the context does. Here
// the shard keeps the Wait's request waiting behind an AllowAll's part,
// which waits for a sweep, past the deadline; once the sweep ends, Wait
// returns the admission, not the context's error.
func TestWaitAnsweredPastDeadlineBehindSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, k, swept, allDone := sweepingWithAllowAll(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		type answer struct {
			d   engine.Decision
			err error
		}
		waited := make(chan answer, 1)
		go func() { d, err := e.Wait(ctx, k, 1); waited <- answer{d, err} }()
		synctest.Wait()
		for range 2 { // the second slice, then the reading the shard takes the request at
			clk.step <- struct{}{}
			synctest.Wait()
		}
		// The shard keeps the request waiting behind the AllowAll's part,
		// and is in its third slice.
		require.Zero(t, e.Stats().Shards[0].MailboxDepth, "the shard has taken the request")
		<-ctx.Done() // the bubble's time passes the deadline
		for range 3 {
			clk.step <- struct{}{}
			synctest.Wait()
			require.Zero(t, len(waited), "the shard has the request: Wait waits for its answer")
		}
		require.Zero(t, len(swept))
		close(clk.step)
		r := <-waited
		require.NoError(t, r.err)
		assert.True(t, r.d.Allowed)
		require.NoError(t, <-swept)
		require.NoError(t, <-allDone)
	})
}
