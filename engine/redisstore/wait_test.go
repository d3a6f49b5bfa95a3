package redisstore_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// A Wait parked on a denial's RetryAfter returns engine.ErrClosed when the
// store closes, as the engine's does, rather than at the RetryAfter (six
// minutes here, on a clock that never moves), with leases as without.
func TestWaitReleasedByClose(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(10)}
	for _, lz := range []*redisstore.Leases{nil, {}} {
		clk := clock.NewManual(0)
		s := newStore(t, redisstore.Config{Policy: p, Leases: lz}, clk)
		ctx := context.Background()
		d, err := s.Allow(ctx, "k", 10)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		done := make(chan error, 1)
		go func() {
			_, err := s.Wait(ctx, "k", 1)
			done <- err
		}()
		for clk.Waiting() == 0 { // parked on the clock
			runtime.Gosched()
		}
		require.NoError(t, s.Close())
		select {
		case err := <-done:
			require.ErrorIs(t, err, engine.ErrClosed, "leases %v", lz != nil)
		case <-time.After(10 * time.Second): // real time: the clock stands still
			t.Fatalf("Wait still blocked 10 s after Close (leases %v)", lz != nil)
		}
		require.Zero(t, clk.Waiting(), "the wait left its timer")
	}
}
