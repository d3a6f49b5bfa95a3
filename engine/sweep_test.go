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
	"github.com/tokenshard/tokenshard/shard"
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

// TestEvictFullContextEndsInsideShardPass: on one shard holding several
// slices of full buckets, the context ends during the pass's first slice.
// The pass stops before its next slice: EvictFull returns what it removed
// so far with the context's error, instead of finishing the pass and
// returning nil, and what it did not reach is still tracked.
func TestEvictFullContextEndsInsideShardPass(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := &cancelOnRead{cancel: cancel}
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Clock: clk, Shards: 1})
	keys := 8 * shard.SliceSize
	reqs := make([]engine.Request, keys)
	for i := range reqs {
		reqs[i] = engine.Request{Key: fmt.Sprintf("k%d", i), Cost: 1}
	}
	out := make([]engine.Result, keys)
	require.NoError(t, e.AllowBatch(context.Background(), reqs, out))
	for _, r := range out {
		require.NoError(t, r.Err)
	}
	clk.Set(int64(time.Second)) // every bucket is full
	clk.armed.Store(true)       // the first slice's reading ends the context

	n, err := e.EvictFull(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Positive(t, n, "the slice that was running finishes and counts")
	assert.Less(t, n, keys, "no slice starts once the context has ended")
	assert.Equal(t, keys-n, e.KeyCount(), "what was not reported evicted is still tracked")

	n2, err := e.EvictFull(context.Background())
	require.NoError(t, err)
	assert.Equal(t, keys-n, n2, "the rest is still judged, and full")
	assert.Zero(t, e.KeyCount())
}

// stepClock advances one second every time it is read, so time passes
// between the slices of a sweep and between requests. It closes started at
// read number startAt.
type stepClock struct {
	clock.Manual
	reads   atomic.Int64
	startAt int64
	started chan struct{}
}

func (c *stepClock) Now() int64 {
	if c.reads.Add(1) == c.startAt {
		close(c.started)
	}
	c.Advance(time.Second)
	return c.Manual.Now()
}

// TestEvictFullSlicedUnderLoad sweeps one shard holding several slices of
// buckets while callers create keys and drain others. Keys full when judged
// go; depleted keys and keys created during the sweep stay, even though the
// moving clock makes the new ones full before the sweep ends.
func TestEvictFullSlicedUnderLoad(t *testing.T) {
	full, depleted := 3*shard.SliceSize, 100
	clk := &stepClock{started: make(chan struct{})}
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1_000_000, 1), Clock: clk, Shards: 1})
	ctx := context.Background()
	reqs := make([]engine.Request, 0, full+depleted)
	for i := range full {
		reqs = append(reqs, engine.Request{Key: fmt.Sprintf("full%d", i), Cost: 1}) // full one read later
	}
	for i := range depleted {
		reqs = append(reqs, engine.Request{Key: fmt.Sprintf("deep%d", i), Cost: 1_000_000})
	}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, e.AllowBatch(ctx, reqs, out))
	for _, r := range out {
		require.NoError(t, r.Err)
	}

	// The sweep's first slice is the next read: callers start only once the
	// pass has begun, so every key they create is younger than the pass.
	clk.startAt = clk.reads.Load() + 1
	created := make(chan int, 4)
	stop := make(chan struct{})
	for w := range 4 {
		go func() {
			<-clk.started
			n := 0
			for {
				select {
				case <-stop:
					created <- n
					return
				default:
				}
				_, err := e.Allow(ctx, fmt.Sprintf("new%d-%d", w, n), 1)
				if err == nil {
					n++
				}
				_, _ = e.Allow(ctx, fmt.Sprintf("deep%d", n%depleted), 1)
			}
		}()
	}
	n, err := e.EvictFull(ctx)
	close(stop)
	total := 0
	for range 4 {
		total += <-created
	}
	require.NoError(t, err)
	assert.Equal(t, full, n, "exactly the keys full when judged")
	assert.Equal(t, depleted+total, e.KeyCount(), "depleted keys and keys created during the sweep remain")
	t.Logf("%d keys created during the sweep", total)
}

// gateClock blocks a read when armed until the test lets it go, so the test
// can hold a shard between two slices of a sweep.
type gateClock struct {
	clock.Manual
	reads   atomic.Int64
	holdAt  int64
	reached chan struct{}
	release chan struct{}
}

func (g *gateClock) Now() int64 {
	if g.reads.Add(1) == g.holdAt {
		close(g.reached)
		<-g.release
	}
	return g.Manual.Now()
}

// TestCloseDuringSlicedSweep: Close while a shard is between slices of a
// sweep answers the sweep with what it evicted so far and ErrClosed; nothing
// hangs and no goroutine is left.
func TestCloseDuringSlicedSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		keys := 20 * shard.SliceSize // several segments of the shard's table, a slice each
		clk := &gateClock{reached: make(chan struct{}), release: make(chan struct{})}
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), Clock: clk, Shards: 1})
		require.NoError(t, err)
		reqs := make([]engine.Request, keys)
		for i := range reqs {
			reqs[i] = engine.Request{Key: fmt.Sprintf("k%d", i), Cost: 1}
		}
		require.NoError(t, e.AllowBatch(context.Background(), reqs, make([]engine.Result, keys)))
		clk.Set(int64(time.Second)) // every key is full again
		// Reads so far: 1 for the batch. The sweep's slices read 2, 3, ...:
		// hold the third slice's read.
		clk.holdAt = clk.reads.Load() + 3

		type result struct {
			n   int
			err error
		}
		swept := make(chan result, 1)
		go func() {
			n, err := e.EvictFull(context.Background())
			swept <- result{n, err}
		}()
		<-clk.reached
		closed := make(chan error, 1)
		go func() { closed <- e.Close() }()
		synctest.Wait() // Close has closed stop and waits for the held shard
		close(clk.release)

		r := <-swept
		require.NoError(t, <-closed)
		assert.ErrorIs(t, r.err, engine.ErrClosed)
		// Three slices judged before the shard saw stop: some keys, not all.
		assert.Positive(t, r.n)
		assert.Less(t, r.n, keys)
		assert.Equal(t, keys-r.n, e.KeyCount())
	})
}
