package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// haStallClock reads 0; armed, it stalls the first reader that comes until
// gate is closed, and no other.
type haStallClock struct {
	armed atomic.Bool
	gate  chan struct{}
}

func (c *haStallClock) Now() int64 {
	if c.armed.CompareAndSwap(true, false) {
		<-c.gate
	}
	return 0
}

// haPair starts an engine of two shards on a haStallClock (no background
// sweeps: the clock is not the system's) and returns it, its clock, and a
// key of each shard: a on shard 0, b on shard 1. Close it when done.
func haPair(t *testing.T) (e *engine.Engine, clk *haStallClock, a, b string) {
	clk = &haStallClock{gate: make(chan struct{})}
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 2, Clock: clk})
	require.NoError(t, err)
	var onShard [2]string
	for i := 0; onShard[0] == "" || onShard[1] == ""; i++ {
		if k := fmt.Sprint("k", i); onShard[e.ShardOf(k)] == "" {
			onShard[e.ShardOf(k)] = k
		}
	}
	return e, clk, onShard[0], onShard[1]
}

// stallOn arms clk and sends an Allow of b, whose shard then stalls on the
// clock until clk.gate closes; the Allow's error comes on the channel.
func stallOn(ctx context.Context, e *engine.Engine, clk *haStallClock, b string) <-chan error {
	clk.armed.Store(true)
	allowed := make(chan error, 1)
	go func() { _, err := e.Allow(ctx, b, 1); allowed <- err }()
	synctest.Wait()
	return allowed
}

// TestStatsHoldsAbortedWhenIdle: a hold a shard gives up for a control
// message is counted in HoldsAborted by the time the shard idles, as Stats
// promises for the counts of background work. Here shard 0 holds an
// AllowAll's key while shard 1, stalled on the clock, has not answered the
// call's other part; a ReplacePolicy's readiness check makes shard 0 give
// its hold up, and then gives up itself on shard 1. The AllowAll's context
// has ended, so it does not try again, and nothing else reaches shard 0.
// Before the fix the give-up was counted but never published until the
// shard served something else (or closed): an idle shard's Stats said 0.
func TestStatsHoldsAbortedWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, a, b := haPair(t)
		defer e.Close()
		ctx := context.Background()

		allowed := stallOn(ctx, e, clk, b) // shard 1 stalls on the clock, deciding b
		allCtx, allCancel := context.WithCancel(ctx)
		allDone := make(chan error, 1)
		go func() {
			_, _, err := e.AllowAll(allCtx, []engine.Request{{Key: a, Cost: 1}, {Key: b, Cost: 1}})
			allDone <- err
		}()
		synctest.Wait() // shard 0 holds a; the part for b waits behind the stall
		repCtx, repCancel := context.WithCancel(ctx)
		replaced := make(chan error, 1)
		go func() { replaced <- e.ReplacePolicy(repCtx, pol(2, 5, 1), 1) }()
		synctest.Wait() // shard 0 gave its hold up for the readiness check; shard 1 has not taken its own
		repCancel()
		require.ErrorIs(t, <-replaced, context.Canceled)
		allCancel()
		close(clk.gate)
		require.NoError(t, <-allowed)
		require.ErrorIs(t, <-allDone, context.Canceled, "the call could not claim shard 0's hold, and its context ended before it tried again")
		synctest.Wait() // both shards idle

		st := e.Stats()
		assert.Equal(t, uint64(1), st.Shards[0].Holds)
		assert.Equal(t, uint64(1), st.Shards[0].HoldsAborted, "given up for the readiness check")
		assert.Equal(t, uint64(1), st.Shards[1].Holds)
		assert.Zero(t, st.Shards[1].HoldsAborted, "ended by its caller, not given up")
		assert.Equal(t, engine.Errors{Context: 1}, st.AllowAll.Errors)
	})
}

// TestStatsWaitingBehindHold: the requests a shard has taken and keeps
// aside behind an AllowAll's hold are counted in Waiting while they wait,
// since MailboxDepth no longer counts them: a queue that grows behind a
// hold shows in Stats. Shard 0 holds a while shard 1, stalled on the
// clock, has not answered the call's other part.
func TestStatsWaitingBehindHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, a, b := haPair(t)
		defer e.Close()
		ctx := context.Background()

		allowed := stallOn(ctx, e, clk, b)
		allDone := make(chan error, 1)
		go func() {
			_, _, err := e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 1}, {Key: b, Cost: 1}})
			allDone <- err
		}()
		synctest.Wait() // shard 0 holds a
		done := make(chan error, 3)
		for range 3 {
			go func() { _, err := e.Allow(ctx, a, 1); done <- err }()
		}
		synctest.Wait()
		st := e.Stats()
		assert.Equal(t, int64(3), st.Shards[0].Waiting, "kept aside behind the hold")
		assert.Zero(t, st.Shards[0].MailboxDepth)
		assert.Equal(t, int64(3), st.Total.Waiting)

		close(clk.gate)
		require.NoError(t, <-allowed)
		require.NoError(t, <-allDone)
		for range 3 {
			require.NoError(t, <-done)
		}
		assert.Zero(t, e.Stats().Total.Waiting, "served once the hold ended")
	})
}
