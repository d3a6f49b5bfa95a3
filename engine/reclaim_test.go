package engine_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// flood offers n distinct new keys of cost 1 and returns how many got a
// bucket; the rest must have met the key bound.
func flood(t *testing.T, e *engine.Engine, prefix string, n int) int {
	t.Helper()
	created := 0
	for i := range n {
		_, err := e.Allow(context.Background(), fmt.Sprintf("%s%d", prefix, i), 1)
		switch {
		case err == nil:
			created++
		default:
			require.ErrorIs(t, err, engine.ErrKeyCapacity)
		}
	}
	return created
}

// admitNew retries one new key, waiting each time as long as ReclaimAfter
// says, until it is admitted, and returns how long that took; it fails the
// test if that is longer than limit.
func admitNew(t *testing.T, e *engine.Engine, key string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		_, err := e.Allow(context.Background(), key, 1)
		if err == nil {
			return time.Since(start)
		}
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		d, ok := e.ReclaimAfter()
		require.True(t, ok, "a default engine reclaims in the background")
		require.Less(t, time.Since(start), limit, "the key table did not recover")
		<-time.After(max(d, time.Millisecond))
	}
}

// TestReclaimByDefault: with the default clock and no SweepEvery, a flood of
// 10 x MaxKeys distinct keys fills the table, and once the flood's buckets
// are full a new key is admitted within about a second, with no EvictFull
// call. Under synctest, so the real clock's time is the bubble's.
func TestReclaimByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys = 50
		// Capacity 2 at 4 tokens/s: a key that spent 1 is full 250 ms later.
		e, err := engine.New(engine.Config{Policy: pol(1, 2, 4), MaxKeys: maxKeys, Shards: 2})
		require.NoError(t, err)
		defer e.Close()

		require.Equal(t, maxKeys, flood(t, e, "flood", 10*maxKeys))
		require.Equal(t, maxKeys, e.KeyCount())
		<-time.After(250 * time.Millisecond) // every flood bucket is full now
		took := admitNew(t, e, "newcomer", 2*time.Second)
		t.Logf("a new key was admitted %v after the flood's buckets were full", took)
		assert.LessOrEqual(t, took, time.Second)
		assert.NotZero(t, e.Stats().PressureSweeps)
		assert.LessOrEqual(t, e.KeyCount(), maxKeys)
	})
}

// TestReclaimByDefaultRealTime is TestReclaimByDefault on the real clock,
// outside any bubble, as a service runs it: the flood's buckets are full
// 10 ms after it ends, and a new key must be admitted within about a
// second of that.
func TestReclaimByDefaultRealTime(t *testing.T) {
	const maxKeys = 200
	e, err := engine.New(engine.Config{Policy: pol(1, 1, 100), MaxKeys: maxKeys})
	require.NoError(t, err)
	defer e.Close()

	// On the real clock a flood bucket is full again 10 ms after its one
	// request, so on a slow machine the pressure sweeps may already make
	// room during the flood: at least the bound is created, never more
	// than it at once.
	require.GreaterOrEqual(t, flood(t, e, "flood", 10*maxKeys), maxKeys)
	require.LessOrEqual(t, e.KeyCount(), maxKeys)
	<-time.After(10 * time.Millisecond) // every flood bucket is full now
	took := admitNew(t, e, "newcomer", 5*time.Second)
	t.Logf("a new key was admitted %v after the flood's buckets were full", took)
	assert.LessOrEqual(t, took, 1500*time.Millisecond, "about a second")
}

// TestReclaimNeverEvictsDepleted: pressure sweeps under a flood that never
// lets a bucket refill evict nothing, however often new keys knock.
func TestReclaimNeverEvictsDepleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys = 20
		// Capacity 10 at 1 token/s: each key spends all 10, full 10 s later.
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), MaxKeys: maxKeys, Shards: 2})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		for i := range maxKeys {
			d, err := e.Allow(ctx, fmt.Sprintf("deep%d", i), 10)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		for range 20 { // 5 s of new keys knocking every 250 ms
			require.Zero(t, flood(t, e, "knock", 5))
			<-time.After(250 * time.Millisecond)
			synctest.Wait()
		}
		st := e.Stats()
		assert.Zero(t, st.Total.Evicted, "no depleted bucket is ever dropped")
		assert.Equal(t, maxKeys, e.KeyCount())
		for i := range maxKeys {
			d, err := e.Allow(ctx, fmt.Sprintf("deep%d", i), 10)
			require.NoError(t, err)
			assert.False(t, d.Allowed, "deep%d was reset to full", i)
		}
		// The first sweep saw that nothing is full before 10 s, so it was
		// the only pressure sweep in the first 5 s.
		assert.Equal(t, uint64(1), st.PressureSweeps)
	})
}

