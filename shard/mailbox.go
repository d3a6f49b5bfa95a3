package shard

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/msg"
)

// closedBit marks a closed mailbox in Mailbox.senders; the bits below it
// count the data senders inside a send.
const closedBit = 1 << 62

// Mailbox is how requests reach one shard: bounded channels for data (one per
// request kind) and unbuffered channels for control, which the shard serves
// first. It is the one piece a faster transport would replace; State does not
// know it exists.
//
// Close must never strand a request in a buffer that nobody will drain, so
// data senders register in senders while they send: Close sets the closed bit,
// waits until no sender is inside, and only then lets the shard do its final
// drain. Mailbox is safe for concurrent use and must not be copied.
type Mailbox struct {
	allow   chan *msg.Allow
	batch   chan *msg.Batch
	ready   chan struct{} // taken only when the shard can prepare at once
	prepare chan *msg.Prepare
	publish chan struct{}
	abort   chan struct{}
	sweep   chan *msg.Sweep
	snap    chan *msg.Snapshot

	closing <-chan struct{} // closed by the engine when Close starts

	senders   atomic.Int64
	drained   chan struct{} // closed once closed and no sender is inside
	drainOnce sync.Once
}

// NewMailbox returns a mailbox whose data channels hold size messages each.
// closing must be closed when the engine starts closing: it releases senders
// blocked on a full mailbox.
func NewMailbox(size int, closing <-chan struct{}) *Mailbox {
	return &Mailbox{
		allow:   make(chan *msg.Allow, size),
		batch:   make(chan *msg.Batch, size),
		ready:   make(chan struct{}),
		prepare: make(chan *msg.Prepare),
		publish: make(chan struct{}),
		abort:   make(chan struct{}),
		sweep:   make(chan *msg.Sweep),
		snap:    make(chan *msg.Snapshot),
		closing: closing,
		drained: make(chan struct{}),
	}
}

// SendAllow hands a to the shard. It returns ErrClosed if the mailbox is
// closed, the context's error if ctx is done first (checked before the send,
// since a select between a ready channel and a done context picks at random),
// and nil once the shard holds a; then the shard will answer on a.Done.
func (m *Mailbox) SendAllow(ctx context.Context, a *msg.Allow) error {
	return send(ctx, m, m.allow, a)
}

// SendBatch is SendAllow for a batch part; the shard answers on b.Done.
func (m *Mailbox) SendBatch(ctx context.Context, b *msg.Batch) error {
	return send(ctx, m, m.batch, b)
}

// send puts v on one of m's data channels, registered as a sender so Close
// cannot strand it. A full channel blocks until there is room, ctx ends or
// the engine closes.
func send[T any](ctx context.Context, m *Mailbox, ch chan<- T, v T) error {
	if !m.enter() {
		return msg.ErrClosed
	}
	err := ctx.Err()
	if err == nil {
		select {
		case ch <- v:
		default: // full: wait for room, the context or Close
			select {
			case ch <- v:
			case <-ctx.Done():
				err = ctx.Err()
			case <-m.closing:
				err = msg.ErrClosed
			}
		}
	}
	m.leave()
	return err
}

// WaitReady returns once the shard could take a prepare at once: a shard
// whose policy history is full first finishes converting, serving requests
// all the while. Asking every shard before preparing any keeps the cutover
// barrier, during which prepared shards serve nothing, short. ctx and Close
// end the wait.
func (m *Mailbox) WaitReady(ctx context.Context) error {
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
	select {
	case m.snap <- s:
		return <-s.Begin, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-m.closing:
		return 0, msg.ErrClosed
	}
}

// Depth returns how many single requests and batch parts are queued.
func (m *Mailbox) Depth() int { return len(m.allow) + len(m.batch) }

// Close marks the mailbox closed and waits until no sender is inside a send.
// After it returns, nothing more can enter the data channels. It is safe to
// call more than once.
func (m *Mailbox) Close() {
	if m.senders.Or(closedBit) == 0 {
		m.drainOnce.Do(m.closeDrained)
	}
	<-m.drained
}

func (m *Mailbox) enter() bool {
	if m.senders.Add(1)&closedBit != 0 {
		m.leave()
		return false
	}
	return true
}

func (m *Mailbox) leave() {
	if m.senders.Add(-1) == closedBit {
		m.drainOnce.Do(m.closeDrained)
	}
}

func (m *Mailbox) closeDrained() { close(m.drained) }
