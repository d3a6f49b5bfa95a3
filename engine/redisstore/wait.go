package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// Wait blocks until key may spend cost tokens, spends them and returns the
// Decision, with the meaning of engine.Engine.Wait: it decides with Allow
// (from a lease, with Config.Leases), waits a denial's RetryAfter and
// decides again, so others may take the tokens meanwhile. A degraded
// denial (Redis unreachable, fail closed) is waited out the same way, for
// Config.FailRetryAfter. It never waits past ctx's deadline: a RetryAfter
// that ends after it returns at once an error wrapping
// engine.ErrWouldExceedDeadline, having spent nothing; when that RetryAfter
// is the failure rule's, the error wraps ErrUnavailable too, so that a
// caller can tell an outage from the key's limit. If ctx ends while
// waiting it returns ctx's error, and engine.ErrClosed if the store closes;
// Allow's errors are returned as they are.
// It waits on Config.Clock if that is a clock.Sleeper (clock.Manual is),
// else on a real timer, and leaves no timer behind.
func (s *Store) Wait(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	for {
		d, err := s.Allow(ctx, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		if deadline, ok := ctx.Deadline(); ok {
			if left := clock.Until(deadline); d.RetryAfter > left {
				if d.Degraded { // the outage's wait, not the key's limit
					return engine.Decision{}, fmt.Errorf("%w: %w: the failure rule's retry after %v, deadline in %v", engine.ErrWouldExceedDeadline, ErrUnavailable, d.RetryAfter, left)
				}
				return engine.Decision{}, fmt.Errorf("%w: retry after %v, deadline in %v", engine.ErrWouldExceedDeadline, d.RetryAfter, left)
			}
		}
		ch, stop := s.after(d.RetryAfter)
		select {
		case <-ch:
			stop()
		case <-ctx.Done():
			stop()
			return engine.Decision{}, ctx.Err()
		case <-s.closing:
			stop()
			return engine.Decision{}, engine.ErrClosed
		}
	}
}

// after is a channel closed once d has passed on Config.Clock, if that is
// a clock.Sleeper, else on a real timer; stop releases it.
func (s *Store) after(d time.Duration) (<-chan struct{}, func()) {
	if sl, ok := s.clk.(clock.Sleeper); ok {
		return sl.After(d)
	}
	ch := make(chan struct{})
	t := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { t.Stop() }
}