// TestNoReclaimWithManualClock: with a Manual clock and no SweepEvery,
// nothing is reclaimed unless asked, however long the table stays full, and
// EvictFull still frees what is full.
func TestNoReclaimWithManualClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys = 10
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 2, 4), MaxKeys: maxKeys, Shards: 2, Clock: clk})
		require.NoError(t, err)
		defer e.Close()
		require.Equal(t, maxKeys, flood(t, e, "flood", 10*maxKeys))
		clk.Advance(time.Hour) // every bucket is full
		<-time.After(time.Hour)
		require.Zero(t, flood(t, e, "more", 10))
		synctest.Wait()

		_, ok := e.ReclaimAfter()
		assert.False(t, ok)
		st := e.Stats()
		assert.Zero(t, st.Total.Sweeps)
		assert.Zero(t, st.PressureSweeps)
		assert.Equal(t, maxKeys, e.KeyCount())

		n, err := e.EvictFull(context.Background())
		require.NoError(t, err)
		assert.Equal(t, maxKeys, n)
	})
}

// TestNoReclaimWhenSweepEveryNegative: SweepEvery < 0 turns background
// sweeps off even on the real clock.
func TestNoReclaimWhenSweepEveryNegative(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys = 10
		e, err := engine.New(engine.Config{Policy: pol(1, 2, 4), MaxKeys: maxKeys, SweepEvery: -1})
		require.NoError(t, err)
		defer e.Close()
		require.Equal(t, maxKeys, flood(t, e, "flood", 10*maxKeys))
		<-time.After(2 * engine.DefaultSweepEvery)
		require.Zero(t, flood(t, e, "more", 10))
		synctest.Wait()

		_, ok := e.ReclaimAfter()
		assert.False(t, ok)
		assert.Zero(t, e.Stats().Total.Sweeps)
		assert.Equal(t, maxKeys, e.KeyCount())
	})
}

// TestDefaultSweepPeriod: with the real clock and no SweepEvery, idle full
// buckets are evicted by the first request decided DefaultSweepEvery or more
// after the engine started, with the table far from full; before that, and
// with no request, nothing runs (the period has no timer).
func TestDefaultSweepPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := engine.New(engine.Config{Policy: pol(1, 2, 4), Shards: 1})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		_, err = e.Allow(ctx, "idle", 1)
		require.NoError(t, err)
		<-time.After(engine.DefaultSweepEvery - time.Second)
		_, err = e.Allow(ctx, "busy", 1)
		require.NoError(t, err)
		synctest.Wait()
		require.Equal(t, 2, e.KeyCount(), "no sweep before the period")

		<-time.After(time.Hour)
		synctest.Wait()
		require.Equal(t, 2, e.KeyCount(), "no request, no sweep")
		_, err = e.Allow(ctx, "busy", 1) // the first request past the period
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, 1, e.KeyCount(), "idle was full and is gone; busy is not full")
		assert.Equal(t, uint64(1), e.Stats().Total.Evicted)
		assert.Zero(t, e.Stats().PressureSweeps)

		// Requests that rang while it swept start no second sweep.
		for range 10 {
			_, err = e.Allow(ctx, "busy", 1)
			require.NoError(t, err)
		}
		synctest.Wait()
		assert.Equal(t, uint64(1), e.Stats().Total.Sweeps, "one sweep a period")
	})
}

// TestPressureSchedule drives the pressure schedule on a Manual clock with
// SweepEvery set (which turns pressure sweeps on for any clock): a sweep
// that evicts nothing waits until the first bucket it kept is full, and
// ReclaimAfter says exactly when that is; a knock in between waits for it;
// after a sweep that freed a slot, the next waits PressureSweepGap.
func TestPressureSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sec = int64(time.Second)
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), MaxKeys: 2, Shards: 2, Clock: clk, SweepEvery: time.Hour})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		_, err = e.Allow(ctx, "a", 10) // full at 10 s
		require.NoError(t, err)
		_, err = e.Allow(ctx, "b", 5) // full at 5 s
		require.NoError(t, err)

		knock := func() error {
			_, err := e.Allow(ctx, "c", 1)
			synctest.Wait() // the sweeper has done what the knock asked
			return err
		}
		require.ErrorIs(t, knock(), engine.ErrKeyCapacity)
		assert.Equal(t, uint64(1), e.Stats().PressureSweeps, "the first knock sweeps at once")
		d, ok := e.ReclaimAfter()
		require.True(t, ok)
		assert.Equal(t, 5*time.Second, d, "b is the first bucket full")

		clk.Set(1 * sec)
		require.ErrorIs(t, knock(), engine.ErrKeyCapacity)
		assert.Equal(t, uint64(1), e.Stats().PressureSweeps, "nothing can be full before 5 s")
		d, _ = e.ReclaimAfter()
		assert.Equal(t, 4*time.Second, d)

		clk.Set(5 * sec) // the knock at 1 s was waiting for this
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().PressureSweeps)
		assert.Equal(t, 1, e.KeyCount(), "b was full and is gone; a is not")
		require.NoError(t, knock())
		d, _ = e.ReclaimAfter()
		assert.Equal(t, engine.PressureSweepGap, d, "a sweep that freed a slot spaces the next by the gap")
	})
}

