package engine

import (
	"context"
	"errors"
	"math"
	"slices"

	"github.com/tokenshard/tokenshard/msg"
)

// MaxAllowAll is the most requests one AllowAll may carry.
const MaxAllowAll = 64

// ErrAllowAllSize: AllowAll was given no requests, or more than
// MaxAllowAll.
var ErrAllowAllSize = errors.New("engine: AllowAll takes 1 to MaxAllowAll requests")

// AllowAll decides reqs as one: it admits them only if every request's key
// holds its cost, and then takes every cost; otherwise it takes nothing from
// any key. Requests for one key add up: their costs are summed, and a sum
// above the key's capacity is ErrCostExceedsCapacity. It is linearizable:
// the call takes effect for all its keys at one instant, and no other call
// sees part of it or is denied for tokens it did not keep.
//
// The Decision is that of the binding request, whose index in reqs the int
// gives: when denied, the request whose key waits longest (RetryAfter is
// then the time until every key holds its cost); when admitted, the request
// whose key has the fewest whole tokens left; ties go to the first such
// request. A key's answer is the one Allow would give for its summed cost
// at that instant, Band and all.
//
// Errors, with the zero Decision, the index of the request at fault (-1
// for none; 0 for ErrClockRegression, the clock's fault; for
// ErrKeyCapacity the first new key, in request order, past the room the
// bound has) and nothing changed: ErrNotInitialized; ErrAllowAllSize for no
// requests or more than MaxAllowAll; then, over all requests, ErrInvalidKey
// for the first bad key, ErrInvalidCost for the first cost below 1;
// ErrClosed; ErrNilContext or the context's error; then from the keys'
// shards, over all requests, ErrCostExceedsCapacity, ErrClockRegression,
// ErrKeyCapacity (room for every new key is needed at once).
//
// Under saturation AllowAll is starved by single Allows (and AllowBatch)
// on its keys. It needs every key's cost at one instant, while a single
// Allow takes each token as soon as it refills; so once the keys are
// drained, their tokens never build up, and an AllowAll that needs more of
// a key than the single Allows take at a time almost never finds its keys
// covered. In an adversarial run of 48 goroutines on four keys, half
// calling Allow of cost 1 on one key and half AllowAll of cost 2 on each
// of the four, about 0.02% of the AllowAlls were admitted (from under
// 0.01% to about 0.7% from run to run on a 2-core VM, more as each call
// slows beside the refill; BenchmarkAllowAllBesideAllows measures it)
// while the single Allows took the tokens as they refilled. At equal costs
// an AllowAll fares better or worse by timing alone. Nothing queues a refused AllowAll
// or holds tokens back for it. Where its share matters, send every request
// that takes from those keys through AllowAll, each with all the keys it
// is limited by, so that they compete on equal terms: a request that takes
// less of a key, or from fewer of them (an Allow, or an AllowAll of fewer
// keys), still takes each token as it refills, ahead of the calls that
// need more.
//
// How: the call's keys are held on every shard at once, each shard holding
// its keys only if none is held by another call (or waited on) and no sweep
// runs there. If one shard finds its keys busy, the call ends what it holds
// and holds them again one shard at a time, in the order of their numbers,
// waiting on each; so concurrent calls cannot deadlock, whichever keys they
// share, and a call that gives way always completes. A held key's requests
// wait until the call ends; every other key, on every shard, is served
// meanwhile, and so are other AllowAlls over other keys. Each shard answers
// with a copy of its held buckets, which nothing else touches while they are
// held, so the call decides every key at the latest of the shards' readings
// without asking them again, and then admits or refuses them all. A cutover,
// sweep, snapshot or Close that reaches a shard before the call has claimed
// its hold there (which it does once it has every answer) makes it give the
// hold up, so they never wait on a hold; after that, they wait only for the
// call's own next step, which waits on nothing. A shard being swept holds
// nothing, and the call ends what it holds too, so no key waits for a sweep.
// Either way the call then starts over at once, which a snapshot that has
// begun copying or a cutover that is done no longer interrupts; if that
// try is interrupted too, it starts over once more, holding the
// coordinator those need, so nothing but Close can interrupt it again, and
// waits for the coordinator as they do, until the cutover, sweep or
// snapshot in progress has returned (a Snapshot's writer included).
// AllowAll does not allocate once warm, except for a call that has to
// start over.
func (e *Engine) AllowAll(ctx context.Context, reqs []Request) (Decision, int, error) {
	if e.uninitialized() {
		return Decision{}, -1, ErrNotInitialized
	}
	d, i, err := e.allowAllCall(ctx, reqs)
	switch {
	case err != nil:
		e.allErrs.add(err, 1)
	case d.Allowed:
		e.allAdmitted.Add(1)
	default:
		e.allRefused.Add(1)
	}
	return d, i, err
}

