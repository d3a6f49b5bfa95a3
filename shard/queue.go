package shard

import (
	"context"

	"github.com/tokenshard/tokenshard/msg"
)

// The take-all queue of single requests, and its two protocols against
// lost wake-ups: a sender waiting for room (waitRoom against taken), and a
// shard about to park (sleep against SendSingle). Each pair is a
// store-then-load on both sides, through atomics, so at least one side
// sees the other. TestMailboxManySendersTinyQueue keeps senders waiting for
// room, and TestMailboxPingPong sends as the shard goes to park: a lost
// wake-up in either leaves a request unanswered and fails the test.

// SendSingle hands a to the shard. It returns ErrClosed if the mailbox is
// closed, the context's error if ctx is done first (checked before the
// hand-over, so a done context never reaches the shard), and nil once the
// shard holds a; then the shard will answer, and a.Wait returns once it has.
// A full mailbox blocks until there is room, ctx ends or the engine closes.
func (m *Mailbox) SendSingle(ctx context.Context, a *msg.Single) error {
	if m.head.Load() == closedQueue {
		return msg.ErrClosed
	}
	if ctx.Err() != nil {
		return m.ended(ctx)
	}
	if m.queued.Add(1) > m.size {
		if err := m.waitRoom(ctx); err != nil {
			return err
		}
	}
	a.Arm()
	for {
		old := m.head.Load()
		if old == closedQueue {
			m.queued.Add(-1)
			return msg.ErrClosed
		}
		a.Next = old
		if m.head.CompareAndSwap(old, a) {
			break
		}
	}
	m.wakeUp()
	return nil
}

// waitRoom is SendSingle's slow path, entered having counted itself in a
// full queue: it uncounts itself and waits until it can count itself in
// with room to spare, ctx ends or the engine closes.
func (m *Mailbox) waitRoom(ctx context.Context) error {
	for {
		m.queued.Add(-1)
		m.roomMu.Lock()
		if m.room == nil {
			m.room = make(chan struct{})
		}
		room := m.room
		m.roomWanted.Store(true)
		m.roomMu.Unlock()
		// The shard uncounts a group, then checks roomWanted; we set it,
		// then check the count: one of us sees the other, so no wake-up is
		// lost.
		if m.queued.Load() >= m.size {
			select {
			case <-room:
			case <-ctx.Done():
				return m.ended(ctx)
			case <-m.closing:
				return msg.ErrClosed
			}
		}
		if m.queued.Add(1) <= m.size {
			return nil
		}
	}
}

// ended is the error for a send that found ctx ended: ErrClosed if the
// engine is closing too, as ErrClosed comes before the context's error
// (where a send waits on both, a select would pick either).
func (m *Mailbox) ended(ctx context.Context) error {
	select {
	case <-m.closing:
		return msg.ErrClosed
	default:
		return ctx.Err()
	}
}

// take removes every queued single request and returns the newest, whose
// Next links lead to the older ones; the caller must call taken with how
// many it served. Only the shard's goroutine may call it.
func (m *Mailbox) take() *msg.Single {
	for {
		h := m.head.Load()
		if h == nil || h == closedQueue {
			return nil
		}
		if m.head.CompareAndSwap(h, nil) {
			return h
		}
	}
}

// taken uncounts n requests that take returned and wakes senders waiting
// for room.
func (m *Mailbox) taken(n int) {
	m.queued.Add(-int64(n))
	if m.roomWanted.Load() {
		m.roomMu.Lock()
		if m.room != nil {
			close(m.room)
			m.room = nil
		}
		m.roomWanted.Store(false)
		m.roomMu.Unlock()
	}
}

// sleep announces that the shard is about to park. It reports false, and
// does not announce it, if single requests are already queued: a sender
// pushes then checks sleeping, the shard sets sleeping then checks the
// queue, so one of them sees the other. After parking, call awake.
func (m *Mailbox) sleep() bool {
	m.sleeping.Store(true)
	if h := m.head.Load(); h != nil && h != closedQueue {
		m.sleeping.Store(false)
		return false
	}
	return true
}

// awake ends what sleep announced; a wake-up sent meanwhile stays in the
// channel and at worst makes one later park return early.
func (m *Mailbox) awake() { m.sleeping.Store(false) }

// takeLeft is take for the final drain, after Close: what Close took from
// the queue. Only the shard's goroutine may call it, once stop closed.
func (m *Mailbox) takeLeft() *msg.Single {
	h := m.left
	m.left = nil
	return h
}
