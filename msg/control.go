package msg

import "github.com/tokenshard/tokenshard/policy"

// Control messages are rare and administrative. The engine's coordinator
// sends them one at a time over unbuffered channels, one per kind, so a send
// that completes means the shard has taken the message and will act on it.
// Publish and abort carry no data: they are signals on their own channels,
// which a prepared shard handles before it takes any other message.

// Prepare asks a shard to take its cutover reading and stop serving data
// until Publish or Abort. The shard answers on Done with nil or
// ErrClockRegression (in which case it stays as it was).
type Prepare struct {
	Next policy.Policy
	Done chan error // one-slot buffer
}

// Sweep asks a shard to evict every bucket that is full at its clock reading.
type Sweep struct {
	Done chan SweepReply // one-slot buffer
}

// SweepReply counts what a sweep removed; Err is ErrClockRegression when the
// shard's clock stepped back, in which case nothing was removed.
type SweepReply struct {
	Evicted int
	Err     error
}
