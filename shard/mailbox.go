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
type Mailbox struct {
	// The queue of single requests, newest first, and how many requests
	// count against size: counted before the push, and uncounted once the
	// shard has served the group it took them with.
	head   atomic.Pointer[msg.Single] // closedQueue once closed
	queued atomic.Int64
	left   *msg.Single // what Close took from the queue, for the final drain
	// sleeping is set by the shard just before it parks; the sender that
	// clears it sends the wake-up.
	sleeping atomic.Bool
	wake     chan struct{} // one-slot buffer

	size int64 // how many single requests may wait; more block
	// Senders that find the queue full wait for room on room, which the
	// shard closes once it has served a group; roomWanted says one waits.
	roomMu     sync.Mutex
	room       chan struct{}
	roomWanted atomic.Bool

	batch chan *msg.Batch

	// control counts the senders of control messages (readiness, prepare,
	// sweep, snapshot) not yet done, so the busy shard looks for them only
	// when there are any.
	control atomic.Int32
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

// NewMailbox returns a mailbox where size single requests, and separately
// size batch parts, may wait. closing must be closed when the engine starts
// closing: it releases senders blocked on a full mailbox.
func NewMailbox(size int, closing <-chan struct{}) *Mailbox {
	if size < 1 {
		panic("shard: mailbox size must be at least 1")
	}
	return &Mailbox{
		wake:    make(chan struct{}, 1),
		size:    int64(size),
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

// SendSingle hands a to the shard. It returns ErrClosed if the mailbox is
// closed, the context's error if ctx is done first (checked before the
// hand-over, so a done context never reaches the shard), and nil once the
// shard holds a; then the shard will answer, and a.Wait returns once it has.
// A full mailbox blocks until there is room, ctx ends or the engine closes.
func (m *Mailbox) SendSingle(ctx context.Context, a *msg.Single) error {
	if m.head.Load() == closedQueue {
		return msg.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
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
	if m.sleeping.Load() && m.sleeping.CompareAndSwap(true, false) {
		select {
		case m.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
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

// ended is the error for a wait that ctx ended: ErrClosed if the engine
// is closing too, since a select between the two picks at random and
// ErrClosed comes before the context's error.
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

// SendBatch hands a batch part to the shard, which answers on b.Done. It
// checks like SendSingle, and blocks on a full mailbox the same way.
func (m *Mailbox) SendBatch(ctx context.Context, b *msg.Batch) error {
	if !m.enter() {
		return msg.ErrClosed
	}
	err := ctx.Err()
	if err == nil {
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

// takeLeft is take for the final drain, after Close: what Close took from
// the queue. Only the shard's goroutine may call it, once stop closed.
func (m *Mailbox) takeLeft() *msg.Single {
	h := m.left
	m.left = nil
	return h
}
