package msg

import (
	"sync/atomic"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/internal/yield"
)

// Reply is a Decision or an error; an error always comes with the zero
// Decision. It is internal to tokenshard: only packages engine and shard use
// it.
type Reply struct {
	Decision decision.Decision
	Err      error
}

// Op is what a single request asks of its key's shard. It is internal to
// tokenshard: only packages engine and shard use it.
type Op uint8

const (
	OpAllow  Op = iota // decide Cost, spending it if allowed
	OpPeek             // report the balance: change nothing, create nothing
	OpRefund           // credit Cost tokens back, capped: create nothing
	OpCharge           // take Cost tokens without a decision, into debt down to the floor
	// OpWait decides as OpAllow, then writes the reading it decided at
	// into Hash, which the sender no longer needs: Wait sleeps until that
	// reading plus a denial's RetryAfter, however far the clock has moved
	// since.
	OpWait
)

// Single asks a shard to act on one key, as Op says: decide a request
// (Allow), report the balance (Peek) or credit tokens back (Refund). The
// sender calls Arm before handing it over and Wait to await the answer; the
// shard writes Reply and then calls Finish. It is internal to tokenshard:
// only packages engine and shard use it.
//
// Its fields fill exactly 128 bytes, the size class whose objects start on
// a 128-byte boundary, so that each message lies on two cache lines, both
// of which its sender and the shard write: a message of 144 bytes lay on
// three, and at two processors a single call took 10 to 14% longer
// (package bench's peers: one hot key, 100,000 uniform keys, 1M Zipf
// keys). TestSingleFitsTwoLines keeps it so.
type Single struct {
	Op    Op
	stage atomic.Uint32 // stagePending, stageDone or stageParked
	Key   string
	Hash  uint64 // the key's hash by the shard's Hasher, computed to route it; an OpWait's answer puts the reading it was decided at here
	Cost  int64
	Reply Reply
	Next  *Single       // link in the mailbox's queue, owned by the mailbox
	Done  chan struct{} // one-slot buffer; made once per pooled message
}

// The stages of a Single's completion. The sender and the shard each move
// it with one atomic step, so exactly one of them sees the other's: the
// shard finishing a request whose sender has parked sends on Done, and a
// sender that finds it finished never parks.
const (
	stagePending uint32 = iota
	stageDone
	stageParked
)

// WaitYields is how many times Wait should yield the processor, checking
// for the answer after each, before it parks, when procs processors run Go
// code. A yield is several times cheaper than a park and a wake-up, and the
// shard usually answers within one or two: it decides a whole queue of
// requests at a time. On one processor the shard runs between a caller's
// yields. On more it may be busy on another processor, and a caller that
// parks is woken onto the shard's; there five yields were the fastest count
// for one hot key and no slower for many keys. Waits yield on their own
// processor's run queue, not the global one (see package yield). AwaitPart,
// a batch caller's wait, uses the same counts, tuned here for Wait and no
// slower for batches. Package bench's Performance notes give the figures. It
// is internal to tokenshard: only packages engine and shard use it.
func WaitYields(procs int) int {
	if procs > 1 {
		return 5
	}
	return 2
}

// Arm readies a for one more request: call it before each hand-over.
func (a *Single) Arm() { a.stage.Store(stagePending) }

// Finish publishes Reply to the sender. The shard must not touch a after
// it: the sender may already be reusing it.
func (a *Single) Finish() {
	if a.stage.Swap(stageDone) == stageParked {
		a.Done <- struct{}{}
	}
}

// Wait returns once the shard has called Finish; Reply is then the answer.
// It yields up to yields times before it parks (see WaitYields).
func (a *Single) Wait(yields int) {
	for range yields {
		yield.Local()
		if a.stage.Load() == stageDone {
			return
		}
	}
	if a.stage.CompareAndSwap(stagePending, stageParked) {
		<-a.Done
	}
}

// Item is one request of a batch part. It is internal to tokenshard: only
// packages engine and shard use it.
type Item struct {
	Key  string
	Hash uint64 // as in Single
	Cost int64
}

// Batch asks a shard to decide Items in order at one clock reading, writing
// Out[i] for Items[i], then to Answer: send Part on Done (a hold part tells
// its Hold's Answers instead). A shard that stops before taking the part
// answers every item ErrClosed and sets Closed, so the sender knows the
// part was not decided. It is internal to tokenshard: only packages engine
// and shard use it.
type Batch struct {
	Items  []Item
	Out    []Reply
	Part   int
	Closed bool
	Done   chan int // buffered for every part of one call, so no shard blocks; nil for a hold part
	Hold   *Hold    // set: the part of an all-or-nothing decision (see Hold)
}

// Answer tells the sender that b is answered: on its Hold's Answers for a
// hold part, else on Done. The shard must not touch b after it, unless it
// holds b's keys (Hold.Keep).
func (b *Batch) Answer() {
	if h := b.Hold; h != nil && h.Answers != nil {
		a := h.Answers
		if !h.kept {
			h.Release()
		}
		a.Answer()
		return
	}
	b.Done <- b.Part
}

// AwaitPart receives the next part number on done, a batch call's Done,
// yielding up to yields times (see WaitYields) before it blocks. A caller
// that blocks at once parks, and the shard that answers must then wake it
// where it would otherwise drop the number into done's buffer; meanwhile
// the yields run the processor's other goroutines. Yielding first makes
// batches faster than blocking at once, most of all small ones (package
// bench's Performance notes give the figures). It is internal to tokenshard:
// only package engine uses it.
func AwaitPart(done <-chan int, yields int) int {
	for range yields {
		select {
		case i := <-done:
			return i
		default:
		}
		yield.Local()
	}
	return <-done
}
