package shard

import "github.com/tokenshard/tokenshard/msg"

// serveData serves the single requests queued, if any, then one waiting
// batch part, if any: one of each per turn, so neither kind starves the
// other. It reports whether it served anything.
func (s *Shard) serveData() bool {
	served := s.serveAllows()
	select {
	case b := <-s.mb.batch:
		s.serveBatch(b)
		return true
	default:
		return served
	}
}

// serveBatch decides a batch part at one clock reading and answers it.
func (s *Shard) serveBatch(b *msg.Batch) {
	if b.Hold != nil {
		s.serveHold(b)
		return
	}
	if s.holding() && s.partBlocked(b) {
		s.wait(waiter{part: b}) // served once the hold on its keys ends
		return
	}
	now := s.clk.Now()
	s.ring(now)
	s.state.batch(now, b)
	s.countBatch(now, b)
	b.Done <- b.Part
	s.served()
	s.yieldFirst = true
}

// serveAllows takes every queued single request, reads the clock once
// after the take, and decides them. It reports whether there were any.
//
// The queue links each request to the one pushed before it, so the shard
// walks it newest first, and decides in that order: every request taken
// together is concurrent with the others (none has been answered), so any
// order is one the calls could have run in. Walking is a chain of loads,
// each of a line the sender's core last wrote; deciding while walking
// overlaps the next load with the work. Over a large table the walk warms
// the cache for every request instead (see State.worthWarming), then
// decides.
//
// The group counts against the mailbox's size until it is served. Control
// waits for at most one group: no more than the mailbox's size.
func (s *Shard) serveAllows() bool {
	a := s.mb.take()
	if a == nil {
		return false
	}
	s.yieldFirst = true
	if d := uint64(s.mb.queued.Load()); d > s.stats.c[msg.HighWater] {
		s.stats.c[msg.HighWater] = d
	}
	var n int
	if a.Next != nil && !s.bare && s.state.worthWarming(2) {
		n = s.serveWarmed(a)
	} else {
		n = s.serveWalking(a)
	}
	s.mb.taken(n)
	s.served()
	return true
}

// serveWalking decides the group whose newest request is a as it walks it,
// and returns its size.
func (s *Shard) serveWalking(a *msg.Single) int {
	now := s.clk.Now()
	s.ring(now)
	n := 0
	for a != nil {
		next := a.Next
		a.Next = nil // a pooled message must not keep others alive
		n++
		if s.bare {
			a.Finish()
			a = next
			continue
		}
		if s.holding() && s.blocked(a.Key) {
			s.wait(waiter{single: a}) // answered once the hold on its key ends
			a = next
			continue
		}
		switch a.Op {
		case msg.OpAllow:
			s.state.decide(now, a.Key, a.Hash, a.Cost, &a.Reply)
		case msg.OpPeek:
			s.state.peek(now, a.Key, a.Hash, &a.Reply)
		case msg.OpCharge:
			s.state.charge(now, a.Key, a.Hash, a.Cost, &a.Reply)
		default:
			s.state.refund(now, a.Key, a.Hash, a.Cost, &a.Reply)
		}
		s.count(now, a)
		a.Finish() // after this, a belongs to its sender again
		a = next
	}
	return n
}

// serveWarmed walks the group whose newest request is a, warming the cache
// for each, then decides them in the same order, and returns its size.
// Peeks and refunds are rare, and find their buckets without the warm.
func (s *Shard) serveWarmed(a *msg.Single) int {
	g := s.group[:0]
	s.state.warmStart()
	for a != nil {
		next := a.Next
		a.Next = nil
		s.state.warmKey(a.Key, a.Hash)
		g = append(g, a)
		a = next
	}
	s.state.warmFinish()
	now := s.clk.Now()
	s.ring(now)
	for i, a := range g {
		if s.holding() && s.blocked(a.Key) {
			s.wait(waiter{single: a})
			g[i] = nil
			continue
		}
		switch a.Op {
		case msg.OpAllow:
			s.state.decideWarmed(i, now, a.Key, a.Hash, a.Cost, &a.Reply)
		case msg.OpPeek:
			s.state.peek(now, a.Key, a.Hash, &a.Reply)
		case msg.OpCharge:
			s.state.charge(now, a.Key, a.Hash, a.Cost, &a.Reply)
		default:
			s.state.refund(now, a.Key, a.Hash, a.Cost, &a.Reply)
		}
		s.count(now, a)
		a.Finish()
		g[i] = nil // the message goes back to its pool; do not keep it alive
	}
	s.state.unwarm()
	s.group = g[:0]
	return len(g)
}

// ring checks the alarm, if any, at the reading now.
func (s *Shard) ring(now int64) {
	if s.alarm != nil {
		s.alarm.check(now)
	}
}
