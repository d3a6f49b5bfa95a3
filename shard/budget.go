package shard

import "sync/atomic"

// Budget is the engine-wide bound on tracked keys, shared by every shard. A
// creation reserves a slot before inserting and releases it if it fails; an
// eviction releases its slot only after the delete. So Count never exceeds
// the maximum, and it is exact for every call that has returned. Budget is
// safe for concurrent use and must not be copied. It is internal to
// tokenshard: only package engine uses it, beside the shards.
type Budget struct {
	_      [64]byte // keep the hot counter off the cache line of whatever precedes it
	n      atomic.Int64
	max    int64
	full   chan struct{} // one slot: a reservation failed since it was last read
	filled chan struct{} // one slot: a reservation took the last slot since it was last read
	_      [32]byte
}

// NewBudget returns an empty budget of max keys. It is internal to
// tokenshard: only package engine calls it.
func NewBudget(max int64) *Budget {
	return &Budget{max: max, full: make(chan struct{}, 1), filled: make(chan struct{}, 1)}
}

// Full returns a channel that receives when a reservation has failed since
// it last received: the signal the engine reclaims full buckets on. Failed
// reservations in between are one signal.
func (b *Budget) Full() <-chan struct{} { return b.full }

// Filled returns a channel that receives when a reservation has taken the
// last free slot since it last received: keys the engine's last sweep
// never saw now fill the table, and their buckets may be full before any
// it kept.
func (b *Budget) Filled() <-chan struct{} { return b.filled }

// signal sends on ch (full or filled) unless a signal already waits there.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // already signalled
	}
}

// reserve takes one slot and reports whether there was one. It never lets
// the count pass the maximum, even for an instant, so a concurrent Count
// never reads more than max. A failure signals Full, and taking the last
// slot Filled, without waiting.
func (b *Budget) reserve() bool {
	ok, _ := b.ReserveN(1)
	return ok
}

// ReserveN takes n (>= 1) slots at once, or none, and reports whether it
// did, and if not, how many were free at the instant it found too few; a
// failure signals Full, and taking the last slot Filled, as reserve's do.
func (b *Budget) ReserveN(n int64) (ok bool, room int64) {
	for {
		c := b.n.Load()
		if c > b.max-n {
			signal(b.full)
			return false, max(0, b.max-c)
		}
		if b.n.CompareAndSwap(c, c+n) {
			if c+n == b.max {
				signal(b.filled)
			}
			return true, 0
		}
	}
}

// Fits reports whether n (>= 1) slots are free now, without taking them,
// and how many are; when too few are, it signals Full, as a failed
// reservation does: a request refused for other reasons that would have
// needed them met the bound all the same.
func (b *Budget) Fits(n int64) (ok bool, room int64) {
	room = b.free()
	if room < n {
		signal(b.full)
	}
	return room >= n, room
}

// free returns how many slots are free now.
func (b *Budget) free() int64 { return max(0, b.max-b.n.Load()) }

// release gives one slot back.
func (b *Budget) release() { b.n.Add(-1) }

// Count returns the number of reserved slots.
func (b *Budget) Count() int64 { return b.n.Load() }
