package msg

import (
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/internal/yield"
	"github.com/tokenshard/tokenshard/policy"
)

// Hold makes a Batch one shard's part of an all-or-nothing decision over
// keys of several shards (engine's AllowAll). Its Items are distinct keys,
// each with the sum of its requests' costs.
//
// The shard checks the part at its reading and answers it (Batch.Answer,
// through Answers), with Now and Version set and an error, if any, in
// Out: ErrCostExceedsCapacity for the first item whose key cannot ever hold
// its cost, else ErrClockRegression. With no error it holds the part's
// keys, and Snaps holds a copy of each item's bucket: requests
// for those keys wait until the hold ends, and every other key is served
// meanwhile. Nothing else touches a held bucket, so the caller can tell
// from Snaps what deciding every item at any later instant T would answer
// (Snap.Decide), with no more round trips.
//
// Step is the hold's one shared word, moved by compare-and-swap so the
// caller and the shard never both act on a hold:
//
//   - The caller Claims a pending hold once it has every part's answer;
//     then the shard waits for its End, which the caller sends at once,
//     waiting on nothing.
//   - A control message (a cutover, a sweep, a snapshot) or stop makes the
//     shard GiveUp every hold still pending, so it never waits on a caller
//     that may be waiting on another shard. A caller whose Claim fails
//     ends the others and starts over.
//
// The caller announces each End with the shard's Mailbox.SignalHold. It is
// internal to tokenshard: only packages engine and shard use it.
type Hold struct {
	// Try: the part waits for nothing. If one of its keys is held or has
	// work waiting, the shard takes no hold and answers Busy, so a caller
	// may send every part at once: no two such calls ever wait on each
	// other. While a sweep runs, the shard answers every part Busy, Try or
	// not: the caller ends what it holds and starts over once the sweep
	// is done, and keeps no key held on another shard meanwhile.
	Try, Busy bool
	// Answers is told when the shard has answered the part, in the place
	// of the Batch's Done.
	Answers *Answers
	Now     int64 // the shard's reading when it took the hold
	Version int64 // of the policy the shard checked the part under
	// Fresh lists the items whose keys the shard does not track. The key
	// bound's room for them is the caller's to reserve, once it knows the
	// call is admitted, so that no other call ever finds the bound full for
	// keys that are not created; a Commit that admits creates them in the
	// room the caller reserved.
	Fresh []int
	Snaps []Snap // one per item, made by the caller

	// The caller's End: written before Step moves to HoldCommit or
	// HoldAbort, read by the shard after it sees that.
	T     int64 // the instant every part is decided at
	Admit bool  // take every item's cost (else take nothing)
	step  atomic.Uint32

	kept     bool        // the shard's: it holds the keys (Keep)
	released atomic.Bool // the shard is done with the part (Release)
}

// Keep is the shard's, before it answers: it holds the part's keys, and
// will Release the part once the hold ends.
func (h *Hold) Keep() { h.kept = true }

// Release is the shard's last touch of a part: from then on the caller may
// reuse its memory.
func (h *Hold) Release() { h.released.Store(true) }

// Released reports whether the shard is done with the part.
func (h *Hold) Released() bool { return h.released.Load() }

// HoldOp is where a hold stands: its Step. It is internal to tokenshard:
// only packages engine and shard use it.
type HoldOp uint32

const (
	holdPending HoldOp = iota // held; the shard may give it up
	holdClaimed               // the caller will End it: the shard waits
	HoldCommit                // the caller's End: decide at T, admitting or not
	HoldAbort                 // the caller's End: take nothing
	holdGivenUp               // the shard gave it up: nothing is held
)

// Step returns where h stands.
func (h *Hold) Step() HoldOp { return HoldOp(h.step.Load()) }

// Claim is the caller's: it reports whether h was still pending, and if
// so the shard now waits for its End.
func (h *Hold) Claim() bool {
	return h.step.CompareAndSwap(uint32(holdPending), uint32(holdClaimed))
}

// GiveUp is the shard's: it reports whether h was still pending, and if so
// the caller's Claim fails and the shard drops the hold.
func (h *Hold) GiveUp() bool {
	return h.step.CompareAndSwap(uint32(holdPending), uint32(holdGivenUp))
}

// End is the caller's last word, op HoldCommit (only on a claimed hold) or
// HoldAbort: it reports false if the shard had given h up, and nothing is
// left to end. Announce it with SignalHold.
func (h *Hold) End(op HoldOp, T int64, admit bool) bool {
	h.T, h.Admit = T, admit
	for {
		v := h.step.Load()
		if HoldOp(v) == holdGivenUp {
			return false
		}
		if h.step.CompareAndSwap(v, uint32(op)) {
			return true
		}
	}
}

// Answers counts the parts a caller waits for, so that the shards answer
// with one atomic step each and the caller wakes at most once, where a
// channel would take a lock per part on both sides. The caller calls
// Expect before sending and Wait after; each shard calls Answer once per
// part it took. It is internal to tokenshard: only packages engine and
// shard use it.
type Answers struct {
	left atomic.Int64  // parts not yet answered, plus parked once the caller parks
	wake chan struct{} // one slot: the last Answer wakes a parked caller
}

const parked = 1 << 32

// NewAnswers returns Answers expecting nothing.
func NewAnswers() *Answers { return &Answers{wake: make(chan struct{}, 1)} }

// Expect adds n (which may be negative, for parts that were never sent)
// to the parts awaited.
func (a *Answers) Expect(n int) { a.left.Add(int64(n)) }

// Answer tells the caller one part is answered (see Batch.Answer for when
// the shard may still touch the part).
func (a *Answers) Answer() {
	if a.left.Add(-1) == parked {
		a.wake <- struct{}{}
	}
}

// Wait returns once every part expected is answered, yielding up to
// yields times before it parks (see WaitYields).
func (a *Answers) Wait(yields int) {
	for range yields {
		if a.left.Load() == 0 {
			return
		}
		yield.Local()
	}
	for {
		v := a.left.Load()
		if v == 0 {
			return
		}
		if a.left.CompareAndSwap(v, v|parked) {
			<-a.wake
			a.left.Store(0)
			return
		}
	}
}

// Snap is a held bucket's levels as of its last update (Last, at or
// before the hold's reading), or for a key not tracked, the full bucket it
// would get.
type Snap struct {
	Shape  policy.Shape
	Names  []decision.Name                   // the Shape's band names (Decision.Band), made once per limit
	Levels [1 + policy.MaxBands]policy.Level // Shape.Len() of them
	Last   int64                             // the levels' instant
}

// Decide writes into d what deciding cost at T (>= Last) would answer, as
// the shard would decide it, under version: the bucket refilled on a copy.
func (s *Snap) Decide(T, cost, version int64, d *decision.Decision) {
	lv := s.Levels // a copy: Decide may be called again
	l := lv[:s.Shape.Len()]
	if T > s.Last {
		policy.RefillLevels(s.Shape, l, T-s.Last)
	}
	o, band := policy.DecideLevels(s.Shape, l, cost)
	*d = decision.Decision{
		Allowed:    o.Allowed,
		Remaining:  o.Remaining,
		RetryAfter: time.Duration(o.RetryAfter),
		Version:    version,
		Limit:      s.Shape.Band(band).Capacity,
		ResetAfter: time.Duration(o.ResetAfter),
		Band:       s.Names[band],
	}
}
