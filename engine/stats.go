package engine

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/msg"
)

// Stats is a reading of the engine's counters: per shard, for errors raised
// before a request reached a shard, and in total.
//
// Each shard counts what it decides in plain fields of its own goroutine and
// publishes the count of an answer (an atomic store) before it answers, and
// its key count when the answer created a key, so Stats never waits for a
// shard, and a reading taken after a call has returned counts that call,
// the keys it created (but an AllowAll's, which its shards create just
// after it returns: KeyCount counts them at once, Keys at the shard's next
// answer or park), and every call that returned before it. So it does an
// EvictFull's Sweeps, Evicted and Keys, a ReplacePolicy's Cutovers, and
// the EventsDropped of a call whose event was dropped, once the call has
// returned. MailboxHighWater is published as it rises: at least 1 before a
// shard's first decision of a single request, and the size of a larger group
// just after the group is answered. Holds and HoldsAborted are published
// when the shard is about to park or to wait at a cutover's barrier, and
// every 64 messages while it is busy.
//
// Every call is counted exactly once: Allowed + Denied + Peeks + Refunds +
// Errors.Sum() equals the Allow, Peek, Refund and Charge calls made (a
// Charge's answer is an admission: it counts in Allowed) plus the
// requests of AllowBatch calls (Wait counts as the Allow calls it makes;
// an AllowBatch whose out is too short decides nothing and counts nothing)
// plus the requests of the AllowAll calls that returned a Decision.
//
// Every decision is counted in Allowed or Denied, an AllowAll's too: each
// request of an AllowAll that returns a Decision is one decision, counted
// by the shard of its key, all of them Allowed when the call is admitted
// and all Denied when it is refused (nothing was taken from any key, the
// keys that held their cost included). An AllowAll of 3 requests that is
// refused adds 3 to Denied, and a request that names a key already named
// counts again, as in AllowBatch. The call counts them itself, before it
// returns. An AllowAll that ends with an error counts no decision and no error there:
// its calls, and their outcomes and errors, are counted apart in
// AllowAll, one per call.
type Stats struct {
	Total  ShardStats   // the sum of Shards, with Caller's errors
	Shards []ShardStats // by shard index
	// Caller counts the errors raised on the caller's side, before a request
	// reached a shard: a bad key or cost, the engine closed, the context
	// done. They are in Total, not in any shard.
	Caller Errors
	// SweepFailures counts background sweeps (Config.SweepEvery) that ended
	// with an error, such as a clock that stepped back.
	SweepFailures uint64
	// PressureSweeps counts the background sweeps run because a new key
	// found the key table full; each shard counts them in its Sweeps too.
	PressureSweeps uint64
	// AllowAll counts AllowAll calls, one per call whatever its requests:
	// admitted, refused, or ended with an error (by kind). Admitted +
	// Refused + Errors.Sum() equals the calls that returned. The shards
	// count the holds they took in Holds and HoldsAborted.
	AllowAll AllowAllStats
}

// AllowAllStats counts AllowAll calls.
type AllowAllStats struct {
	Admitted, Refused uint64
	Errors            Errors
}

// ShardStats is one shard's counters, or their total.
type ShardStats struct {
	Allowed, Denied uint64 // requests decided, an AllowAll's included (see Stats)
	Errors          Errors // requests that ended with an error
	Peeks, Refunds  uint64
	Keys            int64 // keys tracked
	// MailboxDepth is how many single requests and batch parts wait for the
	// shard now (single requests count until the group the shard took them
	// with is served); those the shard has taken and keeps waiting for an
	// AllowAll's hold, or an AllowAll's part it keeps waiting for one (see
	// AllowAll), no longer count: Waiting counts them, until the shard
	// serves them. MailboxHighWater is the most single requests it has
	// found waiting at once. In Total, the sums and the largest.
	MailboxDepth, MailboxHighWater int64
	Waiting                        int64
	Cutovers, Sweeps               uint64 // cutovers taken part in, sweeps run
	Evicted                        uint64 // keys evicted by sweeps
	EventsDropped                  uint64 // sampled decisions dropped on a full buffer
	// Holds is how many AllowAll parts the shard held for; HoldsAborted
	// how many of those it gave up for a cutover, sweep, snapshot or Close
	// (the call then tried again).
	Holds, HoldsAborted uint64
}

