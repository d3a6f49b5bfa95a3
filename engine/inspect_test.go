package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestPeek: Peek reports the balance a request of one token would see,
// spends nothing, creates nothing, and reports a key not tracked as full
// under the limit it would get.
func TestPeek(t *testing.T) {
	const ms = time.Millisecond
	set := overrides(t, policy.Override{Match: "vip", Capacity: 100, TokensPerSecond: 10})
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2, Overrides: set}, Shards: shards})
			ctx := context.Background()
			d, err := e.Peek(ctx, "new")
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 3, Limit: 10}, d)
			d, err = e.Peek(ctx, "vip")
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 100, Version: 3, Limit: 100}, d)
			assert.Zero(t, e.KeyCount(), "Peek creates nothing")

			_, err = e.Allow(ctx, "k", 10)
			require.NoError(t, err)
			clk.Set(int64(250 * ms)) // half a token back
			for range 3 {            // and Peek spends nothing
				d, err = e.Peek(ctx, "k")
				require.NoError(t, err)
				assert.Equal(t, engine.Decision{Allowed: false, Remaining: 0, RetryAfter: 250 * ms, Version: 3, Limit: 10, ResetAfter: 4750 * ms}, d)
			}
			// Allow sees exactly what Peek said.
			a, err := e.Allow(ctx, "k", 1)
			require.NoError(t, err)
			assert.False(t, a.Allowed)
			assert.Equal(t, d.RetryAfter, a.RetryAfter)
			assert.Equal(t, 1, e.KeyCount())

			_, err = e.Peek(ctx, " ")
			assert.ErrorIs(t, err, engine.ErrInvalidKey)
		})
	}
}

// TestRefund: a refund credits exactly, capped at capacity, keeps the
// fraction, and never creates a key.
func TestRefund(t *testing.T) {
	const ms = time.Millisecond
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			ctx := context.Background()
			_, err := e.Allow(ctx, "k", 8) // 2 left
			require.NoError(t, err)
			clk.Set(int64(250 * ms)) // 2.5
			d, err := e.Refund(ctx, "k", 5)
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 7, Version: 1, Limit: 10, ResetAfter: 1250 * ms}, d)
			d, err = e.Refund(ctx, "k", 1<<62) // capped
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d)
			a, err := e.Allow(ctx, "k", 10)
			require.NoError(t, err)
			assert.True(t, a.Allowed, "the refund is spendable")

			d, err = e.Refund(ctx, "unknown", 3)
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d)
			assert.Equal(t, 1, e.KeyCount(), "Refund creates nothing")

			_, err = e.Refund(ctx, "k", 0)
			assert.ErrorIs(t, err, engine.ErrInvalidCost)
		})
	}
}

// TestWaitAdmitsAfterTheEstimate: under a Manual clock, Wait is admitted
// exactly when the clock reaches the estimate, not a nanosecond before. The
// bubble lets the test know when Wait is parked on the clock.
func TestWaitAdmitsAfterTheEstimate(t *testing.T) {
	const ms = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2)})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 10)
		require.NoError(t, err)

		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(ctx, "k", 3) // 1.5 s from empty at 2/s
			got <- waitResult{d, err}
		}()
		for _, at := range []time.Duration{500 * ms, 1000 * ms, 1499 * ms} {
			synctest.Wait() // Wait is parked on the clock
			clk.Set(int64(at))
			synctest.Wait() // and has re-decided, if it woke
			select {
			case r := <-got:
				t.Fatalf("Wait returned at %v, before the estimate: %+v", at, r)
			default:
			}
		}
		clk.Set(int64(1500 * ms))
		r := <-got
		require.NoError(t, r.err)
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, r.d)
	})
}

