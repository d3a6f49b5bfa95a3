package shard

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/msg"
)

// closedBit marks a closed mailbox in Mailbox.senders; the bits below it
// count the batch senders inside a send.
const closedBit = 1 << 62

// closedQueue is the head of a closed mailbox's queue of single requests.
var closedQueue = new(msg.Single)

// Mailbox is how requests reach one shard. Single requests go on a
// lock-free take-all queue: a sender pushes with one compare-and-swap, and
// the shard takes everything queued in one atomic step, so a busy shard
// serves many requests per wake-up and a sender touches no lock. Batch parts go on
// a bounded channel, and control on unbuffered channels, which the shard
// serves first. It is the one piece a faster transport would replace; State
// does not know it exists.
//
// Close must never strand a request that nobody will drain. A single
// request is pushed with one compare-and-swap, and Close swaps the queue
// for a closed marker in one step: a push lands before it, in what Close
// hands the shard's final drain, or fails and reports ErrClosed. Batch
// senders register in senders while they send: Close sets the closed bit
// and waits until no sender is inside, and only then lets the shard do its
// final drain. Mailbox is safe for concurrent use and must not be copied.
// It is internal to tokenshard: only package engine uses it.
type Mailbox struct {
	// The queue of single requests, newest first, and how many requests
	// count against size: counted before the push, and uncounted once the
	// shard has served the group it took them with.
	head   atomic.Pointer[msg.Single] // closedQueue once closed
	queued atomic.Int64
	left   *msg.Single // what Close took from the queue, for the final drain
	// sleeping is set by the shard just before it parks; the sender (or
	// hold's caller) that clears it sends the wake-up.
	sleeping atomic.Bool
	wake     chan struct{} // one-slot buffer

	size int64 // how many single requests may wait; more block
	// Senders that find the queue full wait for room on room, which the
	// shard closes once it has served a group; roomWanted says one waits.
	roomMu     sync.Mutex
	room       chan struct{}
	roomWanted atomic.Bool

	batch chan *msg.Batch

	// control counts the senders of control messages not yet done, by
	// gate (gateBits each), so the busy shard looks for them only when one
	// waits on an input it may take (control.go).
	control atomic.Int64
	ctl     [numGates]chan control
	publish chan struct{}
	abort   chan struct{}

	closing <-chan struct{} // closed by the engine when Close starts

	senders   atomic.Int64
	drained   chan struct{} // closed once closed and no sender is inside
	drainOnce sync.Once
}

// NewMailbox returns a mailbox where size single requests, and separately
// size batch parts, may wait. closing must be closed when the engine starts
// closing: it releases senders blocked on a full mailbox. It is internal to
// tokenshard: only package engine calls it.
func NewMailbox(size int, closing <-chan struct{}) *Mailbox {
	if size < 1 {
		panic("shard: mailbox size must be at least 1")
	}
	m := &Mailbox{
		wake:    make(chan struct{}, 1),
		size:    int64(size),
		batch:   make(chan *msg.Batch, size),
		publish: make(chan struct{}),
		abort:   make(chan struct{}),
		closing: closing,
		drained: make(chan struct{}),
	}
	for g := range m.ctl {
		m.ctl[g] = make(chan control)
	}
	return m
}

// SendBatch hands a batch part to the shard, which answers on b.Done. It
// checks like SendSingle, and blocks on a full mailbox the same way.
func (m *Mailbox) SendBatch(ctx context.Context, b *msg.Batch) error {
	if !m.enter() {
		return msg.ErrClosed
	}
	var err error
	if ctx.Err() != nil {
		err = m.ended(ctx)
	} else {
		select {
		case m.batch <- b:
		default: // full: wait for room, the context or Close
			select {
			case m.batch <- b:
			case <-ctx.Done():
				err = m.ended(ctx)
			case <-m.closing:
				err = msg.ErrClosed
			}
		}
	}
	m.leave()
	return err
}

// SignalHold tells the shard that a hold's caller has ended it (msg.Hold):
// call it after each End. It never blocks, and wakes the shard only if it
// is parked: a shard that is not looks at every hold before it parks (see
// sleep and waitHolds).
func (m *Mailbox) SignalHold() { m.wakeUp() }

// wakeUp wakes the shard if it announced that it is about to park.
func (m *Mailbox) wakeUp() {
	if m.sleeping.Load() && m.sleeping.CompareAndSwap(true, false) {
		select {
		case m.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// Depth returns how many single requests and batch parts are queued, the
// group of single requests being served included.
func (m *Mailbox) Depth() int { return int(m.queued.Load()) + len(m.batch) }

// Close marks the mailbox closed and waits until no batch sender is inside
// a send. After it returns, nothing more can enter the mailbox (a single
// sender still inside SendSingle fails with ErrClosed). It is safe to call
// more than once, and concurrently: every call returns only after the one
// that took the queue has left it for the final drain.
func (m *Mailbox) Close() {
	if h := m.head.Swap(closedQueue); h != closedQueue {
		m.left = h // read by the final drain, after stop, after a Close returns
		if m.senders.Or(closedBit) == 0 {
			m.drainOnce.Do(m.closeDrained)
		}
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
