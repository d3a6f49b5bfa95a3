package engine_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// TestSweepHoldsNoKeyForAllowAll: an AllowAll that meets a shard being
// swept holds no key meanwhile, on that shard or another, and starts over
// once the sweep is done, as AllowAll's and EvictFull's docs say: so a
// sweep holds no request up for more than one slice, not even one for a
// key the call names on a shard it has held. Here shard 0 has been swept,
// shard 1 is being swept (one slice per reading of the clock), and an
// Allow for the call's key on shard 0 is answered while the sweep goes
// on; the call admits once EvictFull has returned.
func TestSweepHoldsNoKeyForAllowAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &scGateClock{gate: make(chan struct{})}
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 2, Clock: clk, SweepEvery: -1})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		keys := longKeys(80 * 1024)
		fill(t, e, keys, 1) // none full: the sweep keeps them all
		var on [2]string    // a key of each shard
		for _, k := range keys {
			if i := e.ShardOf(k); on[i] == "" {
				on[i] = k
			}
		}
		step := func() {
			clk.gate <- struct{}{}
			synctest.Wait()
		}

		clk.armed.Store(true)
		swept := make(chan error, 1)
		go func() { _, err := e.EvictFull(ctx); swept <- err }()
		synctest.Wait()
		for e.Stats().Shards[0].Sweeps == 0 {
			step()
		}
		step() // shard 1's first slice
		type answer struct {
			d   engine.Decision
			err error
		}
		all := make(chan answer, 1)
		go func() {
			d, _, err := e.AllowAll(ctx, []engine.Request{{Key: on[0], Cost: 1}, {Key: on[1], Cost: 1}})
			all <- answer{d, err}
		}()
		synctest.Wait()
		for range 8 { // readings enough for the call to hold on shard 0 and meet shard 1
			step()
		}
		allowed := make(chan answer, 1)
		go func() { d, err := e.Allow(ctx, on[0], 1); allowed <- answer{d, err} }()
		synctest.Wait()
		readings := 0 // the sweep's slices, and the call's holds on shard 0
		for len(allowed) == 0 {
			require.Zero(t, len(swept), "the Allow waited for the whole sweep")
			step()
			readings++
		}
		require.Less(t, readings, 10, "the Allow waited for slice after slice")
		a := <-allowed
		require.NoError(t, a.err)
		assert.True(t, a.d.Allowed)
		assert.Zero(t, len(swept), "the sweep goes on")
		assert.Zero(t, len(all), "the AllowAll waits for the sweep to be done")
		close(clk.gate)
		require.NoError(t, <-swept)
		r := <-all
		require.NoError(t, r.err)
		assert.True(t, r.d.Allowed)
		for i, want := range []int64{2, 3} { // spent: the fill, the AllowAll, and on shard 0 the Allow
			d, err := e.Peek(ctx, on[i])
			require.NoError(t, err)
			assert.Equal(t, want, d.Remaining, "shard %d's key", i)
		}
		assert.Equal(t, uint64(1), e.Stats().AllowAll.Admitted)
	})
}

// TestWaitAnsweredPastDeadline pins Wait's doc: it never sleeps past its
// context's deadline, but a decision it asked for that the shard has taken
// is answered as an Allow's is, whatever the context does. Here the shard
// has the request and waits for a clock reading past the deadline; Wait
// then returns the admission, not the context's error.
func TestWaitAnsweredPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &scGateClock{gate: make(chan struct{})}
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 1, Clock: clk, SweepEvery: -1})
		require.NoError(t, err)
		defer e.Close()
		clk.armed.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		type answer struct {
			d   engine.Decision
			err error
		}
		waited := make(chan answer, 1)
		go func() { d, err := e.Wait(ctx, "k", 1); waited <- answer{d, err} }()
		synctest.Wait() // the request is queued, and the shard waits for a reading to decide it
		<-ctx.Done()    // the bubble's time passes the deadline
		synctest.Wait()
		require.Zero(t, len(waited), "the shard has the request: Wait waits for its answer")
		close(clk.gate)
		r := <-waited
		require.NoError(t, r.err)
		assert.True(t, r.d.Allowed)
	})
}