// Errors counts errors by kind.
type Errors struct {
	InvalidKey, InvalidCost, Closed uint64
	Context                         uint64 // the caller's context ended first
	ClockRegression, KeyCapacity    uint64
	Other                           uint64 // any other error, such as ErrNilContext
}

// Sum returns the count of every kind.
func (e Errors) Sum() uint64 {
	return e.InvalidKey + e.InvalidCost + e.Closed + e.Context + e.ClockRegression + e.KeyCapacity + e.Other
}

func (e *Errors) add(o Errors) {
	e.InvalidKey += o.InvalidKey
	e.InvalidCost += o.InvalidCost
	e.Closed += o.Closed
	e.Context += o.Context
	e.ClockRegression += o.ClockRegression
	e.KeyCapacity += o.KeyCapacity
	e.Other += o.Other
}

// shardStats reports counters c, a mailbox depth and the work kept aside.
func shardStats(c *msg.Counters, depth, waiting int64) ShardStats {
	errs := c.Errors()
	return ShardStats{
		Allowed: c[msg.Allowed], Denied: c[msg.Denied], Errors: errorsOf(&errs),
		Peeks: c[msg.Peeks], Refunds: c[msg.Refunds], Keys: int64(c[msg.Keys]),
		MailboxDepth: depth, MailboxHighWater: int64(c[msg.HighWater]), Waiting: waiting,
		Cutovers: c[msg.Cutovers], Sweeps: c[msg.Sweeps], Evicted: c[msg.Evicted],
		EventsDropped: c[msg.EventsDropped],
		Holds:         c[msg.Holds], HoldsAborted: c[msg.HoldsAborted],
	}
}

func errorsOf(n *[msg.NumErrKinds]uint64) Errors {
	return Errors{
		InvalidKey: n[msg.KindInvalidKey], InvalidCost: n[msg.KindInvalidCost], Closed: n[msg.KindClosed],
		Context: n[msg.KindContext], ClockRegression: n[msg.KindClockRegression], KeyCapacity: n[msg.KindKeyCapacity],
		Other: n[msg.KindOther],
	}
}

// allDecided counts a shard's decisions made by AllowAll calls. A call
// counts its own as it ends, before it returns, so that its caller's Stats
// see them; padded, so that calls on other shards seldom share its line.
type allDecided struct {
	allowed, denied atomic.Uint64
	_               [48]byte
}

func (a *allDecided) add(admit bool, n int) {
	if admit {
		a.allowed.Add(uint64(n))
	} else {
		a.denied.Add(uint64(n))
	}
}

// callerErrors counts errors raised before a request reaches a shard, in
// stripes so concurrent callers seldom share a cache line.
type callerErrors [16]struct {
	n [msg.NumErrKinds]atomic.Uint64
	_ [64]byte
}

func (c *callerErrors) add(err error, n int) {
	s := &c[rand.Uint32()%uint32(len(c))]
	s.n[msg.KindOf(err)].Add(uint64(n))
}

func (c *callerErrors) read() Errors {
	var n [msg.NumErrKinds]uint64
	for i := range c {
		for k := range n {
			n[k] += c[i].n[k].Load()
		}
	}
	return errorsOf(&n)
}

// Stats returns the engine's counters. It never blocks and keeps answering
// after Close, with the final counts. A zero Engine's are the zero Stats.
// Package engine/expvarstats publishes them through expvar, and package
// engine/promstats to Prometheus.
func (e *Engine) Stats() Stats {
	if e.uninitialized() {
		return Stats{}
	}
	st := Stats{Shards: make([]ShardStats, len(e.shards)), Caller: e.callerErrs.read(),
		SweepFailures: e.sweepFailures.Load(), PressureSweeps: e.pressureSweeps.Load(),
		AllowAll: AllowAllStats{Admitted: e.allAdmitted.Load(), Refused: e.allRefused.Load(), Errors: e.allErrs.read()}}
	var total msg.Counters
	depth, waiting := int64(0), int64(0)
	for i, s := range e.shards {
		c := s.Counters()
		c[msg.Allowed] += e.allDecided[i].allowed.Load()
		c[msg.Denied] += e.allDecided[i].denied.Load()
		c[msg.Cutovers] = e.cutovers[i].Load()
		d, w := int64(e.mailboxes[i].Depth()), int64(s.Waiting())
		st.Shards[i] = shardStats(&c, d, w)
		total.Add(&c)
		depth += d
		waiting += w
	}
	st.Total = shardStats(&total, depth, waiting)
	st.Total.Errors.add(st.Caller)
	return st
}
