package msg

import (
	"context"
	"errors"

	"github.com/tokenshard/tokenshard/internal/decision"
)

// ErrKind indexes error counters: the errors a request can end with. It is
// internal to tokenshard: only packages engine and shard use it.
type ErrKind int

const (
	KindInvalidKey ErrKind = iota
	KindInvalidCost
	KindClosed
	KindContext // the caller's context ended before a shard took the request
	KindClockRegression
	KindKeyCapacity
	KindOther // any other error, such as ErrNilContext
	NumErrKinds
)

// KindOf returns the kind of a request's error. It is internal to tokenshard:
// only packages engine and shard use it.
func KindOf(err error) ErrKind {
	switch {
	case err == ErrInvalidKey:
		return KindInvalidKey
	case err == ErrInvalidCost, err == ErrCostExceedsCapacity:
		return KindInvalidCost
	case err == ErrClosed:
		return KindClosed
	case err == ErrClockRegression:
		return KindClockRegression
	case err == ErrKeyCapacity:
		return KindKeyCapacity
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return KindContext
	}
	return KindOther
}

// Counter indexes Counters: one count each, defined once here, so the shard
// that keeps them, the loop that publishes them and the engine that reports
// them never list them apart. It is internal to tokenshard: only packages
// engine and shard use it.
type Counter int

const (
	Allowed       Counter = iota // requests decided and admitted (an AllowAll's are counted by its caller)
	Denied                       // requests decided and refused (an AllowAll's are counted by its caller)
	Peeks                        // Peek calls answered
	Refunds                      // Refund calls answered
	Cutovers                     // cutovers published (counted by the engine's coordinator)
	Sweeps                       // sweeps finished
	Evicted                      // buckets evicted by sweeps
	EventsDropped                // sampled decisions dropped on a full buffer
	Keys                         // keys tracked (a level, not a sum)
	HighWater                    // most single requests found queued at once (a maximum)
	Holds                        // holds of AllowAll parts taken
	HoldsAborted                 // of those, given up for a control message or stop
	firstError                   // then one count per ErrKind
	NumCounters   = firstError + Counter(NumErrKinds)
)

// ErrorCounter is the counter of errors of kind k. It is internal to
// tokenshard: only package shard uses it.
func ErrorCounter(k ErrKind) Counter { return firstError + Counter(k) }

// Counters is what a shard counts, published for Stats. It is internal to
// tokenshard: only packages engine and shard use it.
type Counters [NumCounters]uint64

// Errors returns the error counts, indexed by ErrKind.
func (c *Counters) Errors() [NumErrKinds]uint64 {
	return [NumErrKinds]uint64(c[firstError:])
}

// Add adds o into c: sums, but the largest HighWater.
func (c *Counters) Add(o *Counters) {
	for i := range c {
		if Counter(i) == HighWater {
			c[i] = max(c[i], o[i])
		} else {
			c[i] += o[i]
		}
	}
}

// Event is one sampled decision, as the shard saw it. It is internal to
// tokenshard: only packages engine and shard use it.
type Event struct {
	Key      string
	Cost     int64
	Decision decision.Decision
	Err      error
	Shard    int
	Reading  int64
}
