package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// Wait blocks until key may spend cost tokens, spends them and returns the
// Decision, with the meaning of engine.Engine.Wait: it decides with Allow
// (from a lease, with Config.Leases), waits until a denial's RetryAfter has
// passed since it asked, and decides again, so others may take the tokens
// meanwhile. Nor do its waiters queue: n of them on one key make about n
// decisions of Redis for each token they wait for (1,585 a token at 2,000
// waiters, measured), so queue callers in front where many wait on one key.
// The decision's own reading (Redis's TIME, or Config.Clock read as the call
// goes out) is no earlier than the ask, so Wait may ask again a little
// early, at the cost of a round trip, but never late. A degraded denial
// (Redis unreachable, fail closed) is waited out for Config.FailRetryAfter
// from its answer. It never waits past ctx's deadline: a wait that would end
// after it returns at once an error wrapping engine.ErrWouldExceedDeadline;
// when that wait is the failure rule's, the error wraps ErrUnavailable too,
// so that a caller can tell an outage from the key's limit. That error
// spends nothing, but where the failure rule answered a call whose reply was
// lost: Redis may have decided it and taken its cost, so that a Wait that
// asks again after such an answer may pay the key twice for one admission
// (never the reverse). An instant past math.MaxInt64, the clock's last
// reading, comes after every deadline, and without one Wait waits for ctx or
// Close. If ctx ends while waiting it returns ctx's error, and
// engine.ErrClosed if the store closes (also when both have happened by the
// time it wakes); Allow's errors are returned as they are. It waits on
// Config.Clock if that is a clock.Alarm or a clock.Sleeper (clock.Manual is
// both), else on a real timer, and leaves no timer behind.
func (s *Store) Wait(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	if s.uninitialized() {
		return s.Allow(ctx, key, cost) // its error
	}
	clk := cmp.Or(s.clk, s.slotMap.clk) // else a monotonic clock, for a real timer
	for {
		asked := clk.Now()
		d, err := s.Allow(ctx, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		if d.Degraded { // the failure rule's back-off counts from its answer, which came after Timeout
			asked = clk.Now()
		}
		t := satAdd(asked, int64(d.RetryAfter))
		// An instant past the clock's last reading never comes: an alarm
		// at that reading would ring at once, and again.
		never := asked > math.MaxInt64-int64(d.RetryAfter)
		if deadline, ok := ctx.Deadline(); ok {
			wait, left := time.Duration(t-clk.Now()), clock.Until(deadline)
			if never || wait > left {
				why := fmt.Sprintf("retry after %v, deadline in %v", wait, left)
				if never {
					why = fmt.Sprintf("retry after %v, past the clock's end", d.RetryAfter)
				}
				if d.Degraded { // the outage's wait, not the key's limit
					return engine.Decision{}, fmt.Errorf("%w: %w: the failure rule's %s", engine.ErrWouldExceedDeadline, ErrUnavailable, why)
				}
				return engine.Decision{}, fmt.Errorf("%w: %s", engine.ErrWouldExceedDeadline, why)
			}
		}
		var ch <-chan struct{} // nil: never
		stop := func() {}
		if !never {
			ch, stop = s.until(clk, t)
		}
		select {
		case <-ch:
			stop()
		case <-ctx.Done():
			stop()
			select {
			case <-s.closing: // both: Close, as before a request is sent
				return engine.Decision{}, engine.ErrClosed
			default:
				return engine.Decision{}, ctx.Err()
			}
		case <-s.closing:
			stop()
			return engine.Decision{}, engine.ErrClosed
		}
	}
}

// until is a channel closed once clk (Config.Clock, or else a monotonic
// clock) reads t: on Config.Clock if it is a clock.Alarm or a
// clock.Sleeper, else on a real timer; stop releases it.
func (s *Store) until(clk clock.Clock, t int64) (<-chan struct{}, func()) {
	if a, ok := s.clk.(clock.Alarm); ok {
		return a.At(t)
	}
	d := time.Duration(t - clk.Now())
	if sl, ok := s.clk.(clock.Sleeper); ok {
		return sl.After(d)
	}
	ch := make(chan struct{})
	tm := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { tm.Stop() }
}
