package engine

import (
	"context"

	"github.com/tokenshard/tokenshard/msg"
)

// Allow decides whether key may spend cost tokens now. Errors come in this
// order: ErrNotInitialized (a zero Engine), ErrInvalidKey, ErrInvalidCost
// (cost < 1), ErrClosed, ErrNilContext or the context's error, then from the
// key's shard ErrCostExceedsCapacity (cost above the key's own capacity: its
// override's, or the default, and with bands the least band's; errors.Is
// matches it to ErrInvalidCost too),
// ErrClockRegression and ErrKeyCapacity. An error changes nothing. A denial
// is not an error: it is a Decision with Allowed false and a RetryAfter
// estimate.
//
// Allow blocks while the shard's mailbox is full, until there is room, ctx
// ends or the engine closes; once the shard has taken the request, Allow
// returns its answer whatever ctx does. It does not allocate, except while
// it waits for room in a full mailbox; callers waiting for room are not
// served in order.
func (e *Engine) Allow(ctx context.Context, key string, cost int64) (Decision, error) {
	d, _, err := e.single(ctx, msg.OpAllow, key, cost)
	return d, err
}

// single sends one request of kind op to key's shard and waits for the
// answer; for msg.OpWait it also returns the reading the shard decided at.
func (e *Engine) single(ctx context.Context, op msg.Op, key string, cost int64) (Decision, int64, error) {
	if e.uninitialized() {
		return Decision{}, 0, ErrNotInitialized
	}
	if err := e.checkKey(key); err != nil {
		e.callerErrs.add(err, 1)
		return Decision{}, 0, err
	}
	if cost < 1 {
		e.callerErrs.add(ErrInvalidCost, 1)
		return Decision{}, 0, ErrInvalidCost
	}
	if ctx == nil {
		err := e.nilContext()
		e.callerErrs.add(err, 1)
		return Decision{}, 0, err
	}
	a := e.allows.Get().(*msg.Single)
	i, h := e.shardOf(key)
	a.Op, a.Key, a.Hash, a.Cost = op, key, h, cost
	if err := e.mailboxes[i].SendSingle(ctx, a); err != nil {
		a.Key = ""
		e.allows.Put(a)
		e.callerErrs.add(err, 1)
		return Decision{}, 0, err
	}
	a.Wait(e.waitYields) // a shard that took the request always answers, even on Close
	var d Decision
	d.set(&a.Reply.Decision)
	err := a.Reply.Err
	reading := int64(a.Hash) // OpWait's reading; the key's hash for the others
	a.Key, a.Reply = "", msg.Reply{}
	e.allows.Put(a)
	return d, reading, err
}

// Peek reports key's balance now without changing it: a Decision for a
// request of one token that spends nothing (Allowed and RetryAfter say
// whether such a request would pass and when it could). It creates no
// bucket: a key not tracked reports a full bucket of the limit it would
// get. It is decided in the key's shard like Allow, with the same errors
// but ErrInvalidCost, ErrCostExceedsCapacity and ErrKeyCapacity, and does
// not allocate.
func (e *Engine) Peek(ctx context.Context, key string) (Decision, error) {
	d, _, err := e.single(ctx, msg.OpPeek, key, 1)
	return d, err
}

// Refund credits tokens (>= 1, else ErrInvalidCost) back to key, exactly
// and capped at its capacity: for a cost that was over-estimated when it was
// spent. It never creates a key: refunding a key not tracked (never seen,
// or evicted because it was full) changes nothing. It answers like Peek,
// with the balance after the refund.
//
// The bucket keeps no record of the spend a refund corrects, so a refund
// made after the bucket has refilled credits tokens its refill already gave
// back: the key can then pass its limit by up to what was refunded (at most
// its capacity). Refund as soon as the real cost is known; for work that
// takes long, take a low estimate and Charge the rest, which never gives
// anything back.
func (e *Engine) Refund(ctx context.Context, key string, tokens int64) (Decision, error) {
	d, _, err := e.single(ctx, msg.OpRefund, key, tokens)
	if err == nil && e.reclaim.pressure {
		e.reclaim.fillsSooner(e.clk.Now()) // the bucket may now be full, before the last sweep said any would be
	}
	return d, err
}

// nilContext is the error for a call given a nil context, in the place of
// the context's own error: ErrClosed still comes first.
func (e *Engine) nilContext() error {
	if e.closed.Load() {
		return ErrClosed
	}
	return ErrNilContext
}

// ctxErr is the error of a call that finds ctx ended, nil if it has not:
// ErrClosed if Close has begun too, as ErrClosed comes first in the order
// of errors, whichever of the two the call noticed (a select waiting on
// both picks either).
func (e *Engine) ctxErr(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if e.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}
