package redisstore

import (
	"context"
	"errors"
	"math"
	"slices"

	"github.com/tokenshard/tokenshard/engine"
)

// modeAll is the decide script's all-or-nothing mode.
const modeAll = "A"

// aboveInt64 is the cost sent for a key whose summed cost passed
// math.MaxInt64: above every capacity, so the script answers "c".
const aboveInt64 = "9223372036854775808"

// AllowAll decides reqs as one, with the meaning of engine.Engine.AllowAll:
// admitted only if every request's key holds its cost, and then every cost
// is taken; otherwise nothing is taken from any key. Requests for one key
// add up, exactly: a sum above the key's capacity (or past math.MaxInt64)
// is engine.ErrCostExceedsCapacity. The Decision is the binding request's
// and the int its index: when denied, the request whose key waits longest;
// when admitted, the one whose key has the fewest whole tokens left; ties
// go to the first.
//
// One script call decides every key, each with its summed cost, at one
// Redis TIME, and writes the buckets only if every key holds its cost: the
// call is atomic, as a Lua script is, for every store on the prefix. A
// refusal writes nothing, so a bucket keeps what it had, its expiry
// included. The work of a call is bounded by engine.MaxAllowAll, one
// script call of up to that many buckets (ChunkSize bounds a batch's).
//
// Under saturation an AllowAll is starved by single Allows and AllowBatches
// on its keys, as on the engine: the script admits it only if every key
// holds its cost at the call's one TIME, while they take each token as
// soon as it refills, so an AllowAll that needs more of a key than they
// take at a time almost never finds its keys covered. In an adversarial
// run of 48 goroutines, half calling Allow of cost 1 and half AllowAll of
// cost 2 on the same keys, about 0.02% of the AllowAlls were admitted
// (from under 0.01% to about 0.1% from run to run on one server;
// BenchmarkAllowAllBesideAllows measures it), while the single Allows took
// the tokens as they refilled.
// Nothing queues a refused call or holds tokens back for
// it. Where its share matters, send every request that takes from those
// keys through AllowAll, each with all the keys it is limited by, so that
// they compete on equal terms (see engine.Engine.AllowAll).
//
// Errors, with the zero Decision and the index of the request at fault (-1
// for none): engine.ErrAllowAllSize for no requests or more than
// engine.MaxAllowAll; then over all requests engine.ErrInvalidKey for the
// first bad key, engine.ErrInvalidCost for the first cost below 1;
// engine.ErrClosed; engine.ErrNilContext or the context's error when it is
// done before the call starts; on Redis Cluster, ErrCrossShard at the
// first request whose key is not in reqs[0]'s virtual shard (keys that
// share a hash tag share a shard, unless Config.IgnoreKeyTags); then
// engine.ErrCostExceedsCapacity at the first request of the first key (by
// its first request) that can never hold its summed cost; then
// engine.ErrKeyCapacity at index 0 when Redis refuses the writes of an
// admission for lack of memory (Redis refuses them all, existing keys'
// too, so nothing is taken and no request is more at fault than the
// first). A refusal writes nothing, so Redis out of memory still answers
// it, where the engine's key bound would be ErrKeyCapacity for a call with
// new keys. There is no ErrClockRegression: see the package doc on time.
//
// When Redis cannot answer by the deadline, the call is answered by the
// store's failure rule, as a whole and with a nil error: fail closed,
// denied with RetryAfter Config.FailRetryAfter; fail open, admitted with
// Remaining 0; marked engine.Decision.Degraded. So is a call before the
// store has first reached Redis (see New), which on Redis Cluster cannot
// yet tell ErrCrossShard: the key map is Redis's. Either way the Decision
// is that of reqs[0] (every key answers alike, so the first binds) under
// the policy the store last saw, and the index is 0; a summed cost above a
// key's capacity under that policy is still engine.ErrCostExceedsCapacity. A fail-open admission
// takes nothing, and a lost reply may have taken every cost or none, never
// some: the script runs whole or not at all. A context canceled during the
// call returns its error, and the call, likewise, took every cost or none.
func (s *Store) AllowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	if s.uninitialized() {
		return engine.Decision{}, -1, engine.ErrNotInitialized
	}
	d, at, err := s.allowAll(ctx, reqs)
	switch {
	case err != nil:
		s.allErrs[kindOf(err)].Add(1)
	case d.Allowed:
		s.allAdmitted.Add(1)
	default:
		s.allRefused.Add(1)
	}
	switch n := uint64(len(reqs)); {
	case err != nil, d.Degraded: // no decision, or counted by failResult
	case d.Allowed:
		s.allowed.Add(n)
	default:
		s.denied.Add(n)
	}
	return d, at, err
}