// TestWaitersShareTheRefill: ten callers Wait on one empty key of one
// token a second. An estimate is not a reservation: each second of refill
// admits exactly one of them, and the others, denied again, wait for the
// next token; none is lost and none is admitted early.
func TestWaitersShareTheRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 1, 1), Shards: 2})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 1)
		require.NoError(t, err)
		got := make(chan waitResult, 10)
		for range 10 {
			go func() {
				d, err := e.Wait(ctx, "k", 1)
				got <- waitResult{d, err}
			}()
		}
		for i := range 10 {
			synctest.Wait() // every waiter left is parked on the clock
			require.Equal(t, 10-i, clk.Waiting(), "second %d", i)
			require.Empty(t, got, "second %d: admitted before the token came", i)
			clk.Advance(time.Second)
			r := <-got
			require.NoError(t, r.err)
			require.True(t, r.d.Allowed)
			synctest.Wait()
			require.Empty(t, got, "second %d: one token admitted two", i)
		}
		require.Zero(t, clk.Waiting())
		st := e.Stats()
		assert.Equal(t, uint64(1+10), st.Total.Allowed)
		assert.Equal(t, uint64(10+9+8+7+6+5+4+3+2+1), st.Total.Denied, "each waiter is denied once a second until admitted")
	})
}

type waitResult struct {
	d   engine.Decision
	err error
}

// TestWaitDeadline: an estimate past the deadline returns at once with
// ErrWouldExceedDeadline and spends nothing; one within it waits.
func TestWaitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1)})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 10)
		require.NoError(t, err)
		clk.Set(int64(500 * time.Millisecond)) // half a token
		before, err := e.Peek(ctx, "k")
		require.NoError(t, err)

		short, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		d, err := e.Wait(short, "k", 5) // needs 4.5 s
		assert.True(t, errors.Is(err, engine.ErrWouldExceedDeadline), "%v", err)
		assert.Contains(t, err.Error(), "retry after 4.5s")
		assert.Equal(t, engine.Decision{}, d, "an error comes with the zero Decision")
		after, err := e.Peek(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, before, after, "nothing spent")

		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(short, "k", 4) // needs 3.5 s: fits
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		clk.Advance(3500 * time.Millisecond)
		r := <-got
		require.NoError(t, r.err)
		assert.True(t, r.d.Allowed)
	})
}

// TestWaitCancel: a context that ends while Wait waits returns its error and
// spends nothing; no goroutine is left (TestMain checks).
func TestWaitCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1)})
		ctx, cancel := context.WithCancel(context.Background())
		_, err := e.Allow(ctx, "k", 10)
		require.NoError(t, err)
		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(ctx, "k", 1)
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		cancel()
		r := <-got
		assert.ErrorIs(t, r.err, context.Canceled)
		assert.Zero(t, clk.Waiting(), "a canceled wait leaves nothing on the clock")
		d, err := e.Peek(context.Background(), "k")
		require.NoError(t, err)
		assert.Zero(t, d.Remaining, "nothing spent, nothing earned")
	})
}

// TestWaitClose: Close wakes a Wait that sleeps on the clock; it returns
// ErrClosed, and the clock keeps no waiter for it.
func TestWaitClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), Clock: clk})
		require.NoError(t, err)
		_, err = e.Allow(context.Background(), "k", 10)
		require.NoError(t, err)
		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(context.Background(), "k", 10) // ten seconds, never advanced
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		require.Equal(t, 1, clk.Waiting())
		require.NoError(t, e.Close())
		r := <-got
		assert.ErrorIs(t, r.err, engine.ErrClosed)
		assert.Equal(t, engine.Decision{}, r.d)
		assert.Zero(t, clk.Waiting(), "the wait was released")
	})
}

// TestWaitRealTimer: with a clock that cannot sleep, Wait falls back to a
// real timer (fake inside the bubble), and still waits exactly the estimate.
func TestWaitRealTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 4)}) // Monotonic: bubble time
		require.NoError(t, err)
		defer e.Close()
		ctx := context.Background()
		_, err = e.Allow(ctx, "k", 10)
		require.NoError(t, err)
		start := time.Now()
		d, err := e.Wait(ctx, "k", 2)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, 500*time.Millisecond, time.Since(start))
	})
}

// TestWaitErrors: errors of Allow come back as they are.
func TestWaitErrors(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1)})
	_, err := e.Wait(context.Background(), "k", 11)
	assert.ErrorIs(t, err, engine.ErrInvalidCost)
	_, err = e.Wait(context.Background(), "", 1)
	assert.ErrorIs(t, err, engine.ErrInvalidKey)
}
