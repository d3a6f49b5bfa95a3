package msg

import (
	"context"
	"errors"
)

// ErrKind indexes error counters: the errors a request can end with.
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

// KindOf returns the kind of a request's error.
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

// Counters is what a shard counts, published for Stats.
type Counters struct {
	Allowed, Denied  uint64
	Errors           [NumErrKinds]uint64
	Peeks, Refunds   uint64
	Keys             int64
	HighWater        int64 // most single requests found queued at once
	Cutovers, Sweeps uint64
	Evicted          uint64
	EventsDropped    uint64
}

// Event is one sampled decision, as the shard saw it.
type Event struct {
	Key      string
	Cost     int64
	Decision Decision
	Err      error
	Shard    int
	Reading  int64
}
