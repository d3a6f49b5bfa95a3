package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/engine"
)

// Settle settles the cost of a request once its handler knows it: the
// tokens of a completion, the bytes of a streamed response. The middleware
// took WithCost's estimate before the handler ran; Settle takes the rest
// when actual is above it (engine.Admitter.Charge: never refused, the key's
// bucket may go into debt, which its later requests repay before any of
// them is admitted) or gives back the difference when actual is below it
// (engine.Admitter.Refund, capped at the capacity), on the same key. An
// actual equal to the estimate changes nothing. A refund made once the
// bucket has refilled gives back tokens the refill already restored (see
// engine.Engine.Refund): for a handler that runs long, estimate low and let
// Settle charge the rest. Under WithKeys every key of the request is settled by that same
// difference, actual less the cost each key was given (a key given more
// than once counts its costs added up), so every key must have been given
// the same cost (else ErrUnevenEstimate).
//
// A request is settleable only when it passed through a Middleware built
// with WithCost or WithKeys, whose cost is an estimate: with the default
// cost of 1, give WithCost a function returning 1 to settle. Carrying the
// estimate costs each request that reaches the handler two allocations
// (the request, with its context), whether or not it is settled. Behind several
// such middlewares, Settle settles each one the request passed through that
// took its cost, innermost first, and joins their errors; one that took
// nothing (a shadow one that would have denied it) is passed over, and
// Settle is ErrNotTaken only when none took a cost.
//
// It runs at most once per request and is safe to call from any goroutine,
// also after the client has gone: the request's context may have ended, and
// Settle still settles, with the context's values but not its cancellation.
// Errors:
//   - ErrNotSettleable: r did not pass through such a middleware (a request
//     built by hand, a handler outside it, a nil r), or through one without
//     WithCost or WithKeys. Nothing is settled.
//   - ErrNegativeActual: actual < 0. Nothing is settled, and the request
//     may still be.
//   - ErrNotTaken: the middleware let the request through without taking
//     its cost, so there is nothing to settle and nothing is charged:
//     under WithShadow a request the limit would have denied or could not
//     decide (under enforcement it would not have run, and a shadow limit
//     holds what enforcement would), and a request a store's failure rule
//     admitted (engine.Decision.Degraded: no bucket was consulted). A
//     request a shadow middleware admitted took its cost as under
//     enforcement, and is settled as under enforcement. A later call says
//     ErrNotTaken again.
//   - ErrUnevenEstimate: under WithKeys, the keys were given different
//     costs. Nothing is settled, and it stays so: a second call says
//     ErrSettled.
//   - ErrSettled: the request was settled already, whatever that call
//     returned (but ErrNotTaken, which stays); a charge is never taken
//     twice.
//   - the admitter's error for a key, wrapped with the key (a closed
//     engine, a store that cannot be reached): the other keys are settled
//     all the same, and the errors joined. A charge that a store's failure
//     rule answered (engine.Decision.Degraded: Redis could not tell whether
//     it was taken; it is never taken twice) is such an error too,
//     wrapping ErrDegraded.
func Settle(r *http.Request, actual int64) error {
	if r == nil {
		return ErrNotSettleable
	}
	s, _ := r.Context().Value(settleKey{}).(*settleState)
	if s == nil {
		return ErrNotSettleable
	}
	if actual < 0 {
		return fmt.Errorf("%w: %d", ErrNegativeActual, actual)
	}
	ctx := context.WithoutCancel(r.Context())
	if s.parent == nil {
		return s.settle(ctx, actual)
	}
	// Only the middlewares that took a cost are settled, and only their
	// errors joined: ErrNotTaken says nothing was charged, so it is the
	// answer only when none took one.
	var errs []error
	taken := false
	for ; s != nil; s = s.parent {
		if s.taken {
			taken = true
			errs = append(errs, s.settle(ctx, actual))
		}
	}
	if !taken {
		return ErrNotTaken
	}
	return errors.Join(errs...)
}

