package shard

import (
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/internal/yield"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// Shard is one goroutine's worth of state: a State, the clock it reads and
// the Mailbox it serves. Run is meant for one goroutine, which then owns it.
type Shard struct {
	state *State
	clk   clock.Clock
	mb    *Mailbox
	group []*msg.Allow  // reused buffer of one group of single requests
	sweep *msg.Sweep    // the sweep being served a slice at a time, if any
	snap  *msg.Snapshot // the snapshot being copied a chunk at a time, if any

	yieldFirst bool // data was served since the last yield: yield before parking
	bare       bool // answer single requests without deciding them (see Bare)

	id      int
	c       msg.Counters // owned by the loop; published for Stats
	pub     published
	unsaved int // groups served since the counters were published

	events   chan<- msg.Event // sampled decisions, or nil
	evEvery  uint64
	evToNext uint64
}

// published is the shard's counters as other goroutines may read them: the
// loop stores its own counts here when it is about to park, and every
// publishEvery groups while it is busy, so reading never slows the loop.
type published struct {
	allowed, denied, peeks, refunds atomic.Uint64
	errs                            [msg.NumErrKinds]atomic.Uint64
	keys, highWater                 atomic.Int64
	cutovers, sweeps, evicted       atomic.Uint64
	eventsDropped                   atomic.Uint64
}

// publishEvery bounds how stale published counters are while a shard never
// goes idle.
const publishEvery = 64

// Sample makes the shard send one decision in every n (n >= 1) to events,
// without blocking: when events is full the decision is dropped and
// counted. Call it before Run.
func (s *Shard) Sample(id int, events chan<- msg.Event, n uint64) {
	s.id, s.events, s.evEvery, s.evToNext = id, events, n, n
}

// Counters returns the counters the loop last published. It is safe to call
// from any goroutine, during and after Run.
func (s *Shard) Counters() msg.Counters {
	p := &s.pub
	c := msg.Counters{
		Allowed: p.allowed.Load(), Denied: p.denied.Load(), Peeks: p.peeks.Load(), Refunds: p.refunds.Load(),
		Keys: p.keys.Load(), HighWater: p.highWater.Load(),
		Cutovers: p.cutovers.Load(), Sweeps: p.sweeps.Load(), Evicted: p.evicted.Load(),
		EventsDropped: p.eventsDropped.Load(),
	}
	for k := range c.Errors {
		c.Errors[k] = p.errs[k].Load()
	}
	return c
}

// publish stores the loop's counters for Counters.
func (s *Shard) publish() {
	s.unsaved = 0
	p, c := &s.pub, &s.c
	c.Keys = int64(s.state.Len())
	p.allowed.Store(c.Allowed)
	p.denied.Store(c.Denied)
	p.peeks.Store(c.Peeks)
	p.refunds.Store(c.Refunds)
	for k := range c.Errors {
		p.errs[k].Store(c.Errors[k])
	}
	p.keys.Store(c.Keys)
	p.highWater.Store(c.HighWater)
	p.cutovers.Store(c.Cutovers)
	p.sweeps.Store(c.Sweeps)
	p.evicted.Store(c.Evicted)
	p.eventsDropped.Store(c.EventsDropped)
}

// served counts one group or batch part, publishing now and then.
func (s *Shard) served() {
	if s.unsaved++; s.unsaved >= publishEvery {
		s.publish()
	}
}

// count tallies one answer to a single request, and samples it.
func (s *Shard) count(now int64, a *msg.Allow) {
	r := &a.Reply
	switch {
	case r.Err != nil:
		s.c.Errors[msg.KindOf(r.Err)]++
	case a.Op == msg.OpPeek:
		s.c.Peeks++
		return
	case a.Op == msg.OpRefund:
		s.c.Refunds++
		return
	case r.Decision.Allowed:
		s.c.Allowed++
	default:
		s.c.Denied++
	}
	if s.events != nil {
		s.sample(now, a.Key, a.Cost, r)
	}
}

// sample sends one decision in every evEvery to events, never waiting.
func (s *Shard) sample(now int64, key string, cost int64, r *msg.Reply) {
	if s.evToNext--; s.evToNext > 0 {
		return
	}
	s.evToNext = s.evEvery
	select {
	case s.events <- msg.Event{Key: strings.Clone(key), Cost: cost, Decision: r.Decision, Err: r.Err, Shard: s.id, Reading: now}:
	default:
		s.c.EventsDropped++
	}
}

// Bare makes the shard answer every single request with a zero reply,
// reading no clock and touching no bucket: the transport alone, for
// benchmarks to measure what the hand-off costs. Call it before Run.
func (s *Shard) Bare() { s.bare = true }

// New returns a shard serving p on mb, reading clk, sharing budget. Keys
// arrive hashed by h.
func New(p policy.Policy, clk clock.Clock, budget *Budget, mb *Mailbox, h *Hasher) *Shard {
	return &Shard{
		state: NewState(p, budget, h),
		clk:   clk,
		mb:    mb,
		group: make([]*msg.Allow, 0, mb.size), // the most a mailbox queues
	}
}

// State returns the shard's state, for an engine restoring it before Run:
// once Run starts, only the shard's goroutine may touch it.
func (s *Shard) State() *State { return s.state }

// Run serves the mailbox until stop is closed, then answers ErrClosed to
// every request still queued and returns. The engine closes stop only after
// the mailbox is closed, so nothing can arrive after the final drain.
func (s *Shard) Run(stop <-chan struct{}) {
	s.publish() // a restored shard starts with keys
	defer s.drain()
	defer s.state.Abandon() // a background conversion pass has no one waiting
	mb := s.mb
	for {
		if s.snap != nil {
			if !s.snapStep(stop) {
				return
			}
			continue
		}
		if s.sweep != nil {
			if !s.sweepStep(stop) {
				return
			}
			continue
		}
		if s.state.Converting() {
			if !s.convertStep(stop) {
				return
			}
			continue
		}
		// Control first: a cutover or sweep never waits behind data.
		// Control senders count themselves in mb.control, so the loop pays
		// for this select only when one waits; idle's select lists the
		// same channels, so they also wake a parked loop.
		if mb.control.Load() != 0 {
			select {
			case p := <-mb.prepare:
				if !s.cutover(p, stop) {
					return
				}
				continue
			case <-mb.ready:
				continue
			case w := <-mb.sweep:
				s.beginSweep(w)
				continue
			case m := <-mb.snap:
				s.beginSnapshot(m)
				continue
			default:
			}
		}
		if !s.serveData() && !s.idle(stop) {
			return
		}
	}
}

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

// idle runs when nothing is waiting. After serving data it yields once, on
// its own processor's run queue (see package yield), so callers about to
// send join the next group or the next turn's batch parts: parking and
// waking cost several times a yield, and a sender that wakes a parked shard
// makes it the next goroutine its processor runs, where a second wake-up (a
// batch's part for another shard) sends the first to the back of the
// queue. Otherwise it parks until anything arrives or stop closes,
// publishing the counters first. It returns false if stop came.
func (s *Shard) idle(stop <-chan struct{}) bool {
	if s.yieldFirst {
		s.yieldFirst = false
		yield.Local()
		return true
	}
	if s.unsaved > 0 {
		s.publish() // about to park: let Stats see everything so far
	}
	mb := s.mb
	if !mb.sleep() {
		return true
	}
	defer mb.awake()
	select {
	case p := <-mb.prepare:
		return s.cutover(p, stop)
	case <-mb.ready:
	case w := <-mb.sweep:
		s.beginSweep(w)
	case m := <-mb.snap:
		s.beginSnapshot(m)
	case <-mb.wake:
	case b := <-mb.batch:
		s.serveBatch(b)
	case <-stop:
		return false
	}
	return true
}

// beginSweep starts a sliced sweep; the loop runs it a slice at a time.
func (s *Shard) beginSweep(w *msg.Sweep) {
	s.sweep = w
	s.state.BeginSweep(w.Soonest)
}

// sweepStep judges one slice of the sweep at a fresh reading, then serves at
// most one waiting data message, so requests wait at most one slice and a
// shard with no more than a slice of buckets sweeps before serving anything,
// as the sweep's place in the control queue says. The coordinator holds the
// sweep's reply, so no control message arrives until it is sent. It returns
// false if stop came; the sweep is then answered with what it evicted so far
// and ErrClosed.
func (s *Shard) sweepStep(stop <-chan struct{}) bool {
	if done, err := s.state.SweepSlice(s.clk.Now(), SliceSize); done {
		s.sweep.Done <- s.endSweep(err)
		s.sweep = nil
		return true
	}
	if !s.serveOneOrYield(stop) {
		s.sweep.Done <- s.endSweep(msg.ErrClosed)
		s.sweep = nil
		return false
	}
	return true
}

// serveOneOrYield serves what data is waiting (see serveData), or else
// yields, between two slices of background work; it reports false if stop
// came. Without the yield, on one core the work would run slice after slice
// until preempted, and callers would wait whole 10 ms scheduler time slices.
func (s *Shard) serveOneOrYield(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	default:
	}
	if !s.serveData() {
		// The global queue, where preempted callers wait: Local would
		// serve this processor's own queue, often just the shard.
		runtime.Gosched()
	}
	return true
}