// allowAll is AllowAll without its counting.
func (s *Store) allowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	if len(reqs) == 0 || len(reqs) > engine.MaxAllowAll {
		return engine.Decision{}, -1, engine.ErrAllowAllSize
	}
	if i := slices.IndexFunc(reqs, func(r engine.Request) bool { return s.badKey(r.Key) }); i >= 0 {
		return engine.Decision{}, i, engine.ErrInvalidKey
	}
	if i := slices.IndexFunc(reqs, func(r engine.Request) bool { return r.Cost < 1 }); i >= 0 {
		return engine.Decision{}, i, engine.ErrInvalidCost
	}
	if err := s.usable(ctx); err != nil {
		return engine.Decision{}, -1, err
	}
	// One item per key, in the order of the keys' first requests, its costs
	// summed; of[i] is reqs[i]'s item (so item j's first request is the
	// first i with of[i] == j).
	items, of := make([]item, 0, len(reqs)), make([]int, len(reqs))
	res := make([]engine.Result, len(reqs))
	for i, r := range reqs {
		j := slices.IndexFunc(items, func(it item) bool { return it.key == r.Key })
		if j < 0 {
			j = len(items)
			items = append(items, item{key: r.Key, out: &res[j]})
		}
		it := &items[j]
		if it.cost > math.MaxInt64-r.Cost {
			it.over = true
		} else {
			it.cost += r.Cost
		}
		of[i] = j
	}
	ready, err := s.upExec(ctx, modeAll, items)
	if errors.Is(err, ErrCrossShard) { // exec's, before it sends: one script call is one slot on a cluster
		sh := s.shard(reqs[0].Key)
		return engine.Decision{}, max(slices.IndexFunc(reqs, func(r engine.Request) bool { return s.shard(r.Key) != sh }), 0), ErrCrossShard
	}
	if !ready || err != nil { // up's error, or exec's
		if errors.Is(ctx.Err(), context.Canceled) {
			return engine.Decision{}, -1, ctx.Err()
		}
		// The failure rule, for the call as a whole (counted as len(reqs)
		// requests), unless a key's summed cost is above its capacity
		// under the policy last seen.
		st := s.cur.Load()
		for j := range items {
			if r := s.failResult(st, &items[j], 0); r.Err != nil {
				return engine.Decision{}, slices.Index(of, j), r.Err
			}
		}
		d := s.failResult(st, &items[0], uint64(len(reqs))).Decision
		s.report(unavailable(err))
		return d, 0, nil
	}
	// Errors in the rules' order: a cost no band can hold, then Redis out
	// of memory (every item), then a reply the store could not read. Redis
	// decided the call unless it was out of memory, as Allow counts.
	res = res[:len(items)]
	if j := slices.IndexFunc(res, func(r engine.Result) bool { return r.Err == engine.ErrCostExceedsCapacity }); j >= 0 {
		s.decisions.Add(uint64(len(reqs)))
		return engine.Decision{}, slices.Index(of, j), engine.ErrCostExceedsCapacity
	}
	if res[0].Err == engine.ErrKeyCapacity {
		return engine.Decision{}, 0, engine.ErrKeyCapacity
	}
	s.decisions.Add(uint64(len(reqs)))
	if j := slices.IndexFunc(res, func(r engine.Result) bool { return r.Err != nil }); j >= 0 {
		return engine.Decision{}, -1, res[j].Err
	}
	admit := !slices.ContainsFunc(res, func(r engine.Result) bool { return !r.Decision.Allowed })
	at := 0
	for i := 1; i < len(reqs); i++ {
		d, best := &res[of[i]].Decision, &res[of[at]].Decision
		if (admit && d.Remaining < best.Remaining) || (!admit && d.RetryAfter > best.RetryAfter) {
			at = i
		}
	}
	d := res[of[at]].Decision
	d.Allowed = admit
	return d, at, nil
}
