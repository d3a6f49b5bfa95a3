package shard

import (
	"slices"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/msg"
)

// Holds: the shard's side of an all-or-nothing decision (msg.Hold). A hold
// is on keys, not on the shard: while a part is held, requests for its keys
// wait (they are kept aside, in order, and served once the hold ends), and
// every other key of the shard is served as usual. So are other holds on
// other keys. A part or request that names a held key, or a key with work
// already waiting, waits behind it, so each key's requests keep their order.
//
// A hold's caller ends it through the hold's Step (msg.Hold), then calls
// the mailbox's SignalHold, which wakes the shard if it is parked; the loop
// looks at every hold's Step at each turn and before it parks.
//
// A control message or stop makes the shard give every pending hold up at
// once; a hold its caller has claimed, it waits for, and that caller ends
// it without waiting on anything. So a cutover, sweep, snapshot or Close
// never waits on a hold that waits on it. A part that waits for its keys
// comes from a caller holding in shard order; a Try part waits for nothing
// (answered Busy), so two calls never wait on each other in a cycle.

// holdSet is the holds the shard keeps and the work waiting on their keys.
type holdSet struct {
	parts    []*msg.Batch   // held parts, each with its Hold
	waiting  []waiter       // work naming a held or waiting key, oldest first
	waitKeys map[string]int // the keys of waiting work, counted
	queued   atomic.Int64   // len(waiting), stored as it changes: the one field other goroutines read (Waiting)
	// aside: hold parts wait for no key, but for the end of the control
	// message that made releaseHolds keep them aside; the loop's next
	// holds step replays them (tendHolds), and a sweep then running
	// answers them Busy. Any other waiting work waits on a hold, whose end
	// replays it.
	aside bool
	// ended: a hold ended outside tendHolds (see serveHold), and the work
	// waiting on its keys is yet to be served.
	ended bool
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
	s.holds.queued.Store(int64(len(s.holds.waiting)))
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

// serveHold serves b, a hold part: unless one of its keys is blocked (then
// it waits, or a Try part is answered Busy at once, holding nothing), or a
// sweep is in progress (then it is answered Busy), it checks the part at
// its reading, copies its buckets into the Hold's Snaps and answers; then,
// unless the check failed, it holds the part's keys until the caller ends
// the hold or the shard gives it up.
//
// No hold is taken while a sweep runs: every sweep begins with a control
// message, which ends the holds first, so a sweep never meets a held key,
// which it could neither judge (the call may yet take from it) nor skip
// (the pass would then miss a bucket that stays full). Nor does a part
// wait for the sweep: its caller may hold keys on other shards, whose
// requests would wait as long, so it is answered Busy, and the caller
// starts over once the sweep is done.
func (s *Shard) serveHold(b *msg.Batch) {
	h := b.Hold
	blocked, sweeping := s.partBlocked(b), s.state.sweeping() && !s.stopping
	switch {
	case (h.Try && blocked) || sweeping:
		h.Busy = true // waits for nothing: the caller holds in order, or after the sweep, instead
		b.Answer()
		return
	case blocked:
		s.wait(waiter{part: b})
		return
	}
	if s.stopping {
		b.Closed = true // taken at the end: the call ends with ErrClosed, having taken nothing
		b.Answer()
		return
	}
	now := s.clk.Now()
	s.ring(now)
	h.Now = now
	h.Version = s.state.policyInForce().Version
	ok := s.state.holdBegin(now, b.Items, b.Out, &h.Fresh)
	if ok {
		s.state.holdSnap(now, b.Items, h.Snaps)
		s.holds.parts = append(s.holds.parts, b)
		s.stats.add(msg.Holds, 1)
		h.Keep()
	}
	b.Answer()
	s.served()
	s.yieldFirst = true // the caller's end, or another part, may come before a park would end
}

// endSent carries out the ends the holds' callers sent before the work in
// hand reached the shard, which is to be served next: a caller ends its
// hold and returns, and whatever it sends next, for any key of the shard,
// must find the call done (its instant observed, so that an older reading
// is ErrClockRegression; its keys free), even when the end came after this
// turn's holds step. A caller that holds the same keys call after call
// has ended its last hold before it sends the next part. With no hold it
// costs one test.
func (s *Shard) endSent() {
	if len(s.holds.parts) != 0 && s.endHolds() {
		s.holds.ended = true // the next turn serves the work those ends freed
	}
}

// tendHolds is the loop's holds step (see Shard.turn): it carries out the
// ends the holds' callers sent, then serves the waiting work whose keys a
// hold ending freed, and the hold parts kept aside (a sweep running
// answers them Busy).
func (s *Shard) tendHolds() {
	if s.endHolds() || s.holds.ended || s.holds.aside {
		s.holds.ended = false
		s.replay(true)
	}
}

// endHolds carries out every end the holds' callers have sent, serving
// nothing, and reports whether it ended a hold.
func (s *Shard) endHolds() (ended bool) {
	for i := 0; i < len(s.holds.parts); {
		b := s.holds.parts[i]
		switch h := b.Hold; h.Step() {
		case msg.HoldCommit:
			s.state.holdCommit(h.T, b.Items, h.Admit)
			s.served() // its decisions are the caller's to count (engine's Stats)
		case msg.HoldAbort:
			s.state.holdRelease(b.Items)
		default: // pending, or claimed: its end is on its way
			i++
			continue
		}
		s.holds.parts = slices.Delete(s.holds.parts, i, i+1)
		b.Hold.Release()
		ended = true
	}
	return ended
}

// holdEnded reports whether a hold's caller has ended it: endHolds has
// work.
func (s *Shard) holdEnded() bool {
	for _, b := range s.holds.parts {
		if op := b.Hold.Step(); op == msg.HoldCommit || op == msg.HoldAbort {
			return true
		}
	}
	return false
}

// waitHolds parks until a hold's caller may have ended it. As at the
// loop's park, the shard announces it sleeps, then looks at the holds; a
// caller ends its hold, then looks whether the shard sleeps (SignalHold):
// one of them sees the other.
func (s *Shard) waitHolds() {
	s.mb.sleeping.Store(true)
	if !s.holdEnded() {
		<-s.mb.wake
	}
	s.mb.sleeping.Store(false)
}

// releaseHolds ends every hold, for a control message or stop: those still
// pending are given up at once (their callers' Claim fails, and they try
// again); for the claimed ones it waits on their callers, who end them
// without waiting on anything. Then it serves the waiting work, but takes
// no new hold: the control message comes first, and a hold taken now could
// wait on it (a prepared shard holds nothing). Waiting hold parts are
// served by a later turn (or answered Closed at stop).
//
// It waits for claimed holds' callers without watching stop or the control
// message's sender: that is sound only because a caller, once it has
// claimed its holds, ends them without waiting on anything (engine's
// allowAll keeps it so: no context, no blocking reservation, no other
// shard's answer in between).
func (s *Shard) releaseHolds() {
	s.holds.parts = slices.DeleteFunc(s.holds.parts, func(b *msg.Batch) bool {
		if !b.Hold.GiveUp() {
			return false
		}
		s.state.holdRelease(b.Items)
		s.stats.add(msg.HoldsAborted, 1)
		s.stats.unsaved++ // published at the next park: a control message may serve nothing that publishes
		b.Hold.Release()
		return true
	})
	for s.endHolds(); len(s.holds.parts) > 0; s.endHolds() {
		s.waitHolds()
	}
	s.replay(s.stopping)
	s.holds.aside = len(s.holds.waiting) != 0 // hold parts, served by a later pass
}

// replay serves the waiting work whose keys are free, oldest first; work
// that names a key still held, or a key of earlier work still waiting,
// waits on, and so do hold parts unless holds is set.
func (s *Shard) replay(holds bool) {
	if holds {
		s.holds.aside = false
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
			now := s.clk.Now()
			s.ring(now)
			s.serve(now, w.single, -1)
			s.served()
		case w.part.Hold != nil:
			s.serveHold(w.part)
		default:
			s.serveBatch(w.part)
		}
	}
	s.holds.queued.Store(int64(len(s.holds.waiting)))
}

// Waiting returns how many single requests and batch parts the shard has
// taken from its mailbox and keeps aside behind an AllowAll's hold (see
// holdSet). It is safe to call from any goroutine.
func (s *Shard) Waiting() int { return int(s.holds.queued.Load()) }
