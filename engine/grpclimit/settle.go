package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/tokenshard/tokenshard/engine"
)

// Errors returned by Settle (see its list). Test for them with errors.Is.
var (
	// ErrNotSettleable: the call did not pass through a Limiter with
	// WithCost (for a stream, one without WithPerMessage, which spends
	// per message), so it has no estimate to settle.
	ErrNotSettleable = errors.New("grpclimit: the call has no estimate to settle")
	// ErrNegativeActual: Settle was given an actual cost below 0.
	ErrNegativeActual = errors.New("grpclimit: actual cost below 0")
	// ErrNotTaken: the Limiter let the call through without taking its
	// cost (WithShadow, a store's failure rule): there is nothing to
	// settle.
	ErrNotTaken = errors.New("grpclimit: the call's cost was not taken")
	// ErrSettled: Settle was called for the call already.
	ErrSettled = errors.New("grpclimit: the call was settled already")
)

// Settle settles the cost of a call once its handler knows it, as
// httplimit.Settle does for a request: given the handler's context (or one
// derived from it), it charges the key the rest when actual is above the
// cost WithCost estimated and the interceptor took
// (engine.Admitter.Charge: never refused, into debt that the key's later
// calls repay before any is admitted) or refunds the difference when it is
// below (engine.Admitter.Refund, capped at the capacity), on the same key.
// Unary and stream calls alike are settled once for the whole call. As with
// httplimit.Settle, a refund made once the bucket has refilled gives back
// tokens the refill already restored: for a long call, estimate low.
//
// A call is settleable only when it passed through a Limiter with WithCost:
// a unary call always, a stream unless WithPerMessage makes it spend per
// message, with no one estimate; with the default cost of 1, give WithCost
// a function returning 1 to settle. Carrying the estimate costs each call that
// reaches the handler one allocation (its context), whether or not it is
// settled. Behind several such interceptors, Settle settles each one the
// call passed through that took its cost, innermost first, and joins their
// errors; one that took nothing (a shadow one that would have refused the
// call) is passed over, and Settle is ErrNotTaken only when none took a
// cost.
//
// It runs at most once per call and is safe to call from any goroutine,
// also after the call's context has ended: it keeps the context's values
// but not its cancellation. Errors:
//   - ErrNotSettleable: ctx is not a call's through such a Limiter (an
//     exempt method, a context built by hand, a nil ctx). Nothing is
//     settled.
//   - ErrNegativeActual: actual < 0. Nothing is settled, and the call may
//     still be.
//   - ErrNotTaken: the Limiter let the call through without taking its
//     cost, so nothing is charged: under WithShadow a call the limit would
//     have refused or could not decide (under enforcement it would not have
//     run, and a shadow limit holds what enforcement would), and a call a
//     store's failure rule admitted (engine.Decision.Degraded: no bucket was
//     consulted). A call a shadow Limiter admitted took its cost as under
//     enforcement, and is settled so.
//   - ErrSettled: the call was settled already, whatever that call
//     returned; a charge is never taken twice.
//   - the admitter's error, wrapped with the key (a closed engine, a store
//     that cannot be reached). A charge that a store's failure rule
//     answered (engine.Decision.Degraded: Redis could not tell whether it
//     was taken; it is never taken twice) is such an error too, wrapping
//     ErrDegraded.
func Settle(ctx context.Context, actual int64) error {
	if ctx == nil {
		return ErrNotSettleable
	}
	s, _ := ctx.Value(settleKey{}).(*settleState)
	if s == nil {
		return ErrNotSettleable
	}
	if actual < 0 {
		return fmt.Errorf("%w: %d", ErrNegativeActual, actual)
	}
	ctx = context.WithoutCancel(ctx)
	if s.parent == nil {
		return s.settle(ctx, actual)
	}
	// Only the Limiters that took a cost are settled, and only their
	// errors joined: ErrNotTaken says nothing was charged, so it is the
	// answer only when none took one.
	var errs []error
	taken := false
	for ; s != nil; s = s.parent {
		if s.take.taken {
			taken = true
			errs = append(errs, s.settle(ctx, actual))
		}
	}
	if !taken {
		return ErrNotTaken
	}
	return errors.Join(errs...)
}

// settleKey is the context key of a call's settleState.
type settleKey struct{}

// settleState is what one Limiter took for one call, for Settle.
type settleState struct {
	engine  engine.Admitter
	take    take
	settled atomic.Bool
	parent  *settleState // an outer Limiter's, or nil
}

// settleCtx carries a settleState in one allocation.
type settleCtx struct {
	context.Context
	s settleState
}

func (c *settleCtx) Value(k any) any {
	if _, ok := k.(settleKey); ok {
		return &c.s
	}
	return c.Context.Value(k)
}

// settleable returns ctx carrying what l took for its call.
func (l *Limiter) settleable(ctx context.Context, t take) context.Context {
	c := &settleCtx{}
	l.settleInto(ctx, c, t)
	return c
}

// settleInto makes c ctx carrying what l took for its call.
func (l *Limiter) settleInto(ctx context.Context, c *settleCtx, t take) {
	c.Context = ctx
	c.s.engine, c.s.take = l.engine, t
	c.s.parent, _ = ctx.Value(settleKey{}).(*settleState)
}

// settledStream is a server stream whose context carries what the Limiter
// took for it, in the same allocation.
type settledStream struct {
	grpc.ServerStream
	ctx settleCtx
}

func (s *settledStream) Context() context.Context { return &s.ctx }

// settle settles one Limiter's take.
func (s *settleState) settle(ctx context.Context, actual int64) error {
	if !s.take.taken {
		return ErrNotTaken
	}
	if !s.settled.CompareAndSwap(false, true) {
		return ErrSettled
	}
	diff := actual - s.take.cost // both >= 0: no overflow
	var err error
	switch {
	case diff > 0:
		// A charge a store's failure rule answered may not have been taken:
		// ErrDegraded, as a Refund Redis did not answer is an error.
		var d engine.Decision
		if d, err = s.engine.Charge(ctx, s.take.key, diff); err == nil && d.Degraded {
			err = fmt.Errorf("%w: the charge of %d may not have been taken", ErrDegraded, diff)
		}
	case diff < 0:
		_, err = s.engine.Refund(ctx, s.take.key, -diff)
	}
	if err != nil {
		return fmt.Errorf("grpclimit: settling key %q: %w", s.take.key, err)
	}
	return nil
}