// beginSnapshot answers the snapshot with the shard's reading and starts
// copying; the loop copies a chunk whenever the writer has one free.
func (s *Shard) beginSnapshot(m *msg.Snapshot) {
	s.snap = m
	s.state.BeginSnapshot()
	m.Begin <- s.clk.Now()
}

// snapStep fills a free chunk with the next buckets, then serves at most one
// waiting data message or else yields, like a sweep slice: on one core the
// writer and the shard would otherwise hand the core back and forth between
// them while callers wait in the run queue (measured: 90 ms). With no chunk
// free it parks until one comes back or a request arrives. A slow writer
// only delays the copy. It returns false if stop came: the snapshot is then
// abandoned, and the writer learns of it from the engine closing.
func (s *Shard) snapStep(stop <-chan struct{}) bool {
	m := s.snap
	select {
	case c := <-m.Free:
		s.copyChunk(c)
	case <-m.Cancel:
		s.snap = nil
		return true
	default:
		if s.unsaved > 0 {
			s.publish() // about to park
		}
		if !s.mb.sleep() {
			s.serveData()
			return true
		}
		defer s.mb.awake()
		select {
		case c := <-m.Free:
			s.copyChunk(c)
		case <-m.Cancel:
			s.snap = nil
		case <-s.mb.wake:
			s.serveData()
		case b := <-s.mb.batch:
			s.serveBatch(b)
		case <-stop:
			s.snap = nil
			return false
		}
		return true
	}
	if !s.serveOneOrYield(stop) {
		s.snap = nil
		return false
	}
	return true
}

