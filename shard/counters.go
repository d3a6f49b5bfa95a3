package shard

import (
	"strings"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/msg"
)

// counters is what a shard counts (see msg.Counter), in plain fields of the
// loop's own, and as other goroutines may read them: the loop stores the
// count of an answer in pub before it answers, and the key count too when
// the answer changed it, so a caller's Stats after its call counts both;
// the high-water mark as it rises (serveAllows), a dropped event as it is
// dropped (sample), a sweep's counts at its end; the rest (the holds) when
// it is about to park and every publishEvery messages while it is busy.
// Cutovers are counted by the engine's coordinator. Reading never slows
// the loop.
type counters struct {
	c       msg.Counters // owned by the loop
	pub     [msg.NumCounters]atomic.Uint64
	unsaved int // messages served since the counters were published

	// Sampling (see Sample): one decision in every every goes to events.
	id     int
	events chan<- msg.Event
	every  uint64
	toNext uint64
}

// publishEvery bounds how stale published counters are while a shard never
// goes idle.
const publishEvery = 64

func (c *counters) add(k msg.Counter, n uint64) { c.c[k] += n }

// bump adds n to counter k and publishes it: before an answer, so that its
// caller's Stats count it.
func (c *counters) bump(k msg.Counter, n uint64) {
	c.c[k] += n
	c.pub[k].Store(c.c[k])
}

// Sample makes the shard send one decision in every n (n >= 1) to events,
// without blocking: when events is full the decision is dropped and
// counted. Call it before Run.
func (s *Shard) Sample(id int, events chan<- msg.Event, n uint64) {
	st := &s.stats
	st.id, st.events, st.every, st.toNext = id, events, n, n
}

// Counters returns the counters the loop last published. It is safe to call
// from any goroutine, during and after Run.
func (s *Shard) Counters() msg.Counters {
	var c msg.Counters
	for k := range c {
		c[k] = s.stats.pub[k].Load()
	}
	return c
}

// PublishCounters stores the counters for Counters before Run: a shard
// restored from a snapshot has keys before it serves anything, and Counters
// must count them once the engine is returned, not once the loop has
// started.
func (s *Shard) PublishCounters() { s.publish() }

// publish stores the loop's counters for Counters.
func (s *Shard) publish() {
	st := &s.stats
	st.unsaved = 0
	st.c[msg.Keys] = uint64(s.state.keyCount())
	for k, v := range st.c {
		st.pub[k].Store(v)
	}
}

// publishIfBehind publishes what was counted since the last publish, if
// anything: the shard is about to park, and Stats should see it all.
func (s *Shard) publishIfBehind() {
	if s.stats.unsaved > 0 {
		s.publish()
	}
}

// publishKeys publishes the key count if it changed since it was last
// published: before an answer that created a key, so that Stats after the
// call count it, as KeyCount does (an AllowAll's keys, created after its
// caller has its answer, are published at the next answer or park). Only a creation changes it there, so
// the common answer pays one comparison.
func (s *Shard) publishKeys() {
	st := &s.stats
	if n := uint64(s.state.keyCount()); n != st.c[msg.Keys] {
		st.c[msg.Keys] = n
		st.pub[msg.Keys].Store(n)
	}
}

// served counts one group or batch part, publishing now and then.
func (s *Shard) served() {
	if s.stats.unsaved++; s.stats.unsaved >= publishEvery {
		s.publish()
	}
}

// count tallies one answer to a single request, publishes that count
// before the request is answered, so a caller's Stats after its call sees
// it, and samples the answer if it is a decision's (an Allow's or a
// Charge's, error or not).
func (s *Shard) count(now int64, a *msg.Single) {
	r := &a.Reply
	k := msg.Denied
	switch {
	case r.Err != nil:
		k = msg.ErrorCounter(msg.KindOf(r.Err))
	case a.Op == msg.OpPeek:
		k = msg.Peeks
	case a.Op == msg.OpRefund:
		k = msg.Refunds
	case r.Decision.Allowed:
		k = msg.Allowed
	}
	st := &s.stats
	st.bump(k, 1)
	s.publishKeys()
	// Peeks and refunds are not decisions, failed or not: an event for one
	// would report a request no caller made.
	if st.events != nil && a.Op != msg.OpPeek && a.Op != msg.OpRefund {
		s.sample(now, a.Key, a.Cost, r)
	}
}

// countBatch tallies the answers to a batch part, publishes those counts
// (and the key count, if the part changed it) before the part is answered,
// as count does, and samples them. It publishes only what the part changed:
// each published counter is an atomic store, a full barrier on some
// processors, and a part changes two or three of the counters.
func (s *Shard) countBatch(now int64, b *msg.Batch) {
	st := &s.stats
	var allowed, denied uint64
	var errs [msg.NumErrKinds]uint64
	for i := range b.Items {
		r := &b.Out[i]
		switch {
		case r.Err != nil:
			errs[msg.KindOf(r.Err)]++
		case r.Decision.Allowed:
			allowed++
		default:
			denied++
		}
	}
	if allowed > 0 {
		st.bump(msg.Allowed, allowed)
	}
	if denied > 0 {
		st.bump(msg.Denied, denied)
	}
	for k, n := range errs {
		if n > 0 {
			st.bump(msg.ErrorCounter(msg.ErrKind(k)), n)
		}
	}
	s.publishKeys()
	if st.events != nil {
		for i := range b.Items {
			s.sample(now, b.Items[i].Key, b.Items[i].Cost, &b.Out[i])
		}
	}
}

// sample sends one decision in every st.every to events, never waiting.
func (s *Shard) sample(now int64, key string, cost int64, r *msg.Reply) {
	st := &s.stats
	if st.toNext--; st.toNext > 0 {
		return
	}
	st.toNext = st.every
	select {
	case st.events <- msg.Event{Key: strings.Clone(key), Cost: cost, Decision: r.Decision, Err: r.Err, Shard: st.id, Reading: now}:
	default:
		st.bump(msg.EventsDropped, 1) // before the answer, as its count: drops are what a caller checks Stats for
	}
}