// TestPressureScheduleAfterCutover: a cutover that makes buckets full sooner
// than the last pressure sweep found brings the waiting sweep forward.
func TestPressureScheduleAfterCutover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = int64(time.Millisecond)
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), MaxKeys: 2, Shards: 2, Clock: clk, SweepEvery: time.Hour})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		for _, k := range []string{"a", "b"} {
			_, err = e.Allow(ctx, k, 10) // full at 10 s
			require.NoError(t, err)
		}
		knock := func() {
			_, err := e.Allow(ctx, "c", 1)
			require.ErrorIs(t, err, engine.ErrKeyCapacity)
			synctest.Wait()
		}
		knock() // sweeps at once, finds nothing full before 10 s
		clk.Set(100 * ms)
		knock() // waits for 10 s
		d, _ := e.ReclaimAfter()
		require.Equal(t, 9900*time.Millisecond, d)

		// Capacity 1: at 500 ms each key holds 0.5 tokens, full at 1 s.
		clk.Set(500 * ms)
		require.NoError(t, e.ReplacePolicy(ctx, pol(2, 1, 1), 1))
		synctest.Wait()
		d, _ = e.ReclaimAfter()
		assert.Equal(t, engine.PressureSweepGap, d, "the cutover brought the sweep forward")

		clk.Set(1000 * ms) // the waiting sweep's time has come, and both are full
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().PressureSweeps)
		assert.Zero(t, e.KeyCount())
	})
}

// TestPressureScheduleAfterRefund: refunds that fill buckets sooner than the
// last pressure sweep found bring the waiting sweep forward, as a cutover
// does, so a full key table recovers without waiting for the periodic sweep.
func TestPressureScheduleAfterRefund(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = int64(time.Millisecond)
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 1000, 1), MaxKeys: 2, Shards: 2, Clock: clk, SweepEvery: time.Hour})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		for _, k := range []string{"a", "b"} {
			_, err = e.Allow(ctx, k, 1000) // full at 1,000 s
			require.NoError(t, err)
		}
		_, err = e.Allow(ctx, "c", 1)
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait() // the pressure sweep ran, and found nothing full before 1,000 s
		d, _ := e.ReclaimAfter()
		require.Equal(t, 1000*time.Second, d)
		_, err = e.Allow(ctx, "c", 1) // a sweep now waits
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()

		clk.Set(100 * ms)
		for _, k := range []string{"a", "b"} {
			d, err := e.Refund(ctx, k, 1000)
			require.NoError(t, err)
			require.Equal(t, int64(1000), d.Remaining, "%s full again", k)
		}
		synctest.Wait()
		d, _ = e.ReclaimAfter()
		assert.Equal(t, engine.PressureSweepGap, d, "the refunds brought the sweep forward")

		clk.Set(100*ms + int64(engine.PressureSweepGap)) // the waiting sweep's time has come
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().PressureSweeps)
		assert.Zero(t, e.KeyCount(), "both were full, and are gone")
		_, err = e.Allow(ctx, "c", 1)
		require.NoError(t, err)
	})
}

// TestPressureScheduleAfterNewKeys: a pressure sweep that evicted nothing
// waits for the first bucket it kept to be full, but not for keys it never
// saw: one created in the room the failed call left (an AllowAll needing
// two slots of one) fills the table, and its bucket, full a second later,
// is reclaimed then, not when the sweep's buckets refill.
func TestPressureScheduleAfterNewKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sec = int64(time.Second)
		e, clk := drained(t, 3, "a", "b")
		ctx := context.Background()
		_, _, err := e.AllowAll(ctx, []engine.Request{{Key: "x", Cost: 1}, {Key: "y", Cost: 1}})
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()
		require.Equal(t, uint64(1), e.Stats().PressureSweeps)
		d, _ := e.ReclaimAfter()
		require.Equal(t, 10*time.Second, d, "nothing the sweep saw is full before 10 s")

		_, err = e.Allow(ctx, "f", 1) // the last slot: full at 1 s
		require.NoError(t, err)
		synctest.Wait()
		d, _ = e.ReclaimAfter()
		assert.Equal(t, engine.PressureSweepGap, d, "a key the sweep never saw may be full sooner")

		clk.Set(1 * sec) // f is full
		_, err = e.Allow(ctx, "z", 1)
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().PressureSweeps)
		_, err = e.Allow(ctx, "z", 1)
		require.NoError(t, err, "f was full, and its slot reclaimed")
	})
}

