package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// A Wait whose context ends and whose store closes before it wakes returns
// engine.ErrClosed, every time, as the engine's does: not whichever a
// select picks. With leases as without.
func TestWaitClosedWhenBothEnd(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(10)}
	for _, lz := range []*redisstore.Leases{nil, {}} {
		for range 20 {
			ctx, cancel := context.WithCancel(context.Background())
			var s *redisstore.Store
			clk := hookAlarm{Manual: clock.NewManual(0), hook: func() {
				cancel()
				require.NoError(t, s.Close())
			}}
			s = newStore(t, redisstore.Config{Policy: p, Leases: lz}, clk)
			d, err := s.Allow(context.Background(), "k", 10)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			_, err = s.Wait(ctx, "k", 1)
			require.ErrorIs(t, err, engine.ErrClosed, "leases %v", lz != nil)
		}
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

// moveHook moves a Manual clock on by step once a script call that carried
// a reading has returned, once armed: the clock moves between the store's
// reading and Wait's next step, as another goroutine's Advance might.
type moveHook struct {
	clk   *clock.Manual
	step  time.Duration
	armed *atomic.Bool
	any   bool // after any command, not only a script call
}

func (moveHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h moveHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.moved([]redis.Cmder{cmd})
		return err
	}
}

func (h moveHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.moved(cmds)
		return err
	}
}

func (h moveHook) moved(cmds []redis.Cmder) {
	if (h.any || slices.ContainsFunc(cmds, isScript)) && h.armed.CompareAndSwap(true, false) {
		h.clk.Advance(h.step)
	}
}

// TestWaitCountsFromTheAsk: Wait counts a denial's RetryAfter from when it
// asked, not from when the answer came back: with the clock moved on by
// 0.5 s as the store's call returns, a key empty at 0 and refilling 2 a
// second is waited for until 1.5 s, when it holds the 3 tokens asked, not
// 0.5 s later. With leases as without.
func TestWaitCountsFromTheAsk(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	for _, lz := range []*redisstore.Leases{nil, {}} {
		clk := clock.NewManual(0)
		var armed atomic.Bool
		c := client(t, redisAddr(t))
		c.AddHook(moveHook{clk: clk, step: 500 * time.Millisecond, armed: &armed})
		s := newStore(t, redisstore.Config{Client: c, Policy: p, Leases: lz}, clk)
		ctx := context.Background()
		d, err := s.Allow(ctx, "k", 10)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		done := make(chan error, 1)
		armed.Store(true)
		go func() {
			d, err := s.Wait(ctx, "k", 3)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("not admitted: %+v", d)
			}
			done <- err
		}()
		for clk.Waiting() == 0 { // parked on the clock
			select {
			case err := <-done:
				t.Fatalf("Wait returned before it waited: %v (leases %v)", err, lz != nil)
			default:
				runtime.Gosched()
			}
		}
		require.Equal(t, int64(500*time.Millisecond), clk.Now(), "leases %v", lz != nil)
		clk.Set(int64(1500 * time.Millisecond))
		select {
		case err := <-done:
			require.NoError(t, err, "leases %v", lz != nil)
		case <-time.After(10 * time.Second): // real time: the clock stands at 1.5 s
			t.Fatalf("Wait still waits at 1.5 s, RetryAfter after it asked (leases %v)", lz != nil)
		}
	}
}

// TestWaitBacksOffFromTheFailure: the failure rule's FailRetryAfter is a
// back-off from its answer, which comes after the attempt to reach Redis,
// not an estimate counted from the ask: with the clock moved on by 1 s
// while the attempt fails, a Wait denied by the rule (3 s) asks again at
// 4 s, not at 3 s.
func TestWaitBacksOffFromTheFailure(t *testing.T) {
	srv := downServer(t)
	clk := clock.NewManual(0)
	var armed atomic.Bool
	c := quickClient(t, srv.Addr())
	c.AddHook(moveHook{clk: clk, step: time.Second, armed: &armed, any: true})
	const retry = 3 * time.Second
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, FailRetryAfter: retry, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	failures := s.Stats().Failures
	armed.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := s.Wait(context.Background(), "k", 1)
		done <- err
	}()
	for clk.Waiting() == 0 { // parked on the clock
		select {
		case err := <-done:
			t.Fatalf("Wait returned before it waited: %v", err)
		default:
			runtime.Gosched()
		}
	}
	require.Equal(t, failures+1, s.Stats().Failures)
	require.Equal(t, int64(time.Second), clk.Now(), "the clock moved on during the attempt")
	clk.Set(int64(retry))
	require.Equal(t, 1, clk.Waiting(), "asked again at 3 s, FailRetryAfter after the ask, not after the answer")
	require.Equal(t, failures+1, s.Stats().Failures)
	clk.Set(int64(time.Second + retry))
	spinUntil(t, "Wait asks again at 4 s", func() bool { return s.Stats().Failures == failures+2 })
	require.NoError(t, s.Close()) // ends the Wait
	require.ErrorIs(t, <-done, engine.ErrClosed)
}