// copyChunk fills c with the next buckets and hands it to the writer; the
// chunk that ends the walk ends the snapshot.
func (s *Shard) copyChunk(c *msg.SnapChunk) {
	c.Last = s.state.SnapshotSlice(c, SliceSize)
	s.snap.Out <- c // never blocks: Out has room for every chunk
	if c.Last {
		s.snap = nil
	}
}

// endSweep ends the sweep in progress and counts it.
func (s *Shard) endSweep(err error) msg.SweepReply {
	r := s.state.EndSweep(err)
	s.c.Sweeps++
	s.c.Evicted += uint64(r.Evicted)
	s.publish()
	return r
}

// convertStep serves whatever is waiting, control first, or else yields,
// then converts one slice of the background conversion pass: the pass only
// uses time nobody else wants. While the policy history is full it answers
// no readiness check (a nil channel is never ready), so the coordinator
// waits for the pass, before preparing any shard, while requests keep being
// served. A sweep or a snapshot waits for the pass too: its slices take
// whole segments, and with a long history each bucket in them would replay
// every cutover it missed, where the pass's slices are bounded by that work.
// It returns false if stop came.
func (s *Shard) convertStep(stop <-chan struct{}) bool {
	mb := s.mb
	ready, prepare := mb.ready, mb.prepare
	if s.state.HistoryFull() {
		ready, prepare = nil, nil
	}
	select {
	case <-ready:
		return true
	case p := <-prepare:
		return s.cutover(p, stop)
	default:
	}
	if !s.serveOneOrYield(stop) {
		return false
	}
	if s.state.Converting() {
		s.state.ConvertSlice(SliceSize)
	}
	return true
}

