package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/msg"
)

// ErrWouldExceedDeadline is returned (wrapped) by Wait when the wait it
// would need ends after the context's deadline.
var ErrWouldExceedDeadline = errors.New("engine: waiting would exceed the context deadline")

// Wait blocks until key may spend cost tokens, spends them and returns the
// Decision, or until ctx ends or the engine closes. It decides as Allow
// does, waits until the clock reaches the reading the denial was decided at
// plus its RetryAfter, and decides again: an estimate is not a
// reservation, so others may take the tokens meanwhile and Wait then waits
// again.
//
// Wait never waits past ctx's deadline: if a denial's RetryAfter ends after
// it, Wait returns at once with ErrWouldExceedDeadline (wrapped, giving the
// estimate), having spent nothing. If ctx ends while waiting it returns
// ctx's error, and ErrClosed if the engine closes. Any other error of Allow
// is returned as it is. Like every error, these come with the zero Decision.
//
// It waits on the engine's clock if that is a clock.Sleeper (clock.Manual
// is), else on a real timer. It starts no goroutine and leaves no timer.
func (e *Engine) Wait(ctx context.Context, key string, cost int64) (Decision, error) {
	for {
		d, at, err := e.single(ctx, msg.OpWait, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		if deadline, ok := ctx.Deadline(); ok {
			if left := clock.Until(deadline); d.RetryAfter > left {
				return Decision{}, fmt.Errorf("%w: retry after %v, deadline in %v", ErrWouldExceedDeadline, d.RetryAfter, left)
			}
		}
		// The estimate counts from the shard's reading at, not from now:
		// the clock may have moved on since the shard decided.
		if err := e.sleep(ctx, time.Duration(satAdd(at, int64(d.RetryAfter))-e.clk.Now())); err != nil {
			return Decision{}, err
		}
	}
}

// sleep waits d on the engine's clock (see after), or until ctx ends or
// Close starts.
func (e *Engine) sleep(ctx context.Context, d time.Duration) error {
	ch, stop := e.after(d)
	defer stop()
	return until(e, ctx, ch)
}

// until waits for done, ctx or Close.
func until(e *Engine, ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		return ErrClosed
	}
}