// TestRefusedAllowAllStartsPressureSweep: an AllowAll refused by a bucket
// that would also have needed a slot the key table lacks met the bound, as
// a new key does: it starts a pressure sweep, so the table recovers, and a
// caller retrying after ReclaimAfter does not spin.
func TestRefusedAllowAllStartsPressureSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := drained(t, 2, "a") // a is empty: it refuses the AllowAll
		ctx := context.Background()
		_, err := e.Allow(ctx, "b", 1) // full at 1 s
		require.NoError(t, err)
		synctest.Wait()
		_, _, err = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "new", Cost: 1}})
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()
		assert.Equal(t, uint64(1), e.Stats().PressureSweeps)
		d, _ := e.ReclaimAfter()
		assert.Equal(t, time.Second, d, "b is the first bucket full")
	})
}

// TestPressureSweepSeesKeysThatFilledTableBeforeIt: a key that takes the
// table's last slot while a pressure sweep waits for the coordinator is a
// key that sweep sees: the sweep, finding nothing full, still puts the next
// off until the first bucket it kept is full.
func TestPressureSweepSeesKeysThatFilledTableBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := drained(t, 3, "a", "b")
		ctx := context.Background()
		w := newBlockingWriter(nil)
		snapped := make(chan error, 1)
		go func() { snapped <- e.Snapshot(ctx, w) }() // holds the coordinator until unblocked
		synctest.Wait()
		_, _, err := e.AllowAll(ctx, []engine.Request{{Key: "x", Cost: 1}, {Key: "y", Cost: 1}})
		require.ErrorIs(t, err, engine.ErrKeyCapacity) // a pressure sweep waits for the coordinator
		_, err = e.Allow(ctx, "c", 10)                 // the last slot, while it waits: full at 10 s
		require.NoError(t, err)
		synctest.Wait()
		close(w.release)
		require.NoError(t, <-snapped)
		synctest.Wait()
		assert.Equal(t, uint64(1), e.Stats().PressureSweeps)
		d, _ := e.ReclaimAfter()
		assert.Equal(t, 10*time.Second, d, "the sweep saw c: nothing is full before 10 s")
	})
}

// drained starts an engine of MaxKeys maxKeys whose buckets hold 10 tokens
// refilled at 1 a second, with pressure sweeps on a Manual clock at 0,
// closed when the test ends, and drains keys: each full again at 10 s.
func drained(t *testing.T, maxKeys int, keys ...string) (*engine.Engine, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(0)
	e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), MaxKeys: maxKeys, Shards: 2, Clock: clk, SweepEvery: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	for _, k := range keys {
		_, err = e.Allow(context.Background(), k, 10)
		require.NoError(t, err)
	}
	return e, clk
}

// TestPressureScheduleAfterRefundAsSweepEnds: a refund that lands as a
// pressure sweep ends, after it found nothing refunded and before it
// recorded the next sweep's time, still brings that time forward: the
// sweep does not put the next off until the first bucket it kept is full.
func TestPressureScheduleAfterRefundAsSweepEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 1000, 1), MaxKeys: 2, Shards: 2, Clock: clk, SweepEvery: time.Hour})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		for _, k := range []string{"a", "b"} {
			_, err = e.Allow(ctx, k, 1000) // full at 1,000 s
			require.NoError(t, err)
		}
		refunded := false
		engine.SetPressureHook(e, func() {
			if refunded {
				return
			}
			refunded = true
			d, err := e.Refund(ctx, "a", 1000)
			assert.NoError(t, err)
			assert.Equal(t, int64(1000), d.Remaining, "a full again")
		})
		_, err = e.Allow(ctx, "c", 1)
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait() // the pressure sweep ran, and a was refunded as it ended
		require.True(t, refunded)
		require.Equal(t, uint64(1), e.Stats().PressureSweeps)
		d, _ := e.ReclaimAfter()
		assert.Equal(t, engine.PressureSweepGap, d, "the refund brought the next sweep forward")

		_, err = e.Allow(ctx, "c", 1) // a sweep now waits
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()
		clk.Set(int64(engine.PressureSweepGap)) // the waiting sweep's time has come
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().PressureSweeps)
		assert.Equal(t, 1, e.KeyCount(), "a was full, and is gone; b is not")
		_, err = e.Allow(ctx, "c", 1)
		require.NoError(t, err)
	})
}
