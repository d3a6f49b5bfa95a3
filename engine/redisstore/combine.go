package redisstore

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/yield"
)

// maxInFlight is how many script calls of single Allows one queue keeps in
// flight at once: below it, a caller sends its own call at once; at it,
// callers wait and are sent together by the next call. More calls in flight
// carry fewer requests each, for more Redis CPU per decision and no more
// throughput (the figures are in bench's package doc).
const maxInFlight = 2

// combiner merges concurrent single Allows bound for one destination into
// shared script calls: a caller that finds fewer than maxInFlight calls in
// flight sends its request at once, alone, so an idle store adds no
// latency; a caller that finds maxInFlight queues, and when a call
// returns with requests queued behind it, a drainer goroutine takes its
// place in flight and sends them, up to ChunkSize per call, until none is
// left (see drain). Every caller waits only until its own deadline.
type combiner struct {
	mu       sync.Mutex
	inFlight int
	queue    []*waiter
}

// waiter is one single Allow in a combiner. Waiters are reused (see
// waiters): a caller that gives up leaves its waiter, which a call may still
// hold, to the garbage collector.
type waiter struct {
	it       item
	res      engine.Result
	parent   context.Context // the caller's
	deadline time.Time       // parent's, or the store's Timeout from the call, if sooner
	wake     chan struct{}   // one token: answered
	timer    *time.Timer     // fires at deadline
	report   error           // set when answered: the call's error, for this caller to pass to OnError

	state waitState // guarded by the combiner's mu
}

type waitState uint8

const (
	queued    waitState = iota // in the queue
	taken                      // in a call being sent
	answered                   // res holds the answer
	abandoned                  // its caller left at its deadline or cancellation
)

// queueFor is the combiner that key's single Allows join. On a cluster it
// is the key's virtual shard's, so that a combined call touches one slot of
// one master, and a master that is slow to answer holds up only its own
// shards' calls; on one server it is the first, for every key (every call
// goes to the same place). Every request of a call must be one the script
// can decide together.
func (s *Store) queueFor(key string) *combiner {
	return &s.queues[s.stateShard(s.shard(key))]
}

// decideOne decides a checked request without counting it, through key's
// combiner: by Redis if the store has read the prefix's state or this call
// reads it (see up), else by the failure rule (as also when the deadline
// passed since the check). A pin other than 0 is the only version it may
// be decided under: under another it is answered errMoved.
func (s *Store) decideOne(ctx context.Context, key string, cost, pin int64) (engine.Decision, error) {
	if !s.ready.Load() { // one deadline for reaching Redis and deciding
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	if ok, err := s.up(ctx); !ok {
		return s.failOne(ctx, key, cost, err)
	}
	c := s.queueFor(key)
	c.mu.Lock()
	if c.inFlight < maxInFlight && len(c.queue) == 0 {
		c.inFlight++
		c.mu.Unlock()
		return s.allowAlone(ctx, c, key, cost, pin)
	}
	// A waiter needs no context of its own, only its deadline and a timer:
	// the call that sends it makes one for all its requests.
	w := waiters.Get().(*waiter)
	w.it = item{out: &w.res, key: key, cost: cost, pin: pin, combined: true}
	w.parent, w.deadline, w.state = ctx, s.deadline(ctx), queued // res is zero: see done
	w.timer.Reset(clock.Until(w.deadline))
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	expired, done := false, ctx.Done()
	for {
		select {
		case <-w.wake:
		case <-w.timer.C:
			expired = true
		case <-done:
		}
		c.mu.Lock()
		switch {
		case w.state == answered:
			// answered, even if its deadline has passed meanwhile: Redis
			// decided it, and counted it (or the failure rule did, and this
			// caller reports the call's error)
			c.mu.Unlock()
			s.report(w.report)
			return w.done()
		case w.state == taken && !expired && ctx.Err() != nil:
			// Canceled in a call already sent: Redis may take its cost,
			// so it waits for the answer, until its deadline, as a call
			// of its own does (go-redis does not cut a read short).
			done = nil
		case expired || ctx.Err() != nil:
			if i := slices.Index(c.queue, w); i >= 0 && w.state == queued {
				c.queue = slices.Delete(c.queue, i, i+1)
			}
			// A call that has it no longer answers or counts it, nor sends
			// it if not yet sent: this caller answers, and counts, itself.
			w.state = abandoned
			c.mu.Unlock()
			w.timer.Stop()
			return s.failOne(ctx, key, cost, cmp.Or(ctx.Err(), context.DeadlineExceeded))
		}
		c.mu.Unlock() // a token left over from a wake it did not need
	}
}

// allowAlone decides one request in a call of its own, in a place in
// flight of c that it hands on however the call ends, even by a panic of
// OnError, which runs on this goroutine.
func (s *Store) allowAlone(ctx context.Context, c *combiner, key string, cost, pin int64) (engine.Decision, error) {
	defer func() {
		// Requests queued behind this call go with a drainer that takes
		// its place in flight; if none did, the place is free.
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.inFlight--
		} else {
			go s.drain(c)
		}
		c.mu.Unlock()
	}()
	s.atHook(hookAlone)
	var out engine.Result
	if err := s.decideItems(ctx, []item{{out: &out, key: key, cost: cost, pin: pin}}); err != nil {
		return engine.Decision{}, err
	}
	return out.Decision, out.Err
}

