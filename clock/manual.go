package clock

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Manual is a clock that moves only when told to, for tests. It is safe for
// concurrent use. It must not be copied after first use. The zero value reads
// 0 and is ready to use.
type Manual struct {
	now atomic.Int64

	mu      sync.Mutex
	waiters []waiter // After channels not yet fired
}

type waiter struct {
	at int64
	ch chan struct{}
}

// NewManual returns a Manual clock reading start. It panics if start is
// negative, since a Clock never reports a negative time.
func NewManual(start int64) *Manual {
	if start < 0 {
		panic(fmt.Sprintf("clock: NewManual(%d): start must be >= 0", start))
	}
	m := &Manual{}
	m.now.Store(start)
	return m
}

// Now returns the current reading.
func (m *Manual) Now() int64 { return m.now.Load() }

// Set moves the clock to t. It panics if t is before the current reading:
// a test that steps a Manual clock back has a bug, and a clock that goes
// backwards on purpose is better written as a Clock of its own.
func (m *Manual) Set(t int64) {
	for {
		cur := m.now.Load()
		if t < cur {
			panic(fmt.Sprintf("clock: Manual.Set(%d) is before the current reading %d", t, cur))
		}
		if m.now.CompareAndSwap(cur, t) {
			m.fire()
			return
		}
	}
}

// Advance moves the clock forward by d, saturating at math.MaxInt64. It
// panics if d is negative, for the same reason as Set.
func (m *Manual) Advance(d time.Duration) {
	if d < 0 {
		panic(fmt.Sprintf("clock: Manual.Advance(%v): negative step", d))
	}
	for {
		cur := m.now.Load()
		next := cur + int64(d)
		if next < cur { // overflow: saturate
			next = 1<<63 - 1
		}
		if m.now.CompareAndSwap(cur, next) {
			m.fire()
			return
		}
	}
}

// Wall returns the Unix epoch plus the reading, so two Manual clocks at
// readings a and b are b-a apart on the wall too: a test restores a snapshot
// "later" by starting the new engine's clock later.
func (m *Manual) Wall() time.Time { return time.Unix(0, m.Now()) }

// After returns a channel that is closed once the reading reaches Now()+d:
// at once if d <= 0, else when Set or Advance moves the clock that far. The
// stop function forgets the wait, so a caller that gives up early leaves
// nothing behind. It makes Manual a Sleeper, so Engine.Wait runs in tests
// without real sleeps.
func (m *Manual) After(d time.Duration) (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now.Load()
	at := now + int64(d)
	switch {
	case d <= 0:
		at = now
	case at < now: // overflow: saturate, as Advance does
		at = 1<<63 - 1
	}
	return m.at(at)
}

// At returns a channel that is closed once the reading reaches t: at once
// if it has, else when Set or Advance moves the clock that far; stop as
// After's. It makes Manual an Alarm.
func (m *Manual) At(t int64) (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at(t)
}

// at is At with m.mu held.
func (m *Manual) at(t int64) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	if t <= m.now.Load() {
		close(ch)
		return ch, func() {}
	}
	m.waiters = append(m.waiters, waiter{at: t, ch: ch})
	return ch, func() { m.forget(ch) }
}

// forget drops the waiter of ch, if it has not fired.
func (m *Manual) forget(ch chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, w := range m.waiters {
		if w.ch == ch {
			last := len(m.waiters) - 1
			m.waiters[i] = m.waiters[last]
			m.waiters[last] = waiter{}
			m.waiters = m.waiters[:last]
			return
		}
	}
}

// Waiting returns how many After waits have neither fired nor been stopped.
func (m *Manual) Waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}

// fire closes the channels of every waiter the reading has reached.
func (m *Manual) fire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now.Load()
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if w.at <= now {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	clear(m.waiters[len(kept):])
	m.waiters = kept
}
