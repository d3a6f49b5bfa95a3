package shard

import (
	"strings"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/msg"
)

// counters is what a shard counts (see msg.Counter), in plain fields of the
// loop's own, and as other goroutines may read them: the loop stores its
// counts in pub when it is about to park, and every publishEvery messages
// while it is busy, so reading never slows the loop.
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

// served counts one group or batch part, publishing now and then.
func (s *Shard) served() {
	if s.stats.unsaved++; s.stats.unsaved >= publishEvery {
		s.publish()
	}
}

// count tallies one answer to a single request, and samples it.
func (s *Shard) count(now int64, a *msg.Single) {
	r := &a.Reply
	c := &s.stats.c
	switch {
	case r.Err != nil:
		c[msg.ErrorCounter(msg.KindOf(r.Err))]++
	case a.Op == msg.OpPeek:
		c[msg.Peeks]++
		return
	case a.Op == msg.OpRefund:
		c[msg.Refunds]++
		return
	case r.Decision.Allowed:
		c[msg.Allowed]++
	default:
		c[msg.Denied]++
	}
	if s.stats.events != nil {
		s.sample(now, a.Key, a.Cost, r)
	}
}

// countBatch tallies the answers to a batch part, and samples them.
func (s *Shard) countBatch(now int64, b *msg.Batch) {
	c := &s.stats.c
	for i := range b.Items {
		r := &b.Out[i]
		switch {
		case r.Err != nil:
			c[msg.ErrorCounter(msg.KindOf(r.Err))]++
		case r.Decision.Allowed:
			c[msg.Allowed]++
		default:
			c[msg.Denied]++
		}
		if s.stats.events != nil {
			s.sample(now, b.Items[i].Key, b.Items[i].Cost, r)
		}
	}
}

// countHold tallies a committed hold part's requests: each is a decision,
// allowed if the call admitted them all, else denied (none was charged).
// They are published like a served part's counts.
func (s *Shard) countHold(h *msg.Hold, admit bool) {
	if admit {
		s.stats.c[msg.Allowed] += uint64(h.Requests)
	} else {
		s.stats.c[msg.Denied] += uint64(h.Requests)
	}
	s.served()
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
		st.c[msg.EventsDropped]++
	}
}
