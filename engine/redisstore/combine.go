package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tokenshard/tokenshard/engine"
)

// maxInFlight is how many script calls of single Allows one queue keeps in
// flight at once: below it, a caller sends its own call at once; at it,
// callers wait and are sent together by the next call.
const maxInFlight = 2

// combiner merges concurrent single Allows bound for one destination into
// shared script calls, by flat combining, with no goroutine of its own: a
// caller that finds fewer than maxInFlight calls in flight sends its request
// at once, alone, so an idle store adds no latency; a caller that finds
// maxInFlight queues, and when a call returns, its sender hands every queued
// request (up to ChunkSize) to one of their callers, which sends them as one
// call and answers each. Every caller waits only until its own deadline.
type combiner struct {
	mu       sync.Mutex
	inFlight int
	queue    []*waiter
}

// waiter is one single Allow in a combiner.
type waiter struct {
	it       item
	res      engine.Result
	parent   context.Context // the caller's
	ctx      context.Context // parent, bounded by the store's Timeout
	deadline time.Time
	wake     chan struct{} // one token: answered, or handed a batch to lead

	// guarded by the combiner's mu
	state waitState
	lead  []*waiter // handed to this caller to send: itself among them
}

type waitState uint8

const (
	queued    waitState = iota // in the queue
	taken                      // in a call being sent
	answered                   // res holds the answer
	abandoned                  // its caller left at its deadline or cancellation
)

// queueFor is the combiner that key's single Allows join: the store's one.
// Every request of a call must be one the script can decide together.
func (s *Store) queueFor(string) *combiner { return &s.single }

// allowOne decides one valid request through key's combiner.
func (s *Store) allowOne(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	bctx, cancel := s.bound(ctx)
	defer cancel()
	c := s.queueFor(key)
	c.mu.Lock()
	if c.inFlight < maxInFlight && len(c.queue) == 0 {
		c.inFlight++
		c.mu.Unlock()
		var out engine.Result
		items := []item{{out: &out, key: key, cost: cost}}
		err := s.decide(ctx, bctx, items)
		s.handOff(c, nil)
		if err != nil {
			return engine.Decision{}, err
		}
		return out.Decision, out.Err
	}
	w := &waiter{it: item{key: key, cost: cost, combined: true}, parent: ctx, ctx: bctx, wake: make(chan struct{}, 1)}
	w.it.out = &w.res
	w.deadline, _ = bctx.Deadline()
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	for {
		select {
		case <-w.wake:
		case <-bctx.Done():
		}
		c.mu.Lock()
		switch {
		case w.lead != nil:
			batch := w.lead
			w.lead = nil
			c.mu.Unlock()
			s.sendCombined(c, w, batch)
			return w.answer()
		case w.state == answered:
			c.mu.Unlock()
			return w.answer()
		case bctx.Err() != nil:
			if w.state == queued {
				for i, q := range c.queue {
					if q == w {
						c.queue = append(c.queue[:i], c.queue[i+1:]...)
						break
					}
				}
			}
			w.state = abandoned // a call that has it no longer answers it
			c.mu.Unlock()
			if errors.Is(ctx.Err(), context.Canceled) {
				return engine.Decision{}, ctx.Err()
			}
			var out engine.Result
			it := w.it
			it.out = &out
			s.answerFailure([]item{it}, bctx.Err())
			return out.Decision, out.Err
		}
		c.mu.Unlock() // a token left over from a wake it did not need
	}
}

// answer is w's result as Allow returns it: its answer, or the context's
// error of a caller canceled during the call that Redis did not answer.
func (w *waiter) answer() (engine.Decision, error) {
	if !w.it.done && errors.Is(w.parent.Err(), context.Canceled) {
		return engine.Decision{}, w.parent.Err()
	}
	return w.res.Decision, w.res.Err
}

// sendCombined sends batch (leader among it) as one call and answers every
// caller still waiting, then hands the queue on.
func (s *Store) sendCombined(c *combiner, leader *waiter, batch []*waiter) {
	// The call runs until the latest deadline of its callers: the leader's,
	// chosen so. Its caller's cancellation does not cut the others' call.
	dl := leader.deadline
	for _, w := range batch {
		if w.deadline.After(dl) {
			dl = w.deadline
		}
	}
	cctx, cancel := context.WithDeadline(context.WithoutCancel(leader.ctx), dl)
	items := make([]item, len(batch))
	for i, w := range batch {
		items[i] = w.it
	}
	_, err := s.exec(cctx, "a", "", items)
	cancel()
	c.mu.Lock()
	var live []item // not answered by Redis, and still awaited
	n := uint64(0)
	for i, w := range batch {
		if w.state == abandoned {
			continue
		}
		w.it.done = items[i].done
		switch {
		case items[i].counted:
			n++
		case !items[i].done && !(w == leader && errors.Is(w.parent.Err(), context.Canceled)):
			live = append(live, items[i])
		}
	}
	c.mu.Unlock()
	s.decisions.Add(n)
	if err != nil && len(live) > 0 {
		s.answerFailure(live, err)
	}
	s.handOff(c, batch)
}

// handOff ends a call: it wakes every caller of batch still waiting (their
// answers are in), then gives the queued requests to one of their callers
// to send, or counts the call out of flight.
func (s *Store) handOff(c *combiner, batch []*waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range batch {
		if w.state == taken {
			w.state = answered
			signal(w)
		}
	}
	if len(c.queue) == 0 {
		c.inFlight--
		return
	}
	k := min(len(c.queue), ChunkSize)
	next := make([]*waiter, k)
	copy(next, c.queue[:k])
	c.queue = append(c.queue[:0], c.queue[k:]...)
	lead := next[0]
	for _, w := range next {
		w.state = taken
		if w.deadline.After(lead.deadline) {
			lead = w
		}
	}
	lead.lead = next
	signal(lead)
}

func signal(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