func (e *Engine) allowAllCall(ctx context.Context, reqs []Request) (Decision, int, error) {
	if len(reqs) == 0 || len(reqs) > MaxAllowAll {
		return Decision{}, -1, ErrAllowAllSize
	}
	for i, r := range reqs {
		if err := e.checkKey(r.Key); err != nil {
			return Decision{}, i, err
		}
	}
	for i, r := range reqs {
		if r.Cost < 1 {
			return Decision{}, i, ErrInvalidCost
		}
	}
	switch {
	case e.closed.Load():
		return Decision{}, -1, ErrClosed
	case ctx == nil:
		return Decision{}, -1, e.nilContext()
	}
	if err := e.ctxErr(ctx); err != nil {
		return Decision{}, -1, err
	}
	c := e.newAllCall(reqs)
	defer e.free(c)
	// A cutover, sweep or snapshot that made a shard give its hold up, or
	// a sweep running, sends the call round again: once more as it is,
	// since a snapshot that has begun copies beside holds and a cutover
	// done takes none, so the call waits for no snapshot's writer; then
	// holding the coordinator, which every one of them needs: then only
	// Close can interrupt.
	for try := 0; ; try++ {
		held := try > 1
		if held {
			if err := e.acquire(ctx); err != nil {
				return Decision{}, -1, err
			}
		}
		d, i, again, err := e.allowAll(ctx, c, reqs)
		if held {
			e.release()
		}
		if !again {
			return d, i, err
		}
	}
}

// allCall is one AllowAll's parts: per shard its distinct keys with summed
// costs, in shard order, and for every request its part and item. It is
// pooled: every part an attempt sends is answered before the attempt
// returns, and what a shard may still read once the caller has moved on
// (the parts as sent) is reused only once it is done with it.
type allCall struct {
	parts []allPart
	at    [][2]int // at[i]: the part and the item of reqs[i]
	// The parts' items, first and over, in windows of these. A part as
	// sent carries a copy of its items (see sentParts).
	items   []msg.Item
	first   []int
	over    []bool
	answers *msg.Answers
	// Sets of parts as sent: an attempt takes the first one the shards
	// have released, and replaces the last if none is. A shard releases a
	// hold's part once it has carried out its end, before it answers the
	// next part sent to it; one that the next calls send nothing to does
	// so when it next runs, and a caller sending to other shards may get
	// a few calls ahead of it (more often with -tags purego, whose yield
	// is runtime.Gosched). Each set is made when first needed.
	sent [4]sentParts
}

// sentParts are the parts an attempt sends, with their answers' room.
// The memory is the shards' until they Release every part (see
// allPart.m): an attempt that finds it still in use makes new.
type sentParts struct {
	parts []sentPart
	items []msg.Item
	outs  []msg.Reply
	snaps []msg.Snap
}

type sentPart struct {
	b msg.Batch
	h msg.Hold
}

// released reports whether the shards are done with every part of s.
func (s *sentParts) released() bool {
	for i := range s.parts {
		if !s.parts[i].h.Released() {
			return false
		}
	}
	return true
}

