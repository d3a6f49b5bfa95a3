package shard

import (
	"fmt"
	"time"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// Policy history bounds. Buckets convert lazily when touched; once more than
// convertAfter generations are kept, or at once under a policy with patterns
// (see publish), the shard also converts the untouched ones in a background
// pass, sliced like a sweep and invisible in every answer, so a service that
// cuts over often but never sweeps keeps a short history. If cutovers
// outpace those passes and maxGenerations are kept, the shard's loop takes
// no prepare until a pass has finished (the coordinator waits for it before
// preparing any shard: see engine's ReplacePolicy), serving requests all the
// while; prepare itself converts everything at once only for a caller that
// drives State directly.
const (
	convertAfter   = 8
	maxGenerations = 64
)

// generation is one policy a shard has served, from its cutover reading on.
type generation struct {
	pol    policy.Policy
	limits []limitInfo // pol.Shapes(): a bucket's Limit indexes it
	start  int64
	stored bool // some limit keeps its keys' levels in the level store
	// replay is the work of bringing a bucket over the cutover into this
	// generation, in convertSlice's units: the cutover, and each pattern
	// its key may be tried against to resolve it again.
	replay int
}

// limitTable is a policy's table of limits as a shard serves it. Building
// it takes time and memory in proportion to the policy's distinct limits
// (up to policy.MaxLimits), so an engine builds it once per policy, before
// any shard stops for the cutover, and every shard shares it: nothing
// changes it once built.
type limitTable struct{ g generation }

// NewLimits builds p's table of limits, for New and Mailbox.Prepare. It is
// internal to tokenshard: only package engine calls it.
func NewLimits(p policy.Policy) *limitTable {
	g := generation{pol: p, limits: limitInfos(p), replay: 1 + p.Overrides.Patterns()}
	for _, in := range g.limits {
		g.stored = g.stored || in.n != 0
	}
	return &limitTable{g}
}

// newGeneration returns the generation of l's policy from start on.
func newGeneration(l *limitTable, start int64) generation {
	g := l.g
	g.start = start
	return g
}

// State is the pure state machine of one shard: a bucket table and the
// policy that governs it. Handlers take the clock reading now and return the reply.
// State is not safe for concurrent use: exactly one goroutine owns it. It is
// internal to tokenshard: package engine uses it only to restore a shard
// from a snapshot before it runs (Restore, Each, Drop); everything else is
// the loop's, and tests call it directly.
//
// A cutover publishes in O(1): it appends a generation, and each bucket is
// converted the first time it is touched (or swept) by replaying the cutovers
// it missed with policy.Bucket.Cutover, which gives exactly what an eager
// conversion at each cutover reading would have given.
type State struct {
	hasher *Hasher
	tab    table
	levels levelStore // the balances of keys a Bucket alone cannot hold
	budget *Budget

	// gens[i] is generation base+i; the last one is in force. A bucket's
	// Epoch names the generation its balance is expressed in.
	gens  []generation
	base  uint16 // modulo 1<<16, like Epoch: no bucket is 1<<16 cutovers behind
	epoch uint16
	stale int // buckets whose Epoch != epoch; at 0 the history is dropped

	last int64 // latest clock reading a successful operation observed

	prepared bool
	staged   generation

	pass       *sweepPass // the sweep or conversion pass in progress, if any
	snapCursor uint64     // the snapshot walk's place, in mixed-hash order

	held map[string]struct{} // the keys of the holds in progress (state_hold.go)
}

// newState returns an empty shard state serving l's policy, sharing budget
// with the other shards, that hashes keys with h (the engine's routing
// hash).
func newState(l *limitTable, budget *Budget, h *Hasher) *State {
	return &State{
		hasher: h,
		tab:    newTable(h),
		budget: budget,
		gens:   []generation{newGeneration(l, 0)},
	}
}

// keyCount returns the number of keys the shard tracks.
func (s *State) keyCount() int { return s.tab.count }

// policyInForce returns the policy in force.
func (s *State) policyInForce() policy.Policy { return s.gens[len(s.gens)-1].pol }

// decide decides a request for cost tokens of key, hashed h by the state's
// Hasher (as the engine does to route it), at now, into r. The key and cost
// are already known to be well formed; then, in order: a cost above the
// key's capacity is ErrCostExceedsCapacity, a reading older than the last
// one observed ErrClockRegression, and an unknown key at the key bound
// ErrKeyCapacity. An error changes nothing.
//
// It writes r field by field: a reply returned by value is stored to the
// stack in words and copied out in wider loads, which wait for those stores
// to retire instead of taking their values.
func (s *State) decide(now int64, key string, h uint64, cost int64, r *msg.Reply) {
	s.decideFound(now, key, h, cost, r, s.tab.find(h, key), false)
}

// decideWarmed is decide for the ith key of the last warm (see warmStart).
func (s *State) decideWarmed(i int, now int64, key string, h uint64, cost int64, r *msg.Reply) {
	s.decideFound(now, key, h, cost, r, s.tab.findWarmed(i, h, key), false)
}

// decideFound is decide for a key whose bucket the table returned as b
// (nil for a key it does not track). reserved says a new key's slot in the
// budget is already taken (a hold's commit).
func (s *State) decideFound(now int64, key string, h uint64, cost int64, r *msg.Reply, b *policy.Bucket, reserved bool) {
	// The key's own limit: its bucket's, or what the policy resolves a new
	// key to. The cost bound is that limit's capacity.
	if b != nil && b.Epoch != s.epoch { // bringUp's own test, saving the call
		s.bringUp(b, key) // may drop the history: read the generation after
	}
	g := &s.gens[len(s.gens)-1]
	var idx policy.LimitIndex
	if b != nil {
		idx = b.Limit
	} else {
		idx = g.pol.Overrides.Resolve(key)
	}
	in := &g.limits[idx]
	if cost > in.maxCost {
		*r = msg.Reply{Err: msg.ErrCostExceedsCapacity}
		return
	}
	if now < s.last {
		*r = msg.Reply{Err: msg.ErrClockRegression}
		return
	}
	if b == nil {
		if !reserved && !s.budget.reserve() {
			*r = msg.Reply{Err: msg.ErrKeyCapacity}
			return
		}
		// The table copies the key, so a key sliced from a request buffer
		// does not pin it. A key created ahead of a sweep's cursor survives
		// that sweep.
		b = s.tab.insert(h, key, s.sweeping() && h*mix >= s.pass.cursor)
		if in.n == 0 {
			*b = policy.NewBucket(in.lim, now)
		} else {
			s.newExt(b, in, now)
		}
		b.Epoch, b.Limit = s.epoch, idx
	}
	s.last = now
	d := &r.Decision
	d.Version = g.pol.Version
	r.Err = nil
	if in.n != 0 {
		s.decideExt(b, in, now, cost, d)
		return
	}
	o := b.Decide(in.lim, now, cost)
	d.Allowed = o.Allowed
	d.Remaining = o.Remaining
	d.RetryAfter = time.Duration(o.RetryAfter)
	d.Limit = in.lim.Capacity
	d.ResetAfter = time.Duration(o.ResetAfter)
	d.Band = in.names[0]
}

// peek answers a request of one token for key, hashed h, at now, into r,
// changing nothing: it refills a copy of the bucket. An unknown key reports
// a full bucket of the limit it would resolve to, and is not created.
// Allowed and RetryAfter say whether one token would pass, and when.
func (s *State) peek(now int64, key string, h uint64, r *msg.Reply) {
	if now < s.last {
		*r = msg.Reply{Err: msg.ErrClockRegression}
		return
	}
	g := &s.gens[len(s.gens)-1]
	b := s.tab.find(h, key)
	var buf [maxLevels]policy.Level
	if b == nil {
		in := &g.limits[g.pol.Overrides.Resolve(key)]
		lv := buf[:in.shape.Len()]
		for i := range lv {
			lv[i] = policy.FullLevel(in.shape.Band(i))
		}
		s.reportLevels(lv, in, r)
		return
	}
	s.bringUp(b, key)
	g = &s.gens[len(s.gens)-1] // bringUp may have dropped the history
	in := &g.limits[b.Limit]
	lv := s.load(b, in, &buf)
	if now > b.Last {
		policy.RefillLevels(in.shape, lv, now-b.Last)
	}
	s.reportLevels(lv, in, r)
}

// refund credits tokens back to key, hashed h, at now, capped at its
// capacity in every band, and answers as peek does with the balance after
// it. It never creates a bucket: refunding an unknown key changes nothing.
func (s *State) refund(now int64, key string, h uint64, tokens int64, r *msg.Reply) {
	b := s.tab.find(h, key)
	if b == nil || now < s.last {
		s.peek(now, key, h, r) // the answer for an unknown key, or the error
		return
	}
	s.bringUp(b, key)
	in := &s.gens[len(s.gens)-1].limits[b.Limit]
	s.last = now
	if in.n == 0 {
		b.Refill(in.lim, now)
		b.Credit(in.lim, tokens)
		lv := [1]policy.Level{policy.LevelOf(*b)}
		s.reportLevels(lv[:], in, r)
		return
	}
	lv := s.levels.levels(b.Frac, in.n)
	if now > b.Last {
		policy.RefillLevels(in.shape, lv, now-b.Last)
		b.Last = now
	}
	for i := range lv {
		lv[i].Credit(in.shape.Band(i), tokens)
	}
	s.reportLevels(lv, in, r)
}

// batch decides b.Items in order at one reading, into b.Out. The answers are
// those of the same Allow calls made one by one at now.
func (s *State) batch(now int64, b *msg.Batch) {
	if !s.worthWarming(len(b.Items)) {
		for i, it := range b.Items {
			s.decideFound(now, it.Key, it.Hash, it.Cost, &b.Out[i], s.tab.find(it.Hash, it.Key), false) // decide
		}
		return
	}
	s.tab.warm(b.Items)
	s.warmLevels()
	for i, it := range b.Items {
		// decideWarmed, written out: one call less per request.
		s.decideFound(now, it.Key, it.Hash, it.Cost, &b.Out[i], s.tab.findWarmed(i, it.Hash, it.Key), false)
	}
	s.tab.unwarm()
}

// warmFrom is the table size from which deciding a group of requests starts
// by warming the cache (see worthWarming): a smaller table stays in the
// caches on its own, and warming it would be pure overhead.
const warmFrom = 1 << 14

// worthWarming reports whether deciding n requests together should start
// by warming the cache for all of them. Over many keys a lookup is mostly
// waiting for memory: prefetching every request's control word, then its
// slot (and then its key, if the slot does not hold it) before deciding any
// (table.warm) puts the misses of a whole group in flight at once, where
// lookups one by one would wait for each in turn. It takes more than one
// request, a table too large for the caches, and a build that can prefetch.
func (s *State) worthWarming(n int) bool {
	return canPrefetch && n > 1 && s.tab.count >= warmFrom
}

// warmStart, warmKey and warmFinish warm the cache for a group of requests
// named one by one (see worthWarming); decide the ith with decideWarmed(i,
// ...), in order, then call unwarm.
func (s *State) warmStart()                   { s.tab.warmStart() }
func (s *State) warmKey(key string, h uint64) { s.tab.warmKey(key, h) }
func (s *State) warmFinish()                  { s.tab.warmFinish(); s.warmLevels() }

// unwarm ends a warm.
func (s *State) unwarm() { s.tab.unwarm() }

// prepare takes now as the cutover reading for next's policy and stops the
// shard from serving data until publish or abort. next is built already, so
// the shard's pause does not grow with the policy's limits. A reading older
// than the last one observed is ErrClockRegression, and then nothing
// changes.
func (s *State) prepare(now int64, next *limitTable) error {
	if now < s.last {
		return msg.ErrClockRegression
	}
	if s.historyFull() {
		s.convertAll() // the loop never gets here: it converts in slices first
	}
	s.prepared = true
	s.staged = newGeneration(next, now)
	return nil
}

// publish switches to the staged policy in O(1): buckets convert lazily. It
// does nothing if no cutover is staged. Under a policy with patterns it
// also starts a conversion pass at once: bringing a bucket over the
// cutover then tries its key against every pattern, which a pass sliced by
// work bounds, where a sweep or a snapshot, sliced by segments, would do it
// for thousands of keys in one slice (and they wait for the pass).
func (s *State) publish() {
	if !s.prepared {
		return
	}
	s.prepared = false
	s.gens = append(s.gens, s.staged)
	s.epoch++
	s.last = s.staged.start
	s.stale = s.tab.count
	if len(s.gens) > convertAfter || s.staged.replay > 1 {
		s.beginConvert()
	}
	s.compact()
}

// isPrepared reports whether a cutover is staged: until publish or abort, the
// shard serves nothing else.
func (s *State) isPrepared() bool { return s.prepared }

// historyFull reports whether the shard keeps as many policy generations as
// it may: the next cutover waits until a conversion pass has finished.
func (s *State) historyFull() bool { return len(s.gens) >= maxGenerations }

// abort drops the staged cutover; nothing else changes.
func (s *State) abort() {
	s.prepared = false
	s.staged = generation{}
}

// bringUp converts key's bucket b to the generation in force by replaying
// every cutover it missed: refill under the key's old limit up to the
// cutover reading, resolve the key again under the new policy, then clamp to
// its new capacity. It does not refill past the last cutover.
func (s *State) bringUp(b *policy.Bucket, key string) {
	if b.Epoch == s.epoch {
		return
	}
	for i := int(b.Epoch - s.base); i < len(s.gens)-1; i++ {
		old, next := &s.gens[i], &s.gens[i+1]
		idx := next.pol.Overrides.Resolve(key)
		s.cutover(b, &old.limits[b.Limit], &next.limits[idx], next.start)
		b.Limit = idx
	}
	b.Epoch = s.epoch
	s.stale--
	s.compact()
}

// convertAll converts every bucket now, for when the history grew too long.
func (s *State) convertAll() {
	s.tab.each(func(k string, b *policy.Bucket) { s.bringUp(b, k) })
}

// compact forgets every generation but the one in force once no bucket needs
// them.
func (s *State) compact() {
	if s.stale != 0 || len(s.gens) == 1 {
		return
	}
	s.gens[0] = s.gens[len(s.gens)-1]
	clear(s.gens[1:])
	s.gens = s.gens[:1]
	s.base = s.epoch
}

// Restore adds key with the levels lv of limit old (one per band of old,
// band 0 the primary), last brought up to date at last <= now, for a state
// being rebuilt from a snapshot before it serves. The key is resolved under
// the policy in force and its bands carried through the cutover rule:
// refilled under old up to now, then each band carried over by name
// (policy.CutoverLevels). lv is changed. The key takes a slot in the budget
// even past its bound: the caller decides what to drop before serving. A
// key already present is an error.
func (s *State) Restore(now int64, key string, h uint64, last int64, old policy.Shape, lv []policy.Level) error {
	if s.tab.find(h, key) != nil {
		return fmt.Errorf("duplicate key %q", key)
	}
	g := &s.gens[len(s.gens)-1]
	idx := g.pol.Overrides.Resolve(key)
	in := &g.limits[idx]
	if now > last {
		policy.RefillLevels(old, lv, now-last)
	}
	var dst [maxLevels]policy.Level
	out := dst[:in.shape.Len()]
	policy.CutoverLevels(old, lv, in.shape, out)
	b := s.tab.insert(h, key, false)
	*b = policy.Bucket{Last: max(last, now), Epoch: s.epoch, Limit: idx}
	if in.n == 0 {
		b.Tokens, b.Frac = out[0].Tokens, uint32(out[0].Frac)
	} else {
		b.Frac = s.levels.alloc(in.n)
		copy(s.levels.levels(b.Frac, in.n), out)
	}
	s.budget.n.Add(1)
	s.last = max(s.last, now)
	return nil
}

// Each calls f with every key, the reading its bucket was last brought up
// to date at, its limit and its levels (one per band of the limit), in no
// particular order. The key and levels are only valid during the call.
// Buckets already converted to the policy in force are what f sees; f must
// not change the state.
func (s *State) Each(f func(key string, last int64, sh policy.Shape, lv []policy.Level)) {
	var buf [maxLevels]policy.Level
	s.tab.each(func(k string, b *policy.Bucket) {
		s.bringUp(b, k)
		in := &s.gens[len(s.gens)-1].limits[b.Limit]
		f(k, b.Last, in.shape, s.load(b, in, &buf))
	})
}

// Drop deletes key, hashed h, and releases its slot; it reports whether the
// key was tracked.
func (s *State) Drop(key string, h uint64) bool {
	hm := h * mix
	_, seg := s.tab.segmentOf(hm)
	i := seg.find(hm, key)
	if i < 0 {
		return false
	}
	b := &seg.at(i).b
	stale := b.Epoch != s.epoch
	s.forgetLevels(b, s.infoOf(b))
	s.tab.remove(seg, i)
	s.budget.release()
	if stale {
		s.stale-- // one bucket fewer behind the policy in force
		s.compact()
	}
	return true
}
