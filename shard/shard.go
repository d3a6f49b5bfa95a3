package shard

import (
	"runtime"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/internal/yield"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// Shard is one goroutine's worth of state: a State, the clock it reads and
// the Mailbox it serves. Run is meant for one goroutine, which then owns it.
// It is internal to tokenshard: only package engine uses it.
type Shard struct {
	state *State
	clk   clock.Clock
	mb    *Mailbox
	group []*msg.Single   // reused buffer of one group of single requests
	task  task            // the background work in progress, if any
	alarm *Alarm          // checked at each reading requests are decided at, if set
	stop  <-chan struct{} // Run's: a hold gives up when it closes
	holds holdSet         // AllowAll holds and the work waiting on them (hold.go)
	// stopping: the loop has ended; waiting hold parts are answered
	// Closed, not held.
	stopping bool

	yieldFirst bool // data was served since the last yield: yield before parking
	dataFirst  bool // a cutover just ended: serve data before control once
	bare       bool // answer single requests without deciding them (see Bare)

	stats counters
}

// New returns a shard serving p on mb, reading clk, sharing budget. Keys
// arrive hashed by h. It is internal to tokenshard: only package engine
// calls it.
func New(p policy.Policy, clk clock.Clock, budget *Budget, mb *Mailbox, h *Hasher) *Shard {
	return &Shard{
		state: newState(p, budget, h),
		clk:   clk,
		mb:    mb,
		group: make([]*msg.Single, 0, mb.size), // the most a mailbox queues
	}
}

// State returns the shard's state, for an engine restoring it before Run:
// once Run starts, only the shard's goroutine may touch it.
func (s *Shard) State() *State { return s.state }

// Bare makes the shard answer every single request with a zero reply,
// reading no clock and touching no bucket: the transport alone, for
// benchmarks to measure what the hand-off costs. Call it before Run.
func (s *Shard) Bare() { s.bare = true }

// Run serves the mailbox until stop is closed, then answers ErrClosed to
// every request still queued and returns. The engine closes stop only after
// the mailbox is closed, so nothing can arrive after the final drain.
func (s *Shard) Run(stop <-chan struct{}) {
	s.stop = stop
	s.publish() // a restored shard starts with keys
	defer s.drain()
	defer s.endTask()
	for s.turn(stop) {
	}
	// Requests kept aside for held keys were taken: they are answered, once
	// the holds end.
	s.stopping = true
	s.releaseHolds()
}

// inputs are the channels one turn of the loop listens on. An input that is
// switched off is nil, and a nil channel is never ready.
type inputs struct {
	prepare <-chan *msg.Prepare
	ready   <-chan struct{}
	sweep   <-chan *msg.Sweep
	snap    <-chan *msg.Snapshot
	// A snapshot that has no chunk to fill waits for the writer to hand
	// one back, or to give up.
	free   <-chan *msg.SnapChunk
	cancel <-chan struct{}
}

// inputs switches the control inputs on and off: a shard whose policy
// history is full takes no cutover (and answers no readiness check) until
// its conversion pass is done, and a shard with background work in progress
// takes no sweep or snapshot, whose slices would otherwise replay every
// cutover a bucket missed.
func (s *Shard) inputs() inputs {
	mb := s.mb
	in := inputs{prepare: mb.prepare, ready: mb.ready, sweep: mb.sweep, snap: mb.snap}
	if s.state.historyFull() {
		in.prepare, in.ready = nil, nil
	}
	if s.background() != nil {
		in.sweep, in.snap = nil, nil
	}
	if t, ok := s.task.(*snapTask); ok && t.waiting {
		in.free, in.cancel = t.m.Free, t.m.Cancel
	}
	return in
}

// turn is one pass of the loop; it reports false once stop has come. The
// precedence between kinds of work is written here and nowhere else:
//
//  1. A prepared shard serves nothing but publish, abort and stop: the
//     cutover's barrier.
//  2. Control messages, when a sender waits for one: cutovers and sweeps
//     never wait behind data. Skipped once right after a cutover, since
//     back-to-back cutovers would otherwise starve data for as long as they
//     kept coming.
//  3. One slice of background work (a sweep, a conversion pass, a snapshot
//     chunk), so requests wait at most a slice.
//  4. Data: every queued single request, then one batch part.
//  5. With background work that can go on and no data served, a yield to
//     the scheduler's global queue, where preempted callers wait; else,
//     after serving data, one yield on this processor's queue, so callers
//     about to send join the next group; else park until an input comes.
func (s *Shard) turn(stop <-chan struct{}) bool {
	mb := s.mb
	if s.state.isPrepared() {
		select {
		case <-mb.publish:
			s.publishCutover()
		case <-mb.abort:
			s.state.abort()
		case <-stop:
			s.state.abort()
			return false
		}
		s.dataFirst = true
		return true
	}
	if len(s.holds.parts) != 0 {
		s.pollHolds()
	}
	if s.holds.afterControl || (s.holds.afterSweep && !s.state.sweeping()) {
		s.replay(true) // hold parts a control message or a sweep kept waiting
	}
	if !s.dataFirst && mb.control.Load() != 0 {
		// Control senders count themselves in mb.control, so the loop
		// pays for this select only when one waits. No control message
		// waits on a hold: the holds end first (releaseHolds).
		in := s.inputs()
		select {
		case p := <-in.prepare:
			s.releaseHolds()
			s.prepare(p)
			return true
		case <-in.ready:
			s.releaseHolds()
			return true
		case w := <-in.sweep:
			s.releaseHolds()
			s.beginSweep(w)
			return true
		case m := <-in.snap:
			s.releaseHolds()
			s.beginSnapshot(m)
			return true
		default:
		}
	}
	s.dataFirst = false
	busy := false
	if t := s.background(); t != nil {
		select {
		case <-stop:
			return false
		default:
		}
		if t.step(s) {
			s.task = nil
		} else {
			busy = !s.waiting()
		}
	}
	if s.serveData() {
		return true
	}
	switch {
	case busy:
		// The global queue: yield.Local would run this processor's own
		// queue, often just the shard, and on one core the work would run
		// slice after slice while callers waited whole time slices.
		runtime.Gosched()
		return true
	case s.yieldFirst:
		s.yieldFirst = false
		yield.Local()
		return true
	}
	return s.park(s.inputs(), stop)
}

// waiting reports whether the background work in progress waits for an
// input (see inputs) before it can go on.
func (s *Shard) waiting() bool {
	t, ok := s.task.(*snapTask)
	return ok && t.waiting
}

// park waits until any input arrives, having published the counters, and
// serves it; it returns false if stop came. A sender that finds the shard
// about to park wakes it (see Mailbox.sleep).
func (s *Shard) park(in inputs, stop <-chan struct{}) bool {
	if s.holds.afterSweep && !s.state.sweeping() {
		// Hold parts that waited for a sweep now over: nothing else would
		// wake the loop for them.
		s.replay(true)
		return true
	}
	s.publishIfBehind()
	mb := s.mb
	if !mb.sleep() {
		return true
	}
	defer mb.awake()
	select {
	case p := <-in.prepare:
		s.releaseHolds()
		s.prepare(p)
	case <-in.ready:
		s.releaseHolds()
	case w := <-in.sweep:
		s.releaseHolds()
		s.beginSweep(w)
	case m := <-in.snap:
		s.releaseHolds()
		s.beginSnapshot(m)
	case <-mb.holdSig:
		s.pollHolds()
	case c := <-in.free:
		s.task.(*snapTask).copy(s, c)
	case <-in.cancel:
		s.task = nil
	case <-mb.wake:
	case b := <-mb.batch:
		s.serveBatch(b)
	case <-stop:
		return false
	}
	return true
}

// prepare takes a cutover's reading and answers it; until publish or abort,
// the loop serves nothing else.
func (s *Shard) prepare(p *msg.Prepare) {
	p.Done <- s.state.prepare(s.clk.Now(), p.Next)
}

// publishCutover switches to the prepared policy and counts it.
func (s *Shard) publishCutover() {
	s.state.publish()
	s.stats.add(msg.Cutovers, 1)
	s.stats.unsaved++ // published at the next park, or with the next messages
}

// beginSweep starts a sliced sweep; the loop runs it a slice at a time.
func (s *Shard) beginSweep(w *msg.Sweep) {
	s.state.beginSweep(w.Soonest)
	s.task = &sweepTask{w: w}
}

// beginSnapshot answers the snapshot with the shard's reading and starts
// copying; the loop copies a chunk whenever the writer has one free.
func (s *Shard) beginSnapshot(m *msg.Snapshot) {
	s.state.beginSnapshot()
	s.task = &snapTask{m: m}
	m.Begin <- s.clk.Now()
}

// background returns the background work in progress, if any: a task the
// loop began, or a conversion pass the State began at a cutover or at the
// end of a sweep.
func (s *Shard) background() task {
	if s.task == nil && s.state.converting() {
		s.task = convertTask{}
	}
	return s.task
}

// endTask ends the background work in progress, if any, as the shard stops.
func (s *Shard) endTask() {
	if s.task != nil {
		s.task.stop(s)
		s.task = nil
	}
	s.state.abandon() // a conversion pass has no one waiting
}

// drain answers ErrClosed to every queued data request.
func (s *Shard) drain() {
	defer s.publish() // the final counts, for Stats after Close
	// What Close took, and anything queued if stop came without a Close.
	for _, a := range [2]*msg.Single{s.mb.takeLeft(), s.mb.take()} {
		n := 0
		for a != nil {
			next := a.Next
			a.Next = nil
			a.Reply = msg.Reply{Err: msg.ErrClosed}
			s.stats.add(msg.ErrorCounter(msg.KindClosed), 1)
			a.Finish()
			a, n = next, n+1
		}
		s.mb.taken(n)
	}
	for {
		select {
		case b := <-s.mb.batch:
			for i := range b.Out[:len(b.Items)] {
				b.Out[i] = msg.Reply{Err: msg.ErrClosed}
			}
			s.stats.add(msg.ErrorCounter(msg.KindClosed), uint64(len(b.Items)))
			b.Closed = true
			b.Done <- b.Part
		default:
			return
		}
	}
}
