package engine_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// movedClock is a Manual clock that, once armed, moves on by a step right
// after the next reading it gives: as when another goroutine advances the
// clock between a shard's decision and its caller's next step.
type movedClock struct {
	*clock.Manual
	step atomic.Int64
}

func (c *movedClock) Now() int64 {
	r := c.Manual.Now()
	if d := c.step.Swap(0); d > 0 {
		c.Manual.Advance(time.Duration(d))
	}
	return r
}

// TestWaitWakesAtTheEstimateWhenTheClockMoves: Wait is denied at the
// shard's reading r with the estimate RetryAfter, and the key holds the
// cost at r+RetryAfter. The clock moving on between the decision and Wait
// going to sleep must not put the wake-up off: Wait is admitted once the
// clock reaches r+RetryAfter, not RetryAfter after whenever it fell asleep.
func TestWaitWakesAtTheEstimateWhenTheClockMoves(t *testing.T) {
	const ms = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		clk := &movedClock{Manual: clock.NewManual(0)}
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Clock: clk})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 10)
		require.NoError(t, err)

		got := make(chan waitResult, 1)
		clk.step.Store(int64(500 * ms)) // moves on after Wait's first decision, at 0
		go func() {
			d, err := e.Wait(ctx, "k", 3) // denied at 0: 1.5 s from empty at 2/s
			got <- waitResult{d, err}
		}()
		synctest.Wait() // Wait sleeps on the clock, now at 0.5 s
		require.Equal(t, int64(500*ms), clk.Manual.Now())
		clk.Set(int64(1500 * ms)) // the estimate: the key holds 3 tokens
		synctest.Wait()
		select {
		case r := <-got:
			require.NoError(t, r.err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, r.d)
		default:
			require.NoError(t, e.Close()) // releases the Wait, so the bubble ends
			<-got
			t.Fatal("Wait still sleeps at 1.5 s, the reading its estimate named")
		}
	})
}

// alarmSpy is a movedClock that tells which instants Wait asks it to wake
// at.
type alarmSpy struct {
	*movedClock
	at chan int64
}

func (c alarmSpy) At(t int64) (<-chan struct{}, func()) {
	c.at <- t
	return c.Manual.At(t)
}

// TestWaitAsksTheAlarmForTheEstimate: on a clock.Alarm, Wait asks to wake
// at the shard's reading plus RetryAfter, an instant however far the clock
// moves before the wait is set, and its deadline check counts the wait
// from that instant too: a denial decided at 0 with RetryAfter 1.5 s, seen
// at 0.5 s, waits 1 s, within a deadline 1.2 s away.
func TestWaitAsksTheAlarmForTheEstimate(t *testing.T) {
	const ms = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		clk := alarmSpy{&movedClock{Manual: clock.NewManual(0)}, make(chan int64, 4)}
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Clock: clk})
		_, err := e.Allow(context.Background(), "k", 10)
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(context.Background(), 1200*ms)
		defer cancel()
		got := make(chan waitResult, 1)
		clk.step.Store(int64(500 * ms)) // moves on after Wait's first decision, at 0
		go func() {
			d, err := e.Wait(ctx, "k", 3)
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		select {
		case r := <-got:
			t.Fatalf("Wait returned %+v, %v; want it waiting 1 s, within its deadline", r.d, r.err)
		case at := <-clk.at:
			assert.Equal(t, int64(1500*ms), at, "the instant Wait wakes at")
		}
		clk.Set(int64(1500 * ms))
		r := <-got
		require.NoError(t, r.err)
		assert.True(t, r.d.Allowed)
	})
}

// countingAlarm is a Manual clock that counts the alarms Wait sets, and
// after limit of them sets none that ever rings, so that a Wait that would
// spin parks instead and the test can count.
type countingAlarm struct {
	*clock.Manual
	limit int
	set   atomic.Int64
}

func (c *countingAlarm) At(t int64) (<-chan struct{}, func()) {
	if c.set.Add(1) > int64(c.limit) {
		return make(chan struct{}), func() {}
	}
	return c.Manual.At(t)
}

// TestWaitPastTheClocksEnd: a wait that ends past math.MaxInt64, the last
// reading a clock has, never ends: Wait with no deadline waits for its
// context or Close, with no alarm, rather than waking at math.MaxInt64 and
// deciding again and again; one with a deadline returns
// ErrWouldExceedDeadline at once.
func TestWaitPastTheClocksEnd(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 2, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}}
	synctest.Test(t, func(t *testing.T) {
		clk := &countingAlarm{Manual: clock.NewManual(0), limit: 10}
		e, _ := newEngine(t, engine.Config{Policy: p, Clock: clk})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 2)
		require.NoError(t, err)
		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(ctx, "k", 2) // 2*MaxInt64 ns from 0
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		clk.Set(math.MaxInt64) // the key holds one token, and never more
		synctest.Wait()
		assert.LessOrEqual(t, clk.set.Load(), int64(1), "Wait set an alarm at the clock's end and woke to decide again")
		assert.Zero(t, clk.Waiting())
		select {
		case r := <-got:
			t.Fatalf("Wait returned %+v, %v", r.d, r.err)
		default:
		}
		require.NoError(t, e.Close())
		r := <-got
		require.ErrorIs(t, r.err, engine.ErrClosed)

		e, _ = newEngine(t, engine.Config{Policy: p, Clock: clk})
		dl, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		_, err = e.Wait(dl, "k", 2) // a fresh key at MaxInt64, full
		require.NoError(t, err)
		_, err = e.Wait(dl, "k", 1)
		require.ErrorIs(t, err, engine.ErrWouldExceedDeadline)
		// A deadline as far as time.Until reaches (it saturates) is still
		// before an instant that never comes.
		far, cancelFar := context.WithDeadline(ctx, time.Unix(1<<62, 0))
		defer cancelFar()
		_, err = e.Wait(far, "k", 1)
		require.ErrorIs(t, err, engine.ErrWouldExceedDeadline)
	})
}

// hookAlarm is a Manual clock that runs hook when Wait sets an alarm, the
// last thing Wait does before it waits.
type hookAlarm struct {
	*clock.Manual
	hook func()
}

func (c hookAlarm) At(t int64) (<-chan struct{}, func()) {
	c.hook()
	return c.Manual.At(t)
}

// TestWaitClosedWhenBothEnd: a Wait whose context ends and whose engine
// closes before it wakes returns ErrClosed, every time, as a request does
// when both have happened before it is sent: not whichever a select picks.
func TestWaitClosedWhenBothEnd(t *testing.T) {
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		var e *engine.Engine
		clk := hookAlarm{Manual: clock.NewManual(0), hook: func() {
			cancel()
			require.NoError(t, e.Close())
		}}
		e, _ = newEngine(t, engine.Config{Policy: pol(1, 10, 2), Clock: clk})
		_, err := e.Allow(context.Background(), "k", 10)
		require.NoError(t, err)
		_, err = e.Wait(ctx, "k", 3)
		require.ErrorIs(t, err, engine.ErrClosed)
	}
}
