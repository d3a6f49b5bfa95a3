package shard

import "github.com/tokenshard/tokenshard/msg"

// serveData serves the single requests queued, if any, then the batch
// parts queued when it looks, up to partsPerTurn: so neither kind starves
// the other, and callers sending parts together (AllowAll's holds among
// them) are served in one turn, not one turn each. It reports whether it
// served anything.
func (s *Shard) serveData() bool {
	served := s.serveAllows()
	n := min(len(s.mb.batch), partsPerTurn)
	for range n {
		s.serveBatch(<-s.mb.batch) // there: only this goroutine receives
	}
	return served || n > 0
}

// partsPerTurn bounds the batch parts one turn serves, and with them how
// long control and single requests wait behind parts.
const partsPerTurn = 8

// serveBatch decides a batch part at one clock reading and answers it.
func (s *Shard) serveBatch(b *msg.Batch) {
	s.endSent()
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
	b.Answer()
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
// decides. Holds cost the group one test: only a shard with a hold or work
// waiting on one looks at each key before deciding it (serveHeld).
//
// The group counts against the mailbox's size until it is served. Control
// waits for at most the pass in progress: a background slice, the holds'
// step, one group and up to partsPerTurn batch parts.
func (s *Shard) serveAllows() bool {
	a := s.mb.take()
	if a == nil {
		return false
	}
	s.endSent()
	s.yieldFirst = true
	if s.stats.c[msg.HighWater] == 0 {
		// The group holds one request at least: published before it is
		// answered, so that Stats after a shard's first answer show it.
		s.stats.bump(msg.HighWater, 1)
	}
	var n int
	switch {
	case s.bare:
		n = serveBare(a)
	case s.holding():
		n = s.serveHeld(a)
	case a.Next != nil && s.state.worthWarming(2):
		n = s.serveWarmed(a)
	default:
		n = s.serveWalking(a)
	}
	if uint64(n) > s.stats.c[msg.HighWater] {
		// Published at once, not at the next park: a maximum rises seldom.
		s.stats.bump(msg.HighWater, uint64(n)-s.stats.c[msg.HighWater])
	}
	s.mb.taken(n)
	s.served()
	return true
}

// serve decides a at now, answers it and counts it: every path that
// decides a single request comes here. w is a's place in the last warm
// (see State.warmStart), or -1 for none.
func (s *Shard) serve(now int64, a *msg.Single, w int) {
	switch {
	case a.Op != msg.OpAllow: // one test on the common path
		switch a.Op {
		case msg.OpPeek:
			s.state.peek(now, a.Key, a.Hash, &a.Reply)
		case msg.OpRefund:
			s.state.refund(now, a.Key, a.Hash, a.Cost, &a.Reply)
		case msg.OpWait:
			s.state.decide(now, a.Key, a.Hash, a.Cost, &a.Reply)
			a.Hash = uint64(now) // the reading the estimate counts from
		default:
			s.state.charge(now, a.Key, a.Hash, a.Cost, &a.Reply)
		}
	case w < 0:
		s.state.decide(now, a.Key, a.Hash, a.Cost, &a.Reply)
	default:
		s.state.decideWarmed(w, now, a.Key, a.Hash, a.Cost, &a.Reply)
	}
	s.count(now, a)
	a.Finish() // after this, a belongs to its sender again
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
		s.serve(now, a, -1)
		a, n = next, n+1
	}
	return n
}

// serveHeld is serveWalking on a shard with holds: a request whose key is
// held, or has work waiting, waits behind it (hold.go).
func (s *Shard) serveHeld(a *msg.Single) int {
	now := s.clk.Now()
	s.ring(now)
	n := 0
	for a != nil {
		next := a.Next
		a.Next = nil
		if s.blocked(a.Key) {
			s.wait(waiter{single: a}) // answered once the hold on its key ends
		} else {
			s.serve(now, a, -1)
		}
		a, n = next, n+1
	}
	return n
}

// serveBare answers the group whose newest request is a without deciding
// it (see Bare), and returns its size.
func serveBare(a *msg.Single) int {
	n := 0
	for a != nil {
		next := a.Next
		a.Next = nil
		a.Finish()
		a, n = next, n+1
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
		s.serve(now, a, i)
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
