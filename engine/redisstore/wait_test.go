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

// A Wait whose deadline comes before the failure rule's RetryAfter (Redis
// unreachable, fail closed) says the outage, not a limit: its error wraps
// ErrUnavailable besides engine.ErrWouldExceedDeadline, with leases as
// without. One that a bucket's denial ends wraps ErrWouldExceedDeadline
// alone.
func TestWaitDegradedSaysUnavailable(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(10)}
	for _, lz := range []*redisstore.Leases{nil, {}} {
		srv := downServer(t)
		s, err := redisstore.New(context.Background(), redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: prefix(t),
			Policy: p, Leases: lz, Clock: clock.NewManual(0)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err = s.Wait(ctx, "k", 1)
		cancel()
		require.ErrorIs(t, err, engine.ErrWouldExceedDeadline, "leases %v", lz != nil)
		require.ErrorIs(t, err, redisstore.ErrUnavailable, "leases %v", lz != nil)

		srv.Restart(t)
		untilDecided(t, s, "k", engine.Decision{Version: 1, Limit: 10, RetryAfter: redisstore.DefaultFailRetryAfter, Degraded: true})
		d, err := s.Allow(context.Background(), "k", 9)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err = s.Wait(ctx, "k", 1) // six minutes to the next token
		cancel()
		require.ErrorIs(t, err, engine.ErrWouldExceedDeadline, "leases %v", lz != nil)
		require.NotErrorIs(t, err, redisstore.ErrUnavailable, "a bucket's denial (leases %v)", lz != nil)
	}
}