// settleKey is the context key of a request's settleState.
type settleKey struct{}

// settleState is what one middleware took for one request, for Settle.
type settleState struct {
	engine  engine.Admitter
	key     string           // the key, without WithKeys
	cost    int64            // its cost, without WithKeys
	reqs    []engine.Request // WithKeys' requests
	taken   bool             // false: ErrNotTaken
	settled atomic.Bool
	parent  *settleState // an outer middleware's, or nil
}

// settleContext carries a settleState in one allocation.
type settleContext struct {
	context.Context
	s settleState
}

func (c *settleContext) Value(k any) any {
	if _, ok := k.(settleKey); ok {
		return &c.s
	}
	return c.Context.Value(k)
}

// settleable returns r carrying what the middleware took for it (t, taken
// if its cost was), or r itself for a middleware that cannot settle.
func (m *Middleware) settleable(r *http.Request, t take, taken bool) *http.Request {
	if !m.settles {
		return r
	}
	ctx := r.Context()
	c := &settleContext{Context: ctx}
	c.s.engine, c.s.key, c.s.cost, c.s.reqs, c.s.taken = m.engine, t.key, t.cost, t.reqs, taken
	c.s.parent, _ = ctx.Value(settleKey{}).(*settleState)
	return r.WithContext(c)
}

// settle settles one middleware's take.
func (s *settleState) settle(ctx context.Context, actual int64) error {
	if !s.taken {
		return ErrNotTaken
	}
	if !s.settled.CompareAndSwap(false, true) {
		return ErrSettled
	}
	estimate := s.cost
	if s.reqs != nil {
		var ok bool
		if estimate, ok = evenCost(s.reqs); !ok {
			return ErrUnevenEstimate
		}
	}
	diff := actual - estimate // both >= 0: no overflow
	if diff == 0 {
		return nil
	}
	if s.reqs == nil {
		return settleKeyBy(ctx, s.engine, s.key, diff)
	}
	var errs []error
	for i, q := range s.reqs {
		if firstOf(s.reqs, i) {
			errs = append(errs, settleKeyBy(ctx, s.engine, q.Key, diff))
		}
	}
	return errors.Join(errs...)
}

// settleKeyBy charges diff to key, or refunds -diff when it is negative.
// A charge that a store's failure rule answered (engine.Decision.Degraded:
// Redis could not say it was taken) is ErrDegraded, as a Refund Redis did
// not answer is an error: nil says the key was settled.
func settleKeyBy(ctx context.Context, a engine.Admitter, key string, diff int64) error {
	var err error
	if diff > 0 {
		var d engine.Decision
		if d, err = a.Charge(ctx, key, diff); err == nil && d.Degraded {
			err = fmt.Errorf("%w: the charge of %d may not have been taken", ErrDegraded, diff)
		}
	} else {
		_, err = a.Refund(ctx, key, -diff)
	}
	if err != nil {
		return fmt.Errorf("httplimit: settling key %q: %w", key, err)
	}
	return nil
}

// firstOf reports whether reqs[i] is its key's first request.
func firstOf(reqs []engine.Request, i int) bool {
	for _, q := range reqs[:i] {
		if q.Key == reqs[i].Key {
			return false
		}
	}
	return true
}

// evenCost returns the cost every key of reqs was given, its requests'
// costs added up, and false when they differ. AllowAll admitted reqs, so
// each sum is within int64.
func evenCost(reqs []engine.Request) (int64, bool) {
	cost := int64(-1)
	for i := range reqs {
		if !firstOf(reqs, i) {
			continue
		}
		var sum int64
		for _, q := range reqs[i:] {
			if q.Key == reqs[i].Key {
				sum += q.Cost
			}
		}
		if cost >= 0 && sum != cost {
			return 0, false
		}
		cost = sum
	}
	return cost, true
}
