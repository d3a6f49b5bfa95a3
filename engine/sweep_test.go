package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// TestSweepEvery runs the background sweep under synctest's fake time, which
// drives its ticker: each tick evicts exactly the buckets that are full at
// the shard's Manual clock, and never a depleted one.
func TestSweepEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 2), Clock: clk, Shards: 4, SweepEvery: time.Second})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()

		_, err = e.Allow(ctx, "light", 1)
		require.NoError(t, err)
		_, err = e.Allow(ctx, "heavy", 10)
		require.NoError(t, err)

		clk.Set(int64(time.Second)) // light is full, heavy holds 2 tokens
		<-time.After(time.Second)   // fake time: one tick
		synctest.Wait()
		assert.Equal(t, 1, e.KeyCount(), "the tick evicts light only")

		clk.Set(int64(5 * time.Second)) // heavy is full too
		<-time.After(time.Second)
		synctest.Wait()
		assert.Equal(t, 0, e.KeyCount())

		// Sweeps do not count toward EvictFull's own answer.
		n, err := e.EvictFull(ctx)
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}

// cancelOnRead is a clock that cancels a context the first time a shard
// reads it after being armed: a deterministic "context ends part-way".
type cancelOnRead struct {
	clock.Manual
	armed  atomic.Bool
	cancel context.CancelFunc
}

func (c *cancelOnRead) Now() int64 {
	if c.armed.CompareAndSwap(true, false) {
		c.cancel()
	}
	return c.Manual.Now()
}

// TestEvictFullContextEndsPartWay: the context ends while the first shard
// sweeps, so EvictFull returns what that shard evicted with the context's
// error, and the other shards keep their buckets.
func TestEvictFullContextEndsPartWay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := &cancelOnRead{cancel: cancel}
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Clock: clk, Shards: 4})
	const keys = 100
	for i := range keys {
		_, err := e.Allow(context.Background(), fmt.Sprintf("k%d", i), 1)
		require.NoError(t, err)
	}
	clk.Set(int64(time.Second)) // every bucket is full
	clk.armed.Store(true)

	n, err := e.EvictFull(ctx)
	require.ErrorIs(t, err, context.Canceled)
	// With 100 keys over 4 seeded shards, the first shard holds some but not
	// all of them (the chance it holds none or all is below 1e-12).
	assert.Positive(t, n)
	assert.Less(t, n, keys)
	assert.Equal(t, keys-n, e.KeyCount(), "what was not reported evicted is still tracked")

	n2, err := e.EvictFull(context.Background())
	require.NoError(t, err)
	assert.Equal(t, keys-n, n2)
	assert.Zero(t, e.KeyCount())
}
