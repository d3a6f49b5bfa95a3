package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// tally counts results the way Stats does, from the caller's side.
type tally struct {
	mu      sync.Mutex
	allowed uint64
	denied  uint64
	errs    engine.Errors
	sent    uint64
}

func (t *tally) add(d engine.Decision, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent++
	switch {
	case err == nil && d.Allowed:
		t.allowed++
	case err == nil:
		t.denied++
	case errors.Is(err, engine.ErrInvalidKey):
		t.errs.InvalidKey++
	case errors.Is(err, engine.ErrInvalidCost):
		t.errs.InvalidCost++
	case errors.Is(err, engine.ErrClosed):
		t.errs.Closed++
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		t.errs.Context++
	case errors.Is(err, engine.ErrClockRegression):
		t.errs.ClockRegression++
	case errors.Is(err, engine.ErrKeyCapacity):
		t.errs.KeyCapacity++
	default:
		t.errs.Other++
	}
}

// TestStatsAddUp: goroutines send single and batched requests of every
// outcome — admitted, denied, bad key, bad cost (caller side and shard side),
// key bound, canceled context — and once they are done and the shards idle,
// Stats counts exactly what the callers saw, kind by kind.
func TestStatsAddUp(t *testing.T) {
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: shards, MaxKeys: 40})
				var got tally
				canceled, cancel := context.WithCancel(context.Background())
				cancel()
				var wg sync.WaitGroup
				for g := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx := context.Background()
						for i := range 200 {
							key := fmt.Sprintf("k%d", (g*7+i)%60) // 60 keys, 40 fit
							switch i % 10 {
							case 0:
								got.add(e.Allow(ctx, " ", 1))
							case 1:
								got.add(e.Allow(ctx, key, 0))
							case 2:
								got.add(e.Allow(ctx, key, 6)) // above capacity: the shard says so
							case 3:
								got.add(e.Allow(canceled, key, 1))
							case 4:
								reqs := []engine.Request{{Key: key, Cost: 1}, {Key: "", Cost: 1}, {Key: key, Cost: 9}, {Key: key + "x", Cost: 2}}
								out := make([]engine.Result, len(reqs))
								_ = e.AllowBatch(ctx, reqs, out)
								for _, r := range out {
									got.add(r.Decision, r.Err)
								}
							default:
								got.add(e.Allow(ctx, key, 1))
							}
						}
					}()
				}
				wg.Wait()
				synctest.Wait() // every shard has gone idle, and published
				st := e.Stats()
				assert.Equal(t, got.allowed, st.Total.Allowed)
				assert.Equal(t, got.denied, st.Total.Denied)
				assert.Equal(t, got.errs, st.Total.Errors)
				assert.Equal(t, got.sent, st.Total.Allowed+st.Total.Denied+st.Total.Errors.Sum())
				assert.NotZero(t, got.errs.KeyCapacity, "the key bound was reached")
				assert.NotZero(t, got.denied)
				assert.Equal(t, int64(e.KeyCount()), st.Total.Keys)
				assert.Len(t, st.Shards, shards)
				var sum uint64
				for _, s := range st.Shards {
					sum += s.Allowed + s.Denied + s.Errors.Sum()
				}
				assert.Equal(t, got.sent, sum+st.Caller.Sum(), "shards and caller add up to the total")
				assert.Equal(t, got.errs.InvalidKey, st.Caller.InvalidKey, "bad keys never reach a shard")
			})
		})
	}
}

