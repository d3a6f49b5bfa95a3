package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
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
