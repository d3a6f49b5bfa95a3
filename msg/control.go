package msg

import "errors"

// Control messages are rare and administrative. The engine's coordinator
// sends them one at a time over unbuffered channels, one per kind, so a send
// that completes means the shard has taken the message and will act on it.
// Publish and abort carry no data: they are signals on their own channels,
// which a prepared shard handles before it takes any other message.

// Prepare asks a shard to take its cutover reading and stop serving data
// until Publish or Abort; the next policy goes with it, as the limit table
// every shard shares (package shard). The shard answers on Done with nil or
// ErrClockRegression (in which case it stays as it was). It is internal to
// tokenshard: only packages engine and shard use it.
type Prepare struct {
	Done chan error // one-slot buffer
}

// Sweep asks a shard to evict every bucket that is full at its clock reading.
// With Soonest set the shard also finds when the first bucket it keeps will
// be full: a sweep run because the key table is full needs it to say when a
// slot can next be free, and other sweeps skip its cost. Stop, if not nil,
// is closed when the caller no longer wants the rest of the pass (its
// context ended): the shard then starts no further slice and answers
// ErrSweepStopped. It is internal to tokenshard: only packages engine and
// shard use it.
type Sweep struct {
	Done    chan SweepReply // one-slot buffer
	Soonest bool
	Stop    <-chan struct{}
}

// ErrSweepStopped answers a sweep whose Stop was closed before its pass was
// over; the caller reports its context's error instead. It is internal to
// tokenshard: only packages engine and shard use it.
var ErrSweepStopped = errors.New("shard: sweep stopped by its caller")

// SweepReply counts what a sweep removed. Err is ErrClockRegression when the
// shard's clock stepped back, ErrClosed when the shard stopped, and
// ErrSweepStopped when the caller did, each part-way: what earlier slices
// removed stays removed and is counted. Soonest is the clock reading at
// which the first bucket the sweep kept is full again (math.MaxInt64 if it
// kept none; 0 if it was not asked). It is internal to tokenshard: only
// packages engine and shard use it.
type SweepReply struct {
	Evicted int
	Soonest int64
	Err     error
}
