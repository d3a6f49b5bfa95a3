package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
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
// again. Waiters are not served in the order they came: a later call, or
// one of a smaller cost, may pass first. Nor do they queue: waiters on one
// key share one estimate, so n of them cost n decisions for each token
// they wait for, and all but one wait again. With thousands waiting on a
// key, those decisions and wake-ups can take the CPU that deciding needs,
// and a key of small capacity then admits less than its rate: its bucket
// stands full while no decision reaches it, and that refill is lost.
// Where many callers wait on one key, queue them in front of Wait (one
// Wait per key at a time). The estimate is the denial's: a
// Refund, or a cutover to a faster rate, meanwhile does not wake Wait
// sooner.
//
// Wait never sleeps past ctx's deadline: if the instant a denial's estimate
// names comes after it, Wait returns at once with ErrWouldExceedDeadline
// (wrapped, giving the wait), having spent nothing. An instant past
// math.MaxInt64, the clock's last reading, comes after every deadline, and
// without one Wait waits for ctx or Close. If ctx ends while
// sleeping it returns ctx's error, and ErrClosed if the engine closes (also
// when both have happened by the time it wakes). Any
// other error of Allow is returned as it is. Like every error, these come
// with the zero Decision. Each decision it asks for is answered as an
// Allow's is: once the key's shard has taken it, Wait returns its answer
// whatever ctx does, even past the deadline if the shard kept it waiting
// (behind an AllowAll's hold: see AllowAll).
//
// It waits on the engine's clock if that is a clock.Sleeper (clock.Manual
// is; as a clock.Alarm it wakes at that instant however the clock moves
// meanwhile), else on a real timer. It starts no goroutine and leaves no
// timer.
func (e *Engine) Wait(ctx context.Context, key string, cost int64) (Decision, error) {
	for {
		d, at, err := e.single(ctx, msg.OpWait, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		// The estimate counts from the shard's reading at, not from now:
		// the clock may have moved on since the shard decided.
		t := satAdd(at, int64(d.RetryAfter))
		// An instant past the clock's last reading never comes: an alarm
		// at that reading would ring at once, and again.
		never := at > math.MaxInt64-int64(d.RetryAfter)
		if deadline, ok := ctx.Deadline(); ok {
			if never {
				return Decision{}, fmt.Errorf("%w: retry after %v, past the clock's end", ErrWouldExceedDeadline, d.RetryAfter)
			}
			if wait, left := time.Duration(t-e.clk.Now()), clock.Until(deadline); wait > left {
				return Decision{}, fmt.Errorf("%w: retry after %v, deadline in %v", ErrWouldExceedDeadline, wait, left)
			}
		}
		if never {
			return Decision{}, until(e, ctx, nil)
		}
		if err := e.sleepUntil(ctx, t); err != nil {
			return Decision{}, err
		}
	}
}

// sleepUntil waits until the engine's clock reads t (see Wait), or until
// ctx ends or Close starts.
func (e *Engine) sleepUntil(ctx context.Context, t int64) error {
	var ch <-chan struct{}
	var stop func()
	if a, ok := e.clk.(clock.Alarm); ok {
		ch, stop = a.At(t)
	} else {
		ch, stop = e.after(time.Duration(t - e.clk.Now()))
	}
	defer stop()
	return until(e, ctx, ch)
}

// until waits for done, ctx or Close.
func until(e *Engine, ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return e.ctxErr(ctx)
	case <-e.closing:
		return ErrClosed
	}
}
