package shard

import (
	"math"
	"sync/atomic"
)

// Alarm rings when a shard's clock reading reaches a set time: a timer that
// costs nothing while it waits. A runtime timer makes the scheduler read the
// clock at every goroutine switch, which a single Allow (a switch or two)
// pays for; shards read their clock anyway, and compare it with the alarm's
// time at each group of requests and each batch part. So it rings only when
// requests come, which is when there is something to do. Alarm is safe for
// concurrent use and must not be copied. It is internal to tokenshard: only
// package engine uses it, for its periodic sweeps.
type Alarm struct {
	_  [64]byte // read by every shard: keep it off the lines others write
	at atomic.Int64
	c  chan struct{} // one slot
	_  [48]byte
}

// NewAlarm returns an alarm set for no time: it never rings until Set. It is
// internal to tokenshard: only package engine calls it.
func NewAlarm() *Alarm {
	a := &Alarm{c: make(chan struct{}, 1)}
	a.at.Store(math.MaxInt64)
	return a
}

// Set makes the alarm ring at the first reading at or after t; math.MaxInt64
// switches it off.
func (a *Alarm) Set(t int64) { a.at.Store(t) }

// C receives when the alarm has rung since it last received: rings before a
// Set are one ring.
func (a *Alarm) C() <-chan struct{} { return a.c }

// check rings the alarm if now has reached its time, without waiting.
func (a *Alarm) check(now int64) {
	if now >= a.at.Load() {
		select {
		case a.c <- struct{}{}:
		default: // already rung
		}
	}
}

// Alarm makes the shard check a at every clock reading it decides requests
// at. Call it before Run.
func (s *Shard) Alarm(a *Alarm) { s.alarm = a }