// waiters are the waiters of callers that have their answer, for reuse: a
// single Allow that waits then allocates no channel, timer or context. A
// waiter is put back only once nothing else holds it: its call has
// answered it (under the combiner's lock, which it took after the call let
// it go).
var waiters = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &waiter{wake: make(chan struct{}, 1), timer: t}
}}

// done is w's result as Allow returns it: its answer (for a caller
// canceled during a call that Redis did not answer, the context's error:
// see sendCombined); w goes back to waiters.
func (w *waiter) done() (engine.Decision, error) {
	d, err := w.res.Decision, w.res.Err
	w.timer.Stop() // no tick is received after Stop (Go 1.23 timers)
	select {
	case <-w.wake: // a token left over
	default:
	}
	w.it, w.res, w.parent, w.report = item{}, engine.Result{}, nil, nil
	waiters.Put(w)
	return d, err
}

// drain sends c's queued requests, up to ChunkSize per call, until the
// queue is empty, on a goroutine of its own that holds the place in flight
// of the call that started it (see allowAlone). A drainer is the only
// goroutine a combiner starts; it lives only while callers wait, and every
// call it makes ends by their deadlines. Under load a drainer sends the
// next call as soon as its last one returns and the callers it answered
// have had the processor to join it: no caller has to be woken to send
// it, and no caller waits for others' calls after its own answer.
func (s *Store) drain(c *combiner) {
	var batch []*waiter
	c.mu.Lock()
	for len(c.queue) > 0 {
		k := min(len(c.queue), ChunkSize)
		batch = append(batch[:0], c.queue[:k]...)
		c.queue = append(c.queue[:0], c.queue[k:]...)
		for _, w := range batch {
			w.state = taken
		}
		c.mu.Unlock()
		answered := s.sendCombined(c, batch)
		clear(batch) // hold no waiter its caller may put back for reuse
		c.mu.Lock()
		if answered && len(c.queue) < ChunkSize {
			// The callers just answered wait on this processor's run
			// queue, and under load most of them call again at once:
			// yielding to them before taking the next batch lets them join
			// it, where they would otherwise wait for the call after it.
			// Each call then carries more requests, so fewer round trips
			// are paid per request (bench's package doc has the figures).
			// The requests queued already leave later by the time the
			// goroutines queued on this processor run, a few microseconds
			// for callers that only call again; behind goroutines that
			// compute, up to a scheduling round.
			c.mu.Unlock()
			yield.Local()
			c.mu.Lock()
		}
	}
	c.inFlight--
	c.mu.Unlock()
}

// sendCombined sends batch as one call, answers every caller still
// waiting, and reports whether there was one. Each request is answered and
// counted once, by whichever comes first under the combiner's lock: its
// caller giving up (the failure rule), or the call's end (Redis's answer,
// or the failure rule for a request the call did not decide).
func (s *Store) sendCombined(c *combiner, batch []*waiter) bool {
	s.atHook(hookTaken)
	// Callers that gave up since the batch was taken have their answer:
	// sending them would only spend their tokens (batch is the drainer's own).
	c.mu.Lock()
	send := slices.DeleteFunc(batch, func(w *waiter) bool { return w.state == abandoned })
	c.mu.Unlock()
	if len(send) == 0 {
		return false
	}
	// The call runs until the latest deadline of its callers, with the first
	// such caller's context values; no caller's cancellation cuts the others'.
	last := slices.MaxFunc(send, func(a, b *waiter) int { return a.deadline.Compare(b.deadline) })
	cctx, cancel := context.WithDeadline(context.WithoutCancel(last.parent), last.deadline)
	items := make([]item, len(send))
	for i, w := range send {
		items[i] = w.it
	}
	_, err := s.exec(cctx, "a", "", items)
	cancel()
	s.atHook(hookSent)
	// Every caller still waiting is answered here, under the lock: the
	// failure rule's answers below are in place before any of them wakes.
	c.mu.Lock()
	var first *waiter // the first caller still waiting whom Redis did not answer
	n, woke := uint64(0), false
	for i, w := range send {
		it := &items[i]
		if w.state == abandoned {
			it.done = true // answered and counted by its caller
			continue
		}
		w.state, woke = answered, true
		select { // one token: answered
		case w.wake <- struct{}{}:
		default:
		}
		switch {
		case it.counted:
			n++
		case !it.done && errors.Is(w.parent.Err(), context.Canceled):
			// Not decided by Redis, and its caller canceled: it answers
			// the context's error, uncounted but as an error, as a call
			// of its own does (see fail), not the failure rule.
			*it.out, it.done = engine.Result{Err: w.parent.Err()}, true
		case !it.done && first == nil:
			first = w
		}
	}
	s.decisions.Add(n)
	if err != nil && first != nil {
		s.failAnswers(items) // into the waiters' results
		// OnError runs on a caller's goroutine, as for a call of its own,
		// not on this one, which goes on to the next call
		first.report = unavailable(err)
	}
	c.mu.Unlock()
	return woke
}

// atHook runs the test hook, if any, at point.
func (s *Store) atHook(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}

// Points in the combiner, and in a lease's give-back and flush, where a
// test hook (Store.hook) runs.
const (
	hookAlone      = "alone"      // a caller that found its queue free, before its call
	hookTaken      = "taken"      // a drainer has taken a batch, before it looks at it
	hookSent       = "sent"       // a batch's call has returned, before it is answered
	hookGiveBack   = "giveback"   // a give-back has judged its leases, before it sends them
	hookFlushWaits = "flushwaits" // a flush met a closed lease shard, before it waits for Close
)