// take returns room for parts parts of items items in all.
func (s *sentParts) take(parts, items int) ([]sentPart, []msg.Item, []msg.Reply, []msg.Snap) {
	if cap(s.parts) < parts || cap(s.outs) < items || !s.released() {
		// As large as any call before, so calls of varied shapes reuse it.
		n, m := max(items, cap(s.outs), 4), max(parts, cap(s.parts), 4)
		s.parts = make([]sentPart, parts, m)
		s.items = make([]msg.Item, items, n)
		s.outs = make([]msg.Reply, items, n)
		s.snaps = make([]msg.Snap, items, n)
	}
	s.parts = s.parts[:parts]
	return s.parts, s.items[:items], s.outs[:items], s.snaps[:items]
}

type allPart struct {
	shard int
	items []msg.Item
	first []int  // first[j]: the first request of item j
	over  []bool // over[j]: item j's costs add up past math.MaxInt64, above any capacity
	reqs  int    // the requests whose keys are the part's: its decisions (see Stats)
	// m is the part as sent in the attempt in progress: never one a shard
	// may still be reading, as it may after the caller has moved on
	// (nobody waits for a hold's end); held: it holds.
	m    *msg.Batch
	held bool
}

func (e *Engine) newAllCall(reqs []Request) *allCall {
	c, _ := e.allCalls.Get().(*allCall)
	if c == nil {
		c = &allCall{answers: msg.NewAnswers()}
	}
	n := len(reqs)
	var hashes [MaxAllowAll]uint64
	var partOf [MaxAllowAll]int // the shard of each request, then its part
	// The global order of holds: by shard.
	var order [MaxAllowAll]int
	shards := order[:0]
	for i, r := range reqs {
		partOf[i], hashes[i] = e.shardOf(r.Key)
		if k, found := slices.BinarySearch(shards, partOf[i]); !found {
			shards = slices.Insert(shards, k, partOf[i])
		}
	}
	// Each part's items get a window as long as its requests.
	var count [MaxAllowAll]int
	for i := range n {
		partOf[i], _ = slices.BinarySearch(shards, partOf[i])
		count[partOf[i]]++
	}
	c.parts = slices.Grow(c.parts[:0], len(shards))[:len(shards)]
	c.items = slices.Grow(c.items[:0], n)[:n]
	items := c.items
	c.first, c.over = slices.Grow(c.first[:0], n)[:n], slices.Grow(c.over[:0], n)[:n]
	c.at = slices.Grow(c.at[:0], n)[:n]
	off := 0
	for k := range c.parts {
		w := count[k]
		c.parts[k] = allPart{shard: shards[k], items: items[off : off : off+w], first: c.first[off : off : off+w], over: c.over[off : off : off+w]}
		off += w
	}
	for i, r := range reqs {
		k := partOf[i]
		p := &c.parts[k]
		j := slices.IndexFunc(p.items, func(it msg.Item) bool { return it.Key == r.Key })
		if j < 0 {
			j = len(p.items)
			p.items = append(p.items, msg.Item{Key: r.Key, Hash: hashes[i]})
			p.first = append(p.first, i)
			p.over = append(p.over, false)
		}
		p.reqs++
		it := &p.items[j]
		if it.Cost > math.MaxInt64-r.Cost {
			p.over[j] = true
		}
		it.Cost = satAdd(it.Cost, r.Cost)
		c.at[i] = [2]int{k, j}
	}
	return c
}

// free returns c to the pool, keeping no key or part alive but those of
// the parts as sent, which the shards may still hold.
func (e *Engine) free(c *allCall) {
	clear(c.parts[:cap(c.parts)])
	clear(c.items[:cap(c.items)])
	e.allCalls.Put(c)
}

// holdErrRank orders the errors a shard answers a hold with, as the
// error rules order them.
func holdErrRank(err error) int {
	switch err {
	case ErrCostExceedsCapacity:
		return 0
	case ErrClockRegression:
		return 1
	}
	return 2 // ErrKeyCapacity
}

