package engine

import (
	"context"
	"fmt"
	"math"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
	"github.com/tokenshard/tokenshard/shard"
)

// acquire takes the coordinator, honouring ctx and Close. A nil ctx is
// ErrNilContext, after ErrClosed.
func (e *Engine) acquire(ctx context.Context) error { return e.take(ctx, e.admin) }

// take takes the one-slot semaphore sem as acquire takes the coordinator.
func (e *Engine) take(ctx context.Context, sem chan struct{}) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if ctx == nil {
		return ErrNilContext
	}
	if err := e.ctxErr(ctx); err != nil {
		return err
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return e.ctxErr(ctx)
	case <-e.closing:
		return ErrClosed
	}
}

func (e *Engine) release() { <-e.admin }

// EvictFull removes every bucket that is full and returns how many it
// removed; background sweeps count separately. A full bucket is exactly what
// a new key would get, so dropping it changes no future answer under the
// policy in force (after a cutover that raises its capacity, a key dropped
// full comes back with the new capacity, as any new key does), while a
// depleted or partly refilled bucket is never dropped, however old. Keys
// created after their shard's pass began survive it.
//
// Each shard sweeps in slices of about 1024 slots of its table, serving
// requests between slices, so a sweep over a million keys holds no request
// up for more than one slice (an AllowAll that meets a shard being swept
// starts over once the sweep is done, holding no key meanwhile: see
// AllowAll); each bucket is judged at the clock reading of the slice that
// reaches it. Shards are swept one after another. If ctx ends part-way, the
// shard sweeping finishes the slice in progress and starts no other, and
// EvictFull returns the count so far with the context's error. A slice whose
// clock reading stepped back ends that shard's pass (what earlier slices
// removed stays removed and is counted), and EvictFull returns
// ErrClockRegression once every other shard is done. After Close, or if
// Close comes part-way, it returns ErrClosed with the count so far. Before
// it sweeps: ErrNotInitialized for a zero Engine, then ErrClosed, then
// ErrNilContext or the context's error.
func (e *Engine) EvictFull(ctx context.Context) (int, error) {
	if e.uninitialized() {
		return 0, ErrNotInitialized
	}
	if err := e.acquire(ctx); err != nil {
		return 0, err
	}
	defer e.release()
	r, err := e.sweep(ctx, false)
	return r.evicted, err
}

// sweepResult is what one pass over every shard found: the buckets it
// evicted, and (if asked) the reading at which the first one it kept is full.
type sweepResult struct {
	evicted int
	soonest int64
}

// sweep runs one pass over every shard; the caller holds the coordinator.
// With estimate set, each shard also finds when its first kept bucket is full.
func (e *Engine) sweep(ctx context.Context, estimate bool) (sweepResult, error) {
	w := &msg.Sweep{Done: make(chan msg.SweepReply, 1), Soonest: estimate, Stop: ctx.Done()}
	res := sweepResult{soonest: math.MaxInt64}
	var regression error
	for _, mb := range e.mailboxes {
		if err := e.ctxErr(ctx); err != nil {
			return res, err
		}
		r := mb.Sweep(ctx, w)
		res.evicted += r.Evicted
		switch {
		case r.Err == ErrClockRegression:
			regression = r.Err
		case r.Err == msg.ErrSweepStopped:
			return res, e.ctxErr(ctx) // Stop is ctx.Done(), closed: never nil
		case r.Err != nil:
			return res, r.Err
		default:
			res.soonest = min(res.soonest, r.Soonest)
		}
	}
	return res, regression
}

// ReplacePolicy installs next if the version in force is expectedVersion and
// next.Version is above it. Errors, in order: ErrNotInitialized (a zero
// Engine), ErrInvalidPolicy (wrapped, naming the field; even when next is
// also stale), ErrClosed, ErrNilContext or the context's error,
// ErrStalePolicy; a shard whose clock stepped back makes it fail with
// ErrClockRegression. On any error nothing changes anywhere.
//
// Each shard cuts over at its own clock reading: a bucket keeps what it
// earned under its key's old limit up to that instant, is clamped to the
// capacity its key resolves to under next (its override, or next's
// default), and refills at that limit's rate from then on. Raising a
// capacity tops nobody up; new keys start full at their own capacity.
//
// The cutover has two phases: every shard takes its reading and stops
// serving (prepare), then every shard switches (publish). Before the first,
// the coordinator waits until every shard can prepare at once: a shard that
// has kept too much policy history after many cutovers finishes converting
// first, serving requests meanwhile, and the wait honours ctx. So once any call
// has seen the new version no later call sees the old one, and every call
// that starts after ReplacePolicy returns sees the new version. A context
// that ends before publish aborts everywhere, and so does a Close that starts
// before it (then ReplacePolicy returns ErrClosed); once publish has begun,
// ReplacePolicy completes and returns nil. Concurrent calls with the same
// expectedVersion: exactly one succeeds.
//
// The work that grows with next's overrides, building the table of its
// distinct limits (once, shared by every shard), is done before any shard
// prepares, so the barrier does not lengthen with it.
func (e *Engine) ReplacePolicy(ctx context.Context, next policy.Policy, expectedVersion int64) error {
	if e.uninitialized() {
		return ErrNotInitialized
	}
	if err := next.Validate(); err != nil {
		return err
	}
	if err := e.acquire(ctx); err != nil {
		return err
	}
	defer e.release()
	cur := e.Policy()
	if expectedVersion != cur.Version || next.Version <= cur.Version {
		return fmt.Errorf("%w: expected version %d, next version %d, version in force %d",
			ErrStalePolicy, expectedVersion, next.Version, cur.Version)
	}

	// Phase 0: build the limit table every shard will share, and wait until
	// every shard can prepare at once (one that has kept too much policy
	// history finishes converting first, serving requests meanwhile), so
	// no prepared shard waits on another: a table of many limits takes
	// milliseconds to build.
	lim := shard.NewLimits(next)
	for _, mb := range e.mailboxes {
		if err := mb.WaitReady(ctx); err != nil {
			return err
		}
	}

	// Phase 1: prepare. Each prepared shard serves nothing until publish or
	// abort, so the barrier lasts only as long as this loop.
	p := &msg.Prepare{Done: make(chan error, 1)}
	prepared := 0
	var err error
	for _, mb := range e.mailboxes {
		if err = mb.Prepare(ctx, lim, p); err != nil {
			break
		}
		prepared++
	}
	switch {
	case err != nil:
	case e.closed.Load():
		// Close came before publish: the prepared shards stop unchanged,
		// so the cutover aborts, as it would had a prepare met Close.
		err = ErrClosed
	default:
		err = ctx.Err() // the last chance to abort
	}
	if err != nil {
		for _, mb := range e.mailboxes[:prepared] {
			mb.Abort() // false only on Close, which stops the shard unchanged
		}
		if e.closed.Load() {
			return ErrClosed
		}
		return err
	}

	// Phase 2: publish. From here the cutover completes, whatever ctx does.
	// Each published cutover is counted here, before ReplacePolicy returns,
	// so that Stats after it count it; the shard switches after the send.
	e.pol.Store(&next)
	for i, mb := range e.mailboxes {
		if mb.Publish() {
			e.cutovers[i].Add(1)
		}
	}
	e.reclaim.fillsSooner(e.clk.Now())
	return nil
}
