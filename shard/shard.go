package shard

import (
	"runtime"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/internal/yield"
	"github.com/tokenshard/tokenshard/msg"
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

// New returns a shard serving l's policy on mb, reading clk, sharing
// budget (and l) with the other shards. Keys arrive hashed by h. It is
// internal to tokenshard: only package engine calls it.
func New(l *limitTable, clk clock.Clock, budget *Budget, mb *Mailbox, h *Hasher) *Shard {
	return &Shard{
		state: newState(l, budget, h),
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
	for s.turn() {
	}
	// Requests kept aside for held keys were taken: they are answered, once
	// the holds end.
	s.stopping = true
	s.releaseHolds()
}

// turn is one pass of the loop; it reports false once stop has come. The
// precedence between kinds of work is written here and nowhere else, and
// listen's one select serves every input the pass waits on; inputs
// switches off, with nil channels, what the shard may not take yet:
//
//  1. A prepared shard listens to publish, abort and stop alone: the
//     cutover's barrier.
//  2. Control, when a sender waits on an input the shard may take: the pass
//     waits for that message (a sender that gives up wakes it) and serves
//     nothing else first, so control never waits behind data; every hold
//     ends before it is served. Skipped once right after a cutover, since
//     back-to-back cutovers would otherwise starve data for as long as they
//     kept coming.
//  3. One slice of background work (task.go), so requests wait at most a
//     slice.
//  4. Data: the holds' part of it first, when there are holds (hold.go):
//     the ends their callers sent, and hold parts kept aside (answered
//     Busy while a sweep runs); then every queued single request, then
//     the batch parts queued, up to partsPerTurn, each after the ends
//     sent before it (endSent).
//  5. With background work that can go on and no data served, a yield to
//     the scheduler's global queue, where preempted callers wait; else,
//     after serving data, one yield on this processor's queue, so callers
//     about to send join the next group; else park until any input comes.
func (s *Shard) turn() bool {
	if s.state.isPrepared() {
		s.publishIfBehind() // it may wait there a while: what the prepare gave up shows
		return s.listen(s.inputs(barrier))
	}
	if !s.dataFirst && s.controlWaits() {
		return s.listen(s.inputs(controlOnly))
	}
	s.dataFirst = false
	busy := false
	if t := s.background(); t != nil {
		if s.stopped() {
			return false
		}
		if t.step(s) {
			s.task = nil
		} else {
			busy = !s.waiting()
		}
	}
	if len(s.holds.parts) != 0 || s.holds.aside || s.holds.ended {
		s.tendHolds()
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
	s.publishIfBehind()
	if !s.mb.sleep() { // a sender that finds the shard about to park wakes it
		return true
	}
	defer s.mb.awake()
	if s.holdEnded() { // so does a hold's caller ending it (SignalHold)
		return true
	}
	return s.listen(s.inputs(parked))
}

// A pass listens in one of three modes (see turn).
type mode uint8

const (
	barrier     mode = iota // prepared: publish, abort, stop
	controlOnly             // the control inputs on, a sender's giving up, stop
	parked                  // every input on
)

// inputs are the channels a pass listens on. An input that is switched off
// is nil, and a nil channel is never ready.
type inputs struct {
	ctl            [numGates]<-chan control
	publish, abort <-chan struct{}
	wake           <-chan struct{}
	batch          <-chan *msg.Batch
	// A snapshot that has no chunk to fill waits for the writer to hand
	// one back, or to give up.
	free   <-chan *msg.SnapChunk
	cancel <-chan struct{}
	stop   <-chan struct{}
}

// inputs switches the inputs of mode m on, each control gate only if the
// shard may take its messages now (see may).
func (s *Shard) inputs(m mode) inputs {
	mb := s.mb
	in := inputs{stop: s.stop}
	if m == barrier {
		in.publish, in.abort = mb.publish, mb.abort
		return in
	}
	for g := range numGates {
		if s.may(g) {
			in.ctl[g] = mb.ctl[g]
		}
	}
	in.wake = mb.wake
	if m == controlOnly {
		return in
	}
	in.batch = mb.batch
	if t, ok := s.task.(*snapTask); ok && t.waiting {
		in.free, in.cancel = t.m.Free, t.m.Cancel
	}
	return in
}

// may reports whether the shard may take control messages of gate g now:
// a shard whose policy history is full takes no cutover (and answers no
// readiness check) until its conversion pass is done, and a shard with
// background work in progress takes no sweep or snapshot, whose slices
// would otherwise replay every cutover a bucket missed.
func (s *Shard) may(g gate) bool {
	switch g {
	case roomy:
		return !s.state.historyFull()
	case unbusied:
		return s.background() == nil
	}
	return true
}

// controlWaits reports whether a control sender waits on an input the
// shard may take: one atomic load while none waits.
func (s *Shard) controlWaits() bool {
	c := s.mb.control.Load()
	if c == 0 {
		return false
	}
	for g := range numGates {
		if c>>(gateBits*g)&(1<<gateBits-1) != 0 && s.may(g) {
			return true
		}
	}
	return false
}

// listen waits for one of in's inputs and serves it; it reports false if
// stop came. It is the loop's one select.
func (s *Shard) listen(in inputs) bool {
	select {
	case c := <-in.ctl[always]:
		s.take(c)
	case c := <-in.ctl[roomy]:
		s.take(c)
	case c := <-in.ctl[unbusied]:
		s.take(c)
	case <-in.publish:
		s.publishCutover()
	case <-in.abort:
		s.state.abort()
		s.dataFirst = true
	case c := <-in.free:
		s.task.(*snapTask).copy(s, c)
	case <-in.cancel:
		s.task = nil
	case b := <-in.batch:
		s.serveBatch(b)
	case <-in.wake:
	case <-in.stop:
		if s.state.isPrepared() {
			s.state.abort()
		}
		return false
	}
	return true
}

// take serves a control message: it uncounts its sender (see
// Mailbox.send), and every hold ends first (releaseHolds), so no control
// message waits on a hold.
func (s *Shard) take(c control) {
	s.mb.control.Add(-gateOne(c.gate()))
	s.releaseHolds()
	c.serve(s)
}

// stopped reports whether stop has come, without waiting: background work
// checks it before each slice.
func (s *Shard) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// waiting reports whether the background work in progress waits for an
// input (see inputs) before it can go on.
func (s *Shard) waiting() bool {
	t, ok := s.task.(*snapTask)
	return ok && t.waiting
}

// publishCutover switches to the prepared policy; the next pass serves
// data before control. The engine's coordinator counts the cutover, as it
// sends publish: counted here, after the send, a Stats taken as
// ReplacePolicy returns would miss it.
func (s *Shard) publishCutover() {
	s.state.publish()
	s.dataFirst = true
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
			s.stats.bump(msg.ErrorCounter(msg.KindClosed), 1)
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
			if b.Hold == nil { // an AllowAll's part: its caller counts the call (engine's Stats)
				s.stats.bump(msg.ErrorCounter(msg.KindClosed), uint64(len(b.Items)))
			}
			b.Closed = true
			b.Answer()
		default:
			return
		}
	}
}
