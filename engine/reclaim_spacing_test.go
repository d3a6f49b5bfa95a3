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

// steppingClock is a Manual clock that, while stepping is set, moves on by
// step at every reading: a sweep then takes time on it.
type steppingClock struct {
	*clock.Manual
	stepping atomic.Bool
	step     time.Duration
}

func (c *steppingClock) Now() int64 {
	if c.stepping.Load() {
		c.Advance(c.step)
	}
	return c.Manual.Now()
}

// TestPressureSpacingAfterRefund: a refund or a cutover brings the waiting
// pressure sweep forward to PressureSweepGap from it, but not before nine
// times the last sweep's duration has passed since that sweep ended, as
// PressureSweepGap says: otherwise a stream of refunds would have a slow
// sweep run back to back, not a tenth of the time.
func TestPressureSpacingAfterRefund(t *testing.T) {
	t.Run("refund", func(t *testing.T) { testPressureSpacing(t, false) })
	t.Run("cutover", func(t *testing.T) { testPressureSpacing(t, true) })
}

func testPressureSpacing(t *testing.T, cutover bool) {
	synctest.Test(t, func(t *testing.T) {
		clk := &steppingClock{Manual: clock.NewManual(0), step: time.Second}
		e, err := engine.New(engine.Config{Policy: pol(1, 1000, 1), MaxKeys: 2, Shards: 2, Clock: clk, SweepEvery: time.Hour})
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		for _, k := range []string{"a", "b"} {
			_, err = e.Allow(ctx, k, 1000) // full at 1,000 s
			require.NoError(t, err)
		}
		clk.stepping.Store(true) // every reading a second on: the sweep takes seconds
		_, err = e.Allow(ctx, "c", 1)
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()
		clk.stepping.Store(false)
		require.Equal(t, uint64(1), e.Stats().PressureSweeps)
		d, _ := e.ReclaimAfter()
		took := d - (1000*time.Second - time.Duration(clk.Now())) // the wait is to 1,000 s, plus took
		require.GreaterOrEqual(t, took, time.Second)
		end := clk.Now() // the sweep ended at the last reading
		spaced := end + 9*int64(took)

		left := 1 // b
		if cutover {
			require.NoError(t, e.ReplacePolicy(ctx, pol(2, 1, 1), 1)) // both full now
			left = 0
		} else {
			_, err = e.Refund(ctx, "a", 1000) // full now
			require.NoError(t, err)
		}
		_, err = e.Allow(ctx, "c", 1) // a pressure sweep waits
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait()
		d, _ = e.ReclaimAfter()
		assert.Equal(t, time.Duration(spaced-clk.Now())+took, d, "the refund or cutover shortens the wait for a full bucket, not the spacing")

		clk.Set(clk.Now() + int64(engine.PressureSweepGap))
		synctest.Wait()
		assert.Equal(t, uint64(1), e.Stats().PressureSweeps, "no sweep before nine times the last one's duration")
		clk.Set(spaced)
		synctest.Wait()
		assert.Equal(t, uint64(2), e.Stats().PressureSweeps)
		assert.Equal(t, left, e.KeyCount(), "what was full is gone")
	})
}