// serveWaiting serves what data is waiting (see serveData). It follows every
// cutover: control goes first, but back-to-back cutovers would otherwise
// starve data for as long as they keep coming (measured: 70 in a row held a
// request up for half a second).
func (s *Shard) serveWaiting() { s.serveData() }

func (s *Shard) serveBatch(b *msg.Batch) {
	now := s.clk.Now()
	s.state.Batch(now, b)
	for i := range b.Items {
		r := &b.Out[i]
		switch {
		case r.Err != nil:
			s.c.Errors[msg.KindOf(r.Err)]++
		case r.Decision.Allowed:
			s.c.Allowed++
		default:
			s.c.Denied++
		}
		if s.events != nil {
			s.sample(now, b.Items[i].Key, b.Items[i].Cost, r)
		}
	}
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
// overlaps the next load with the work, where walking first (to put the
// group in arrival order) paid for the whole chain before deciding
// anything. Over a large table the walk warms the cache for every request
// instead (see State.worthWarming), then decides.
//
// The group counts against the mailbox's size until it is served. Control
// waits for at most one group: no more than the mailbox's size (MailboxSize
// in the engine, about a tenth of a millisecond of decisions when it is
// full).
func (s *Shard) serveAllows() bool {
	a := s.mb.take()
	if a == nil {
		return false
	}
	s.yieldFirst = true
	if d := s.mb.queued.Load(); d > s.c.HighWater {
		s.c.HighWater = d
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
func (s *Shard) serveWalking(a *msg.Allow) int {
	now := s.clk.Now()
	n := 0
	for a != nil {
		next := a.Next
		a.Next = nil // a pooled message must not keep others alive
		n++
		switch {
		case s.bare:
			a.Finish()
			a = next
			continue
		case a.Op != msg.OpAllow:
			s.state.inspect(now, a)
		default:
			s.state.decide(now, a.Key, a.Hash, a.Cost, &a.Reply)
		}
		s.count(now, a)
		a.Finish() // after this, a belongs to its sender again
		a = next
	}
	return n
}

// serveWarmed walks the group whose newest request is a, warming the cache
// for each, then decides them in the same order, and returns its size.
func (s *Shard) serveWarmed(a *msg.Allow) int {
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
	for i, a := range g {
		if a.Op != msg.OpAllow {
			s.state.inspect(now, a)
		} else {
			s.state.decideWarmed(i, now, a.Key, a.Hash, a.Cost, &a.Reply)
		}
		s.count(now, a)
		a.Finish()
		g[i] = nil // the message goes back to its pool; do not keep it alive
	}
	s.state.unwarm()
	s.group = g[:0]
	return len(g)
}

// cutover runs one prepare and waits, serving nothing else, for publish or
// abort, then serves one waiting data message (see serveWaiting). It returns
// false if stop came first (the staged cutover is dropped).
func (s *Shard) cutover(p *msg.Prepare, stop <-chan struct{}) bool {
	err := s.state.Prepare(s.clk.Now(), p.Next)
	p.Done <- err
	if err != nil {
		return true
	}
	select {
	case <-s.mb.publish:
		s.state.Publish()
		s.c.Cutovers++
		s.unsaved++
	case <-s.mb.abort:
		s.state.Abort()
	case <-stop:
		s.state.Abort()
		return false
	}
	s.serveWaiting()
	return true
}

// drain answers ErrClosed to every queued data request.
func (s *Shard) drain() {
	defer s.publish() // the final counts, for Stats after Close
	// What Close took, and anything queued if stop came without a Close.
	for _, a := range [2]*msg.Allow{s.mb.takeLeft(), s.mb.take()} {
		n := 0
		for a != nil {
			next := a.Next
			a.Next = nil
			a.Reply = msg.Reply{Err: msg.ErrClosed}
			s.c.Errors[msg.KindClosed]++
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
			s.c.Errors[msg.KindClosed] += uint64(len(b.Items))
			b.Closed = true
			b.Done <- b.Part
		default:
			return
		}
	}
}
