package engine

import (
	"context"

	"github.com/tokenshard/tokenshard/msg"
)

// Allow decides whether key may spend cost tokens now. Errors come in the
// order of DESIGN 3.2: ErrInvalidKey, ErrInvalidCost (cost < 1), ErrClosed,
// the context's error, then from the key's shard ErrInvalidCost (cost above
// the key's own capacity: its override's, or the default), ErrClockRegression
// and ErrKeyCapacity. An error
// changes nothing. A denial is not an error: it is a Decision with Allowed
// false and a RetryAfter estimate.
//
// Allow blocks while the shard's mailbox is full, until there is room, ctx
// ends or the engine closes; once the shard has taken the request, Allow
// returns its answer whatever ctx does. It does not allocate.
func (e *Engine) Allow(ctx context.Context, key string, cost int64) (Decision, error) {
	if err := e.checkKey(key); err != nil {
		return Decision{}, err
	}
	if cost < 1 {
		return Decision{}, ErrInvalidCost
	}
	a := e.allows.Get().(*msg.Allow)
	i, h := e.shardOf(key)
	a.Key, a.Hash, a.Cost = key, h, cost
	if err := e.mailboxes[i].SendAllow(ctx, a); err != nil {
		a.Key = ""
		e.allows.Put(a)
		return Decision{}, err
	}
	<-a.Done // a shard that took the request always answers, even on Close
	r := a.Reply
	a.Key, a.Reply = "", msg.Reply{}
	e.allows.Put(a)
	return Decision(r.Decision), r.Err
}