// allowAll is one attempt. again reports that a shard gave its hold up or
// was being swept, or that the shards checked the call under different
// policy versions, and nothing was decided. It first sends every part at
// once, each waiting for nothing; if a shard answers that one of its keys is
// busy, it ends what it holds and holds the parts one at a time, in shard
// order.
func (e *Engine) allowAll(ctx context.Context, c *allCall, reqs []Request) (d Decision, at int, again bool, err error) {
	if len(c.parts) > 1 {
		if d, at, again, busy, err := e.hold(ctx, c, reqs, true); !busy {
			return d, at, again, err
		}
	}
	// Held in order, a part is Busy only on a shard being swept: start
	// over once the sweep, which holds the coordinator, is done.
	d, at, again, busy, err := e.hold(ctx, c, reqs, false)
	return d, at, again || busy, err
}

// hold is one attempt, its parts sent at once with try (busy: a shard
// found a key busy, and nothing was decided), else one at a time.
func (e *Engine) hold(ctx context.Context, c *allCall, reqs []Request, try bool) (d Decision, at int, again, busy bool, err error) {
	for k := range c.parts {
		c.parts[k].held = false
	}
	// end ends every hold still held. None is waited for: a held shard
	// acts on it before it serves the held keys again.
	end := func(op msg.HoldOp, T int64, admit bool) {
		for k := range c.parts {
			if p := &c.parts[k]; p.held && p.m.Hold.End(op, T, admit) {
				e.mailboxes[p.shard].SignalHold()
			}
		}
	}
	// Phase 1: hold every part. With try, all are sent at once and none
	// waits on a key, so no two calls wait on each other; else each shard
	// in turn, in shard order, so that no two calls ever wait on each
	// other's holds in a cycle. A shard that refuses its part holds
	// nothing; the others are held on, so the error the rules put first is
	// the one returned.
	var T int64
	errAt, errRank := -1, 3
	closed := false
	answer := func(k int) {
		p := &c.parts[k]
		switch {
		case p.m.Closed:
			closed = true
			return
		case p.m.Hold.Busy:
			busy = true
			return
		}
		for j, over := range p.over {
			if over {
				if r := 0; r < errRank || (r == errRank && p.first[j] < errAt) {
					errAt, errRank, err = p.first[j], r, ErrCostExceedsCapacity
				}
				break // items are in the order of their first requests
			}
		}
		if j := slices.IndexFunc(p.m.Out, func(r msg.Reply) bool { return r.Err != nil }); j >= 0 {
			i := p.first[j]
			if p.m.Out[j].Err == ErrClockRegression {
				i = 0 // the clock's fault, not a request's: the first
			}
			if r := holdErrRank(p.m.Out[j].Err); r < errRank || (r == errRank && i < errAt) {
				errAt, errRank, err = i, r, p.m.Out[j].Err
			}
			return
		}
		p.held = true
		T = max(T, p.m.Hold.Now)
	}
	set := 0
	for set < len(c.sent)-1 && !c.sent[set].released() {
		set++
	}
	ms, items, outs, snaps := c.sent[set].take(len(c.parts), len(c.at))
	sent := 0
	var sendErr error
	for k := range c.parts {
		p, m, w := &c.parts[k], &ms[k], len(c.parts[k].items)
		m.h = msg.Hold{Try: try, Answers: c.answers, Snaps: snaps[:w:w], Fresh: m.h.Fresh[:0]}
		m.b = msg.Batch{Items: items[:copy(items, p.items):w], Out: outs[:w:w], Part: k, Hold: &m.h}
		p.m, items, outs, snaps = &m.b, items[w:], outs[w:], snaps[w:]
		c.answers.Expect(1)
		if sendErr = e.mailboxes[p.shard].SendBatch(ctx, p.m); sendErr != nil {
			c.answers.Expect(-1)
			break
		}
		sent++
		if !try {
			c.answers.Wait(e.waitYields) // a shard always answers a part it took
			if answer(k); closed || busy {
				break
			}
		}
	}
	for k := sent; k < len(ms); k++ {
		ms[k].h.Release() // never sent: no shard will, and the set would stay taken
	}
	if try {
		c.answers.Wait(e.waitYields)
		for k := range sent {
			answer(k)
		}
	}
	switch {
	case sendErr != nil:
		end(msg.HoldAbort, 0, false)
		return Decision{}, -1, false, false, sendErr
	case closed:
		end(msg.HoldAbort, 0, false)
		return Decision{}, -1, false, false, ErrClosed
	case busy:
		end(msg.HoldAbort, 0, false)
		return Decision{}, -1, false, true, nil
	case errAt >= 0:
		end(msg.HoldAbort, 0, false)
		if !c.sameVersion() {
			// The shards judged the call under different versions: no one
			// instant saw this error. Try again.
			return Decision{}, -1, true, false, nil
		}
		return Decision{}, errAt, false, false, err
	}
	// Phase 2: claim every hold. A shard that gave its hold up (for a
	// control message or Close) holds nothing: then nothing is taken
	// anywhere and the call starts over.
	for k := range c.parts {
		if p := &c.parts[k]; !p.m.Hold.Claim() {
			p.held, again = false, true
		}
	}
	if again || !c.sameVersion() {
		end(msg.HoldAbort, 0, false)
		return Decision{}, -1, true, false, nil
	}
	// Phase 3: all or nothing. From the claims to the end, nothing here may
	// wait on anything (a context, another shard, a blocking reservation):
	// a shard ending its holds for a control message or Close waits for
	// this step (see shard's releaseHolds). Every key is held, so T, the
	// latest of the holds' readings, is the call's instant: every item is
	// decided at T from the copy of its bucket its shard sent, which
	// nothing has touched since. The key bound's room for the call's new
	// keys is taken now, and only if it is admitted, so no other call ever
	// meets a bound filled by keys that are never created.
	admit := true
	for k := range c.parts {
		p := &c.parts[k]
		for j := range p.items {
			p.m.Hold.Snaps[j].Decide(T, p.items[j].Cost, p.m.Hold.Version, &p.m.Out[j].Decision)
			admit = admit && p.m.Out[j].Decision.Allowed
		}
	}
	if n := c.fresh(); n > 0 {
		var ok bool
		var room int64
		if admit {
			ok, room = e.budget.ReserveN(int64(n))
		} else {
			ok, room = e.budget.Fits(int64(n)) // refused either way: a pressure sweep if it lacked room
		}
		if !ok {
			end(msg.HoldAbort, 0, false)
			at := c.pastBound(int(room))
			return Decision{}, at, false, false, ErrKeyCapacity
		}
	}
	end(msg.HoldCommit, T, admit)
	for k := range c.parts { // counted before the call returns, for its caller's Stats
		p := &c.parts[k]
		e.allDecided[p.shard].add(admit, p.reqs)
	}
	at = 0
	best := &c.parts[c.at[0][0]].m.Out[c.at[0][1]].Decision
	for i := 1; i < len(reqs); i++ {
		r := &c.parts[c.at[i][0]].m.Out[c.at[i][1]].Decision
		if (admit && r.Remaining < best.Remaining) || (!admit && r.RetryAfter > best.RetryAfter) {
			at, best = i, r
		}
	}
	d.set(best)
	d.Allowed = admit
	return d, at, false, false, nil
}

// sameVersion reports whether every part was checked under one policy
// version.
func (c *allCall) sameVersion() bool {
	for k := range c.parts {
		if c.parts[k].m.Hold.Version != c.parts[0].m.Hold.Version {
			return false
		}
	}
	return true
}

// fresh returns how many of the call's keys are new.
func (c *allCall) fresh() int {
	n := 0
	for k := range c.parts {
		n += len(c.parts[k].m.Hold.Fresh)
	}
	return n
}

// pastBound returns the request of the first new key the key bound has no
// room for, given room free slots: new keys take room in the order of their
// first requests.
func (c *allCall) pastBound(room int) int {
	var buf [MaxAllowAll]int // on the stack: a refusal allocates nothing
	firsts := buf[:0]
	for k := range c.parts {
		p := &c.parts[k]
		for _, j := range p.m.Hold.Fresh {
			firsts = append(firsts, p.first[j])
		}
	}
	slices.Sort(firsts)
	return firsts[min(room, len(firsts)-1)]
}