// TestStatsCountACallBeforeItReturns: a call is counted by the time it
// returns, so Stats read right after it (no Close, no idle shard) counts it
// and every call that returned before: after each call of one goroutine,
// Stats equals what it saw, exactly; with 8 goroutines, what each saw is
// never ahead of Stats, and the totals match once they have all returned.
func TestStatsCountACallBeforeItReturns(t *testing.T) {
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 3, MaxKeys: 40, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	defer e.Close()
	counted := func() (decided, errs uint64) {
		st := e.Stats()
		return st.Total.Allowed + st.Total.Denied, st.Total.Errors.Sum()
	}
	// call makes call i of goroutine g on key, and tallies what it returned.
	call := func(got *tally, g, i int) {
		ctx := context.Background()
		key := fmt.Sprintf("k%d", (g*7+i)%60) // 60 keys, 40 fit
		switch i % 6 {
		case 0:
			got.add(e.Allow(ctx, key, 1+int64(i%7))) // 6 and 7: above capacity
		case 1:
			got.add(e.Charge(ctx, key, 2))
		case 2:
			reqs := []engine.Request{{Key: key, Cost: 1}, {Key: key + "x", Cost: 9}, {Key: key, Cost: 2}}
			out := make([]engine.Result, len(reqs))
			_ = e.AllowBatch(ctx, reqs, out)
			for _, r := range out {
				got.add(r.Decision, r.Err)
			}
		case 3:
			reqs := []engine.Request{{Key: key, Cost: 1}, {Key: "k0", Cost: 1}, {Key: key, Cost: 1}}
			d, _, err := e.AllowAll(ctx, reqs)
			if err == nil { // each request is a decision; a failed call is counted apart
				for range reqs {
					got.add(d, nil)
				}
			}
		default:
			got.add(e.Allow(ctx, key, 1))
		}
	}
	var one tally
	for i := range 300 {
		call(&one, 0, i)
		decided, errs := counted()
		require.Equal(t, one.allowed+one.denied, decided, "call %d", i)
		require.Equal(t, one.errs.Sum(), errs, "call %d", i)
	}
	var all tally
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var mine tally
			for i := range 300 {
				call(&mine, g+1, i)
				decided, errs := counted()
				if decided+errs < one.sent+mine.sent {
					t.Errorf("goroutine %d, call %d: Stats count %d, the calls returned %d at least", g, i, decided+errs, one.sent+mine.sent)
					return
				}
			}
			all.mu.Lock()
			defer all.mu.Unlock()
			all.allowed, all.denied, all.sent = all.allowed+mine.allowed, all.denied+mine.denied, all.sent+mine.sent
		})
	}
	wg.Wait()
	decided, errs := counted()
	assert.Equal(t, one.sent+all.sent, decided+errs)
	assert.Equal(t, one.allowed+one.denied+all.allowed+all.denied, decided)
	assert.NotZero(t, one.errs.KeyCapacity, "the key bound was reached")
	assert.NotZero(t, one.errs.InvalidCost, "costs above capacity were refused")
	st := e.Stats().AllowAll
	assert.NotZero(t, st.Admitted)
	assert.NotZero(t, st.Refused)
}

// TestStatsLevelsBeforeReturn: the keys a call created (AllowAll's aside:
// its shards create them after it returns), the high-water mark of one
// request at a time, and an EvictFull's or a ReplacePolicy's counts, are in
// Stats read right after
// the call returns (no idle shard, no synctest.Wait), as KeyCount has
// them: Keys once lagged until the shard parked, and Cutovers until each
// shard switched after ReplacePolicy had returned. Repeated, since both
// were races the shards usually lost.
func TestStatsLevelsBeforeReturn(t *testing.T) {
	ctx := context.Background()
	for round := range 50 {
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 3, Clock: clk})
		require.NoError(t, err)
		keys := func(what string) {
			st := e.Stats()
			require.Equal(t, int64(e.KeyCount()), st.Total.Keys, "round %d, after %s", round, what)
			var sum int64
			for _, s := range st.Shards {
				sum += s.Keys
			}
			require.Equal(t, st.Total.Keys, sum, "round %d, after %s", round, what)
		}
		for i := range 4 {
			_, err := e.Allow(ctx, fmt.Sprintf("a%d", i), 1)
			require.NoError(t, err)
			keys("Allow")
			require.Equal(t, int64(1), e.Stats().Total.MailboxHighWater, "round %d: one request at a time", round)
		}
		_, err = e.Charge(ctx, "charged", 2)
		require.NoError(t, err)
		keys("Charge")
		out := make([]engine.Result, 2)
		require.NoError(t, e.AllowBatch(ctx, []engine.Request{{Key: "b0", Cost: 1}, {Key: "b1", Cost: 1}}, out))
		keys("AllowBatch")
		require.Equal(t, int64(7), e.Stats().Total.Keys)

		require.NoError(t, e.ReplacePolicy(ctx, pol(2, 5, 1), 1))
		st := e.Stats()
		require.Equal(t, uint64(3), st.Total.Cutovers, "round %d", round)
		for i, s := range st.Shards {
			require.Equal(t, uint64(1), s.Cutovers, "round %d, shard %d", round, i)
		}

		clk.Advance(10 * time.Second)
		_, err = e.Allow(ctx, "a0", 5) // a0 empty: kept by the sweep
		require.NoError(t, err)
		n, err := e.EvictFull(ctx)
		require.NoError(t, err)
		st = e.Stats()
		require.Equal(t, 6, n)
		require.Equal(t, uint64(n), st.Total.Evicted, "round %d", round)
		require.Equal(t, uint64(3), st.Total.Sweeps, "round %d", round)
		keys("EvictFull")
		require.NoError(t, e.Close())
	}
}

