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

// TestChargeRefundPeekWaitForAllowAllHold pins AllowAll's "a held key's
// requests wait until the call ends" for the calls that are not Allows: a
// Charge, a Refund and a Peek of a key an AllowAll holds (its other part
// not yet answered, shard 1 stalled on the clock) are answered only once
// the call has ended, in the order they came, after its take: the Charge
// finds 4 tokens, not 5, and goes to the floor, the Refund repays one
// token of the debt and the Peek sees it. The clock reads 0 throughout.
func TestChargeRefundPeekWaitForAllowAllHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, a, b := haPair(t)
		defer e.Close()
		ctx := context.Background()

		allowed := stallOn(ctx, e, clk, b) // shard 1 stalls on the clock
		type all struct {
			d   engine.Decision
			err error
		}
		allDone := make(chan all, 1)
		go func() {
			d, _, err := e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 1}, {Key: b, Cost: 1}})
			allDone <- all{d, err}
		}()
		synctest.Wait() // shard 0 holds a
		type answer struct {
			d   engine.Decision
			err error
		}
		charged, refunded, peeked := make(chan answer, 1), make(chan answer, 1), make(chan answer, 1)
		go func() { d, err := e.Charge(ctx, a, 12); charged <- answer{d, err} }()
		synctest.Wait()
		go func() { d, err := e.Refund(ctx, a, 1); refunded <- answer{d, err} }()
		synctest.Wait()
		go func() { d, err := e.Peek(ctx, a); peeked <- answer{d, err} }()
		synctest.Wait()
		assert.Zero(t, len(charged)+len(refunded)+len(peeked), "answered during the hold")

		close(clk.gate)
		require.NoError(t, <-allowed)
		r := <-allDone
		require.NoError(t, r.err)
		require.True(t, r.d.Allowed)
		c := <-charged
		require.NoError(t, c.err)
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: -5, Version: 1, Limit: 5, ResetAfter: 10 * time.Second}, c.d, "4 - 12 is past the floor")
		f := <-refunded
		require.NoError(t, f.err)
		assert.Equal(t, engine.Decision{Remaining: -4, RetryAfter: 5 * time.Second, Version: 1, Limit: 5, ResetAfter: 9 * time.Second}, f.d)
		p := <-peeked
		require.NoError(t, p.err)
		assert.Equal(t, f.d, p.d)
	})
}
