package shard

import "github.com/tokenshard/tokenshard/msg"

// Holds: the shard's side of an all-or-nothing decision (msg.Hold). A hold
// is on keys, not on the shard: while a part is held, requests for its keys
// wait (they are kept aside, in order, and served once the hold ends), and
// every other key of the shard is served as usual. So are other holds on
// other keys. A part or request that names a held key, or a key with work
// already waiting, waits behind it, so each key's requests keep their order.
//
// The caller's commands come on each hold's In, announced on the mailbox's
// hold signal; the loop looks at every hold's In at each turn and when the
// signal wakes it.
//
// Before the caller's Eval, a control message or stop makes the shard give
// every such hold up at once (answered Aborted on Out); after Eval, it waits
// for the caller alone, who sends Commit or Abort without waiting on
// anything. So a cutover, sweep, snapshot or Close never waits on a hold
// that waits on it. Holds are taken in shard order by every caller, so two
// calls never wait on each other in a cycle.

// holdSet is the holds the shard keeps and the work waiting on their keys.
type holdSet struct {
	parts    []*msg.Batch // held parts, each with its Hold
	voted    map[*msg.Hold]bool
	waiting  []waiter       // work naming a held or waiting key, oldest first
	waitKeys map[string]int // the keys of waiting work, counted
	// Hold parts may wait for no key: for the end of a sweep (afterSweep),
	// or for the control message that made releaseHolds keep them aside
	// (afterControl). Replay then serves them; any other waiting work
	// waits on a hold, whose end replays it.
	afterSweep, afterControl bool
}

// waiter is work kept aside until its keys are free: a single request or a
// batch part (a hold part among them).
type waiter struct {
	single *msg.Single
	part   *msg.Batch
}

// holding reports whether any hold or waiting work exists, the only case in
// which the data path looks at keys before deciding.
func (s *Shard) holding() bool { return len(s.holds.parts) != 0 || len(s.holds.waiting) != 0 }

// blocked reports whether work for key must wait: the key is held, or work
// for it already waits.
func (s *Shard) blocked(key string) bool {
	return s.state.isHeld(key) || s.holds.waitKeys[key] > 0
}

// partBlocked reports whether any item of b is blocked.
func (s *Shard) partBlocked(b *msg.Batch) bool {
	for i := range b.Items {
		if s.blocked(b.Items[i].Key) {
			return true
		}
	}
	return false
}

// wait keeps w aside until its keys are free.
func (s *Shard) wait(w waiter) {
	if s.holds.waitKeys == nil {
		s.holds.waitKeys = map[string]int{}
	}
	s.holds.waiting = append(s.holds.waiting, w)
	for _, k := range w.keys() {
		s.holds.waitKeys[k]++
	}
}

func (w waiter) keys() []string {
	if w.single != nil {
		return []string{w.single.Key}
	}
	keys := make([]string, len(w.part.Items))
	for i := range w.part.Items {
		keys[i] = w.part.Items[i].Key
	}
	return keys
}

// serveHold serves b, a hold part: unless one of its keys is blocked, or a
// sweep is in progress (then it waits), it checks the part at its reading
// and answers; then, unless that failed, it holds the part's keys until
// the caller commits or aborts. The last part of a call evaluates at once.
//
// No hold is taken while a sweep runs: every sweep begins with a control
// message, which ends the holds first, so a sweep never meets a held key,
// which it could neither judge (the call may yet take from it) nor skip
// (the pass would then miss a bucket that stays full).
func (s *Shard) serveHold(b *msg.Batch) {
	if s.partBlocked(b) {
		s.wait(waiter{part: b})
		return
	}
	if s.state.sweeping() && !s.stopping {
		s.wait(waiter{part: b})
		s.holds.afterSweep = true
		return
	}
	h := b.Hold
	if s.stopping {
		b.Closed = true // taken at the end: the call ends with ErrClosed, having taken nothing
		b.Done <- b.Part
		return
	}
	now := s.clk.Now()
	s.ring(now)
	h.Now = now
	h.Version = s.state.policyInForce().Version
	ok := s.state.holdBegin(now, b.Items, b.Out, &h.Fresh)
	voted := ok && h.Last
	if voted {
		h.T = max(h.T, now)
		s.state.holdEval(h.T, b.Items, b.Out)
	}
	b.Done <- b.Part
	s.served()
	if !ok {
		return
	}
	s.stats.add(msg.Holds, 1)
	if s.holds.voted == nil {
		s.holds.voted = map[*msg.Hold]bool{}
	}
	s.holds.parts = append(s.holds.parts, b)
	s.holds.voted[h] = voted
}