// TestStatsAfterClose: requests refused after Close are counted, and Stats
// keeps answering with the final counts.
func TestStatsAfterClose(t *testing.T) {
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Clock: clock.NewManual(0), Shards: 2})
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 10 {
		_, err := e.Allow(ctx, fmt.Sprintf("k%d", i%3), 2)
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	_, err = e.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, engine.ErrClosed)
	st := e.Stats()
	assert.Equal(t, uint64(10), st.Total.Allowed+st.Total.Denied)
	assert.Equal(t, uint64(1), st.Total.Errors.Closed)
	assert.Equal(t, int64(3), st.Total.Keys)
	assert.Zero(t, st.Total.MailboxDepth)
}

// TestStatsAdmin: cutovers, sweeps, evictions, peeks and refunds are
// counted, per shard and in total.
func TestStatsAdmin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: 3})
		ctx := context.Background()
		for i := range 30 {
			_, err := e.Allow(ctx, fmt.Sprintf("k%d", i), 1)
			require.NoError(t, err)
		}
		_, _ = e.Peek(ctx, "k1")
		_, _ = e.Refund(ctx, "k2", 1)
		require.NoError(t, e.ReplacePolicy(ctx, pol(2, 5, 1), 1))
		clk.Set(int64(time.Second))
		n, err := e.EvictFull(ctx)
		require.NoError(t, err)
		synctest.Wait()
		st := e.Stats()
		assert.Equal(t, uint64(n), st.Total.Evicted)
		assert.Equal(t, uint64(30), st.Total.Evicted)
		assert.Equal(t, uint64(3), st.Total.Cutovers, "each shard took part")
		assert.Equal(t, uint64(3), st.Total.Sweeps)
		assert.Equal(t, uint64(1), st.Total.Peeks)
		assert.Equal(t, uint64(1), st.Total.Refunds)
		assert.Equal(t, uint64(30), st.Total.Allowed, "peeks and refunds are not decisions")
		assert.Zero(t, st.Total.Keys)
		assert.GreaterOrEqual(t, st.Total.MailboxHighWater, int64(1))
	})
}

// backwardClock steps back once, after a given number of readings.
type backwardClock struct {
	n     atomic.Int64
	after int64
}

func (c *backwardClock) Now() int64 {
	if c.n.Add(1) > c.after {
		return 0
	}
	return int64(time.Hour)
}

// TestStatsSweepFailures: a background sweep that fails is counted.
func TestStatsSweepFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &backwardClock{after: 1}
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Clock: clk, Shards: 1, SweepEvery: time.Second})
		require.NoError(t, err)
		defer e.Close()
		_, err = e.Allow(context.Background(), "k", 1) // reading 1: an hour in
		require.NoError(t, err)
		for range 3 { // three ticks of the sweeper, each reading 0
			<-time.After(time.Second) // fake time in the bubble
			synctest.Wait()
		}
		assert.Equal(t, uint64(3), e.Stats().SweepFailures)
	})
}

