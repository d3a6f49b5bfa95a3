package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestWaitersNeverSleepOnTokens: many goroutines Wait on one key for
// random costs while the clock moves in odd steps and full keys are
// evicted. Whenever every goroutine is parked, none sleeps while the key
// holds its cost (a Wait parked on a bucket that covers it has lost its
// wake-up), and the tokens admitted never pass what the bucket gave out.
// Close releases the waiters left, each with ErrClosed.
func TestWaitersNeverSleepOnTokens(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { waitersRun(t, seed) })
	}
}

func waitersRun(t *testing.T, seed uint64) {
	const (
		capacity = 12
		waiters  = 16
		rounds   = 5
	)
	r := rand.New(rand.NewPCG(seed, 7))
	p := policy.Policy{Version: 1, Capacity: capacity, Refill: policy.Rate{Tokens: 3, Per: 7 * time.Millisecond}}
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: p, Shards: 4})
		ctx := context.Background()
		var mu sync.Mutex
		parked := map[int]int64{} // waiter -> cost, while in Wait
		var admitted int64
		errs := make(chan error, waiters)
		var wg sync.WaitGroup
		for w := range waiters {
			wr := rand.New(rand.NewPCG(seed, uint64(w)))
			wg.Go(func() {
				for range rounds {
					cost := 1 + wr.Int64N(capacity)
					mu.Lock()
					parked[w] = cost
					mu.Unlock()
					d, err := e.Wait(ctx, "k", cost)
					mu.Lock()
					delete(parked, w)
					mu.Unlock()
					if errors.Is(err, engine.ErrClosed) {
						return
					}
					if err != nil || !d.Allowed {
						errs <- fmt.Errorf("waiter %d: %+v, %v", w, d, err)
						return
					}
					mu.Lock()
					admitted += cost
					mu.Unlock()
				}
			})
		}
		for step := 0; ; step++ {
			synctest.Wait() // every waiter is parked on the clock, or done
			mu.Lock()
			left := len(parked)
			least := int64(capacity + 1)
			for _, c := range parked {
				least = min(least, c)
			}
			got := admitted
			mu.Unlock()
			if left == 0 {
				break
			}
			if step > 10_000 {
				t.Fatalf("seed %d: %d waiters still parked after %d steps", seed, left, step)
			}
			pk, err := e.Peek(ctx, "k")
			require.NoError(t, err)
			require.Less(t, pk.Remaining, least, "step %d (seed %d): a waiter sleeps while the key holds its cost", step, seed)
			// The bucket gave out its capacity and its refill since 0.
			require.LessOrEqual(t, got, capacity+clk.Now()*3/int64(7*time.Millisecond), "step %d (seed %d)", step, seed)
			switch r.IntN(5) {
			case 0:
				_, err := e.EvictFull(ctx)
				require.NoError(t, err)
			default:
				clk.Advance(time.Duration(1 + r.Int64N(int64(10*time.Millisecond))))
			}
		}
		require.NoError(t, e.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Zero(t, clk.Waiting(), "a Wait left its alarm")
	})
}

// TestWaitAcrossCutovers: a cutover while Wait sleeps is met at its next
// decision: a band added binds it to that band's wait, and a capacity
// lowered below its cost ends it with ErrCostExceedsCapacity.
func TestWaitAcrossCutovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1)})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 10)
		require.NoError(t, err)
		got := make(chan waitResult, 2)
		go func() {
			d, err := e.Wait(ctx, "k", 4) // 4 s
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		// A band of 5 per 10 s, which a cutover adds full.
		p2 := pol(2, 10, 1)
		p2.Bands = bands(t, policy.Band{Name: "slow", Capacity: 5, Refill: policy.Rate{Tokens: 1, Per: 10 * time.Second}})
		require.NoError(t, e.ReplacePolicy(ctx, p2, 1))
		clk.Set(int64(4 * time.Second))
		r := <-got
		require.NoError(t, r.err)
		require.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 10, ResetAfter: 10 * time.Second}, r.d)

		go func() {
			d, err := e.Wait(ctx, "k", 4) // the slow band holds 1: 30 s
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		require.NoError(t, e.ReplacePolicy(ctx, pol(3, 3, 1), 2))
		clk.Set(int64(34 * time.Second))
		r = <-got
		require.ErrorIs(t, r.err, engine.ErrCostExceedsCapacity)
		require.Zero(t, clk.Waiting())
	})
}

// TestWaitIsNotFirstComeFirstServed: a Wait for 5 tokens, parked until
// 5 s, is overtaken by a later Wait for 1 at 4 s, and then waits again;
// a Refund meanwhile does not wake it before its estimate.
func TestWaitIsNotFirstComeFirstServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 5, 1)})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 5)
		require.NoError(t, err)
		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(ctx, "k", 5) // 5 s
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		clk.Set(int64(4 * time.Second))
		d, err := e.Wait(ctx, "k", 1) // came later, passes first
		require.NoError(t, err)
		require.True(t, d.Allowed)
		clk.Set(int64(5 * time.Second)) // the first wakes, is denied: 1 token of 5
		synctest.Wait()
		require.Empty(t, got)
		_, err = e.Refund(ctx, "k", 5) // the key is full, but the waiter sleeps on
		require.NoError(t, err)
		synctest.Wait()
		require.Empty(t, got)
		clk.Set(int64(9 * time.Second)) // its second estimate
		r := <-got
		require.NoError(t, r.err)
		require.True(t, r.d.Allowed)
	})
}