// pollHolds carries out every command the holds' callers have sent, and
// serves the waiting work whose keys a hold ending freed. It reports
// whether it did anything.
func (s *Shard) pollHolds() bool {
	did, ended := s.pollHoldsOnly()
	if ended {
		s.replay(true)
	}
	return did
}

// pollHoldsOnly is pollHolds without serving the work a hold ending frees
// (releaseHolds serves it, holds aside, once every hold has ended). It
// reports whether it carried out a command, and whether a hold ended.
func (s *Shard) pollHoldsOnly() (did, ended bool) {
	for i := 0; i < len(s.holds.parts); {
		b := s.holds.parts[i]
		select {
		case c := <-b.Hold.In:
			did = true
			if s.holdStep(b, c) {
				s.dropHold(i)
				ended = true
				continue
			}
		default:
		}
		i++
	}
	return did, ended
}

// holdStep carries out c for b and reports whether the hold ended.
func (s *Shard) holdStep(b *msg.Batch, c msg.HoldCmd) bool {
	h := b.Hold
	switch c.Op {
	case msg.HoldEval:
		s.state.holdEval(c.T, b.Items, b.Out)
		s.holds.voted[h] = true
		h.Out <- msg.HoldReply{}
		return false
	case msg.HoldCommit:
		s.state.holdCommit(c.T, b.Items, c.Admit)
		s.countHold(h, c.Admit)
	default:
		s.state.holdRelease(b.Items)
	}
	h.Out <- msg.HoldReply{} // the slot is free: the caller took Eval's answer, or none was sent
	return true
}

// dropHold forgets the ith held part.
func (s *Shard) dropHold(i int) {
	delete(s.holds.voted, s.holds.parts[i].Hold)
	s.holds.parts = append(s.holds.parts[:i], s.holds.parts[i+1:]...)
}

// releaseHolds ends every hold, for a control message or stop: those not
// yet evaluated are given up at once (their callers hear Aborted and try
// again); for the others it waits on their callers, who send Commit or
// Abort without waiting on anything. Then it serves the waiting work, but
// takes no new hold: the control message comes first, and a hold taken now
// could wait on it (a prepared shard evaluates nothing). Waiting hold
// parts are served by a later turn (or answered Closed at stop).
//
// It waits for evaluated holds' callers without watching stop or the
// control message's sender: that is sound only because a caller, once it
// has its Eval answers, sends Commit or Abort without waiting on anything
// (engine's allowAll keeps it so: no context, no blocking reservation, no
// other shard's answer in between).
func (s *Shard) releaseHolds() {
	for i := 0; i < len(s.holds.parts); {
		b := s.holds.parts[i]
		if s.holds.voted[b.Hold] {
			i++
			continue
		}
		s.state.holdRelease(b.Items)
		b.Hold.Out <- msg.HoldReply{Aborted: true} // the slot is free: Eval's answer was never sent
		s.stats.add(msg.HoldsAborted, 1)
		s.dropHold(i)
	}
	for len(s.holds.parts) > 0 {
		if did, _ := s.pollHoldsOnly(); !did {
			<-s.mb.holdSig // a caller's next command comes with a signal
		}
	}
	s.replay(s.stopping)
	s.holds.afterControl = len(s.holds.waiting) != 0 // hold parts, served next turn
}

// replay serves the waiting work whose keys are free, oldest first; work
// that names a key still held, or a key of earlier work still waiting,
// waits on, and so do hold parts unless holds is set.
func (s *Shard) replay(holds bool) {
	if holds {
		s.holds.afterSweep, s.holds.afterControl = false, false
	}
	if len(s.holds.waiting) == 0 {
		return
	}
	waiting := s.holds.waiting
	s.holds.waiting = nil
	clear(s.holds.waitKeys)
	for _, w := range waiting {
		stuck := false
		for _, k := range w.keys() {
			stuck = stuck || s.blocked(k)
		}
		isHold := w.part != nil && w.part.Hold != nil
		switch {
		case stuck || (isHold && !holds):
			s.wait(w)
		case w.single != nil:
			s.serveOne(w.single)
		case w.part.Hold != nil:
			s.serveHold(w.part)
		default:
			s.serveBatch(w.part)
		}
	}
}

// serveOne decides one single request that waited, at its own reading.
func (s *Shard) serveOne(a *msg.Single) {
	now := s.clk.Now()
	s.ring(now)
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
	a.Finish()
	s.served()
}