// TestEventsNeverBlockAdmission: with a consumer that never returns, every
// request is still decided, and every sampled event that found the buffer
// full is counted as dropped.
func TestEventsNeverBlockAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var delivered atomic.Int64
		e, _ := newEngine(t, engine.Config{
			Policy: pol(1, 1000, 1), Shards: 2, EventEvery: 1, EventBuffer: 4,
			Events: func(engine.Event) {
				delivered.Add(1)
				<-release // never reads on, until the test ends
			},
		})
		defer close(release) // before the engine's Close (LIFO), so Close can return
		ctx := context.Background()
		for i := range 100 {
			d, err := e.Allow(ctx, fmt.Sprintf("k%d", i%5), 1)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		synctest.Wait()
		st := e.Stats()
		assert.Equal(t, int64(1), delivered.Load(), "the consumer took one and sits on it")
		assert.Equal(t, uint64(100-1-4), st.Total.EventsDropped, "one delivered, four buffered, the rest dropped")
	})
}

// TestEventsDroppedBeforeReturn: a call whose sampled event found the
// buffer full has its drop in Stats read right after it returns (no idle
// shard, no synctest.Wait): the drop count was once stored only when the
// shard parked, so a consumer that never reads showed no drops yet.
func TestEventsDroppedBeforeReturn(t *testing.T) {
	ctx := context.Background()
	for round := range 30 {
		release, took := make(chan struct{}), make(chan struct{})
		var once sync.Once
		e, err := engine.New(engine.Config{
			Policy: pol(1, 1000, 1), Shards: 1, EventEvery: 1, EventBuffer: 4, Clock: clock.NewManual(0),
			Events: func(engine.Event) {
				once.Do(func() { close(took) })
				<-release // never reads on, until the round ends
			},
		})
		require.NoError(t, err)
		_, err = e.Allow(ctx, "k", 1)
		require.NoError(t, err)
		<-took // the consumer sits on the first event
		for i := range 4 {
			_, err := e.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Zero(t, e.Stats().Total.EventsDropped, "round %d: event %d fits the buffer", round, i+2)
		}
		for i := range 10 {
			_, err := e.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, uint64(i+1), e.Stats().Total.EventsDropped, "round %d", round)
		}
		close(release)
		require.NoError(t, e.Close())
	}
}

// TestEventsSample: every EventEvery-th decision arrives with its key, cost,
// answer, shard and reading.
func TestEventsSample(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []engine.Event
		e, clk := newEngine(t, engine.Config{
			Policy: pol(7, 10, 1), Shards: 1, EventEvery: 3,
			Events: func(ev engine.Event) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, ev)
			},
		})
		clk.Set(42)
		ctx := context.Background()
		costs := []int64{1, 2, 3, 4, 5, 6, 7, 8, 11} // the last is above capacity
		for i, c := range costs {
			_, _ = e.Allow(ctx, fmt.Sprintf("key%d", i), c)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, 3)
		for j, ev := range got {
			i := 3*j + 2 // the third, sixth and ninth
			assert.Equal(t, fmt.Sprintf("key%d", i), ev.Key)
			assert.Equal(t, costs[i], ev.Cost)
			assert.Equal(t, int64(42), ev.Reading)
			assert.Equal(t, 0, ev.Shard)
			if ev.Err == nil {
				assert.Equal(t, int64(7), ev.Decision.Version)
			}
		}
		assert.True(t, got[0].Decision.Allowed)
		assert.ErrorIs(t, got[2].Err, engine.ErrInvalidCost, "errors are sampled too")
	})
}

// TestStatsIdle: what an idle shard did last is published before it parks:
// a cutover, and the keys a restored engine starts with.
func TestStatsIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: 2})
		ctx := context.Background()
		for i := range 10 {
			_, err := e.Allow(ctx, fmt.Sprintf("k%d", i), 1)
			require.NoError(t, err)
		}
		synctest.Wait()
		require.NoError(t, e.ReplacePolicy(ctx, pol(2, 5, 1), 1))
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().Total.Cutovers)

		var buf bytes.Buffer
		require.NoError(t, e.Snapshot(ctx, &buf))
		r, _, err := engine.Restore(engine.Config{Policy: pol(2, 5, 1), Shards: 3, Clock: clock.NewManual(0)}, &buf, engine.RestoreOptions{})
		require.NoError(t, err)
		defer r.Close()
		synctest.Wait()
		assert.Equal(t, int64(10), r.Stats().Total.Keys)
	})
}
