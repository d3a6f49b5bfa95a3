package msg

import "time"

// Decision is a shard's answer to one admission, field for field the same as
// engine.Decision so the engine converts it without copying field by field.
type Decision struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	Version    int64
	Limit      int64
	ResetAfter time.Duration
}

// Reply is a Decision or an error; an error always comes with the zero
// Decision.
type Reply struct {
	Decision Decision
	Err      error
}

// Op is what a single request asks of its key's shard.
type Op uint8

const (
	OpAllow  Op = iota // decide Cost, spending it if allowed
	OpPeek             // report the balance: change nothing, create nothing
	OpRefund           // credit Cost tokens back, capped: create nothing
)

// Allow asks a shard to act on one key: decide a request, by default (see
// Op). The shard writes Reply and then sends on Done.
type Allow struct {
	Op    Op
	Key   string
	Hash  uint64 // the key's hash by the shard's Hasher, computed to route it
	Cost  int64
	Reply Reply
	Done  chan struct{} // one-slot buffer; made once per pooled message
}

// Item is one request of a batch part.
type Item struct {
	Key  string
	Hash uint64 // as in Allow
	Cost int64
}

// Batch asks a shard to decide Items in order at one clock reading, writing
// Out[i] for Items[i], then to send Part on Done. A shard that stops before
// taking the part answers every item ErrClosed and sets Closed, so the sender
// knows the part was not decided.
type Batch struct {
	Items  []Item
	Out    []Reply
	Part   int
	Closed bool
	Done   chan int // buffered for every part of one call, so no shard blocks
}
