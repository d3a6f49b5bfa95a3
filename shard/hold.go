package shard

import "github.com/tokenshard/tokenshard/msg"

// serveHold serves b, one shard's part of an all-or-nothing decision (see
// msg.Hold): it checks the part at its reading and answers; then, unless
// that failed, it holds, serving nothing else, until the caller commits or
// aborts. Before the caller's Eval, a control message or stop ends the hold
// at once (answered Aborted) and is then served as the loop would: so a
// cutover, sweep, snapshot or Close never waits on a hold that waits on it.
// After Eval the shard waits for the caller alone, who sends Commit or
// Abort without waiting on anything: the hold is as short as the caller's
// own steps.
func (s *Shard) serveHold(b *msg.Batch) {
	h := b.Hold
	now := s.clk.Now()
	s.ring(now)
	h.Now = now
	h.Version = s.state.Policy().Version
	ok := s.state.HoldBegin(now, b.Items, b.Out, &h.Fresh)
	if ok && h.Last {
		h.T = max(h.T, now)
		s.state.HoldEval(h.T, b.Items, b.Out)
	}
	b.Done <- b.Part
	s.served()
	if !ok {
		return
	}
	s.stats.add(msg.Holds, 1)
	if h.Last {
		s.awaitEnd(b, h)
		return
	}
	for {
		in := s.inputs()
		select {
		case c := <-h.In:
			switch c.Op {
			case msg.HoldEval:
				s.state.HoldEval(c.T, b.Items, b.Out)
				h.Out <- msg.HoldReply{}
				s.awaitEnd(b, h)
			case msg.HoldCommit:
				s.state.HoldCommit(c.T, b.Items, c.Admit)
				h.Out <- msg.HoldReply{}
			default:
				h.Out <- msg.HoldReply{}
			}
			return
		case p := <-in.prepare:
			s.giveUp(h)
			s.prepare(p)
			return
		case <-in.ready:
			s.giveUp(h)
			return
		case w := <-in.sweep:
			s.giveUp(h)
			s.beginSweep(w)
			return
		case m := <-in.snap:
			s.giveUp(h)
			s.beginSnapshot(m)
			return
		case <-s.stop:
			s.giveUp(h) // the loop sees stop next
			return
		}
	}
}

// awaitEnd waits, after Eval, for the caller's Commit or Abort, ends the
// hold with it and says so.
func (s *Shard) awaitEnd(b *msg.Batch, h *msg.Hold) {
	c := <-h.In
	if c.Op == msg.HoldCommit {
		s.state.HoldCommit(c.T, b.Items, c.Admit)
	}
	h.Out <- msg.HoldReply{} // the slot is free: the caller took Eval's answer
}

// giveUp ends a hold before Eval: the caller, who may be waiting for Eval's
// answer, hears Aborted.
func (s *Shard) giveUp(h *msg.Hold) {
	h.Out <- msg.HoldReply{Aborted: true} // the slot is free: Eval's answer was never sent
	s.stats.add(msg.HoldsAborted, 1)
}
