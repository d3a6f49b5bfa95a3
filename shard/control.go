package shard

import (
	"context"

	"github.com/tokenshard/tokenshard/msg"
)

// Control messages go on unbuffered channels, one per kind, so a send that
// completes means the shard has taken the message; each sender counts itself
// in Mailbox.control while it waits, so a busy shard looks for control only
// when there is some (see Shard.turn for their precedence).

// WaitReady returns once the shard could take a prepare at once: a shard
// whose policy history is full first finishes converting, serving requests
// all the while. Asking every shard before preparing any keeps the cutover
// barrier, during which prepared shards serve nothing, short. ctx and Close
// end the wait.
func (m *Mailbox) WaitReady(ctx context.Context) error {
	m.control.Add(1)
	defer m.control.Add(-1)
	select {
	case m.ready <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.closing:
		return msg.ErrClosed
	}
}

// Prepare sends a cutover prepare and returns the shard's answer. ctx and
// Close end the wait for the shard to take it; once taken, it is answered.
func (m *Mailbox) Prepare(ctx context.Context, p *msg.Prepare) error {
	m.control.Add(1)
	defer m.control.Add(-1)
	select {
	case m.prepare <- p:
		return <-p.Done
	case <-ctx.Done():
		return ctx.Err()
	case <-m.closing:
		return msg.ErrClosed
	}
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

// Sweep sends a sweep and returns the shard's answer, or the context's error
// or ErrClosed if the shard did not take it.
func (m *Mailbox) Sweep(ctx context.Context, w *msg.Sweep) msg.SweepReply {
	m.control.Add(1)
	defer m.control.Add(-1)
	select {
	case m.sweep <- w:
		return <-w.Done
	case <-ctx.Done():
		return msg.SweepReply{Err: ctx.Err()}
	case <-m.closing:
		return msg.SweepReply{Err: msg.ErrClosed}
	}
}

// Snapshot hands m to the shard and returns its clock reading, or the
// context's error or ErrClosed if the shard did not take it.
func (m *Mailbox) Snapshot(ctx context.Context, s *msg.Snapshot) (int64, error) {
	m.control.Add(1)
	defer m.control.Add(-1)
	select {
	case m.snap <- s:
		return <-s.Begin, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-m.closing:
		return 0, msg.ErrClosed
	}
}
