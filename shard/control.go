package shard

import (
	"context"

	"github.com/tokenshard/tokenshard/msg"
)

// Control messages are rare and administrative: a readiness check, a
// cutover's prepare, a sweep, a snapshot. Each kind is a control: its gate
// says when the loop may take it, and its serve is the one place the loop
// acts on it. They go on unbuffered channels, one per gate, so a send that
// completes means the shard has taken the message; a sender counts itself
// in Mailbox.control, by gate, while it waits, so the loop looks for
// control only when a sender waits on an input it may take (see
// Shard.turn).
//
// Publish and abort are not controls: they are the cutover barrier's own
// signals, the only inputs a prepared shard listens to.
type control interface {
	gate() gate
	serve(s *Shard) // runs on the loop, once every hold has ended
}

// gate says when the loop may take a kind of control message; a gated
// input is switched off (nil) while the shard may not take it.
type gate uint8

const (
	always   gate = iota // whenever the shard is not prepared
	roomy                // not while the policy history is full (a cutover)
	unbusied             // not while background work runs (it would replay every cutover a bucket missed)
	numGates
)

// gateBits is the width of one gate's count of senders in Mailbox.control.
// The engine sends control messages from one coordinator at a time, so a
// gate counts at most one sender; 2^16-1 leaves a direct caller of this
// package room for as many as it could sensibly start.
const gateBits = 16

// send hands c to the shard and returns nil once the shard has taken it,
// or the context's error or ErrClosed if it did not. The shard waits for a
// sender it sees counted (see Shard.turn). The shard uncounts a sender it
// takes as it takes it (Shard.take), so its next pass does not wait for a
// sender already served; a sender that gives up uncounts itself and wakes
// the shard, which may be waiting for it.
func (m *Mailbox) send(ctx context.Context, c control) error {
	m.control.Add(gateOne(c.gate()))
	var err error
	select {
	case m.ctl[c.gate()] <- c:
		return nil
	case <-ctx.Done():
		err = m.ended(ctx)
	case <-m.closing:
		err = msg.ErrClosed
	}
	m.control.Add(-gateOne(c.gate()))
	m.poke()
	return err
}

// gateOne is one sender on gate g in Mailbox.control.
func gateOne(g gate) int64 { return int64(1) << (gateBits * g) }

// poke wakes the shard if it waits, or makes its next wait return at once.
func (m *Mailbox) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// The kinds, each a message type of package msg (or none), the handler it
// calls, and its gate. To add a kind, see the package doc.

// readyCheck is taken only when the shard could take a prepare at once.
type readyCheck struct{}

func (readyCheck) gate() gate       { return roomy }
func (readyCheck) serve(s *Shard)   {}
func (c prepareCtl) gate() gate     { return roomy }
func (c prepareCtl) serve(s *Shard) { c.Done <- s.state.prepare(s.clk.Now(), c.next) }
func (c sweepCtl) gate() gate       { return unbusied }
func (c sweepCtl) serve(s *Shard)   { s.state.beginSweep(c.Soonest); s.task = &sweepTask{w: c.Sweep} }
func (c snapCtl) gate() gate        { return unbusied }

// serve answers the snapshot with the shard's reading and starts copying;
// the loop copies a chunk whenever the writer has one free.
func (c snapCtl) serve(s *Shard) {
	s.state.beginSnapshot()
	s.task = &snapTask{m: c.Snapshot}
	c.Begin <- s.clk.Now()
}

type (
	prepareCtl struct {
		*msg.Prepare
		next *limitTable
	}
	sweepCtl struct{ *msg.Sweep }
	snapCtl  struct{ *msg.Snapshot }
)

// WaitReady returns once the shard could take a prepare at once: a shard
// whose policy history is full first finishes converting, serving requests
// all the while. Asking every shard before preparing any keeps the cutover
// barrier, during which prepared shards serve nothing, short. ctx and Close
// end the wait.
func (m *Mailbox) WaitReady(ctx context.Context) error { return m.send(ctx, readyCheck{}) }

// Prepare sends a cutover prepare to next's policy and returns the shard's
// answer: nil or ErrClockRegression; until Publish or Abort the shard
// serves nothing else. ctx and Close end the wait for the shard to take it;
// once taken, it is answered.
func (m *Mailbox) Prepare(ctx context.Context, next *limitTable, p *msg.Prepare) error {
	if err := m.send(ctx, prepareCtl{p, next}); err != nil {
		return err
	}
	return <-p.Done
}

// Sweep sends a sweep and returns the shard's answer, or the context's error
// or ErrClosed if the shard did not take it. The shard runs it a slice at a
// time.
func (m *Mailbox) Sweep(ctx context.Context, w *msg.Sweep) msg.SweepReply {
	if err := m.send(ctx, sweepCtl{w}); err != nil {
		return msg.SweepReply{Err: err}
	}
	return <-w.Done
}

// Snapshot hands s to the shard and returns its clock reading, or the
// context's error or ErrClosed if the shard did not take it.
func (m *Mailbox) Snapshot(ctx context.Context, s *msg.Snapshot) (int64, error) {
	if err := m.send(ctx, snapCtl{s}); err != nil {
		return 0, err
	}
	return <-s.Begin, nil
}

// Publish tells a prepared shard to switch. It returns false only if the
// engine is closing, in which case the shard stops without switching.
func (m *Mailbox) Publish() bool { return m.signal(m.publish) }

// Abort tells a prepared shard to drop the staged cutover.
func (m *Mailbox) Abort() bool { return m.signal(m.abort) }

func (m *Mailbox) signal(ch chan struct{}) bool {
	select {
	case ch <- struct{}{}:
		return true
	case <-m.closing:
		return false
	}
}
