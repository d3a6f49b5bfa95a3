package main

import (
	"math"

	"github.com/tokenshard/tokenshard/engine"
)

// Known engine bugs, found by these checks and not fixed yet. Unless the
// command runs with -exact (options.exact; linSpec.exact, diffGen.exact),
// the generators steer around them, so that a run goes on looking for
// others instead of stopping at the first, every time, at one of these.
// Each has a reproducer in known_bugs_test.go, which skips, saying so,
// while the bug reproduces; once they all pass, drop the steering.
//
//  1. AllowAll sums a key's costs saturating at math.MaxInt64, so a key whose
//     every band has capacity math.MaxInt64 and whose costs add up past it
//     (math.MaxInt64 and 1) is admitted, taking math.MaxInt64, where the
//     contract (and the model) says ErrCostExceedsCapacity. Steered by
//     allWithinInt64. (TestKnownBugSumPastMaxInt64)
//  2. AllowAll's ErrCostExceedsCapacity may be decided under two policy
//     versions: each shard checks its part under its own policy as it takes
//     it, and an error ends the call without the version check a decision
//     gets. A cutover between two parts' checks can so yield an answer no
//     single version gives: under v1 (capacity 1) AllowAll([{x 2} {y 2}])
//     is ErrCostExceedsCapacity at 0, under v2 (capacity 5) admitted, but
//     with y's shard before x's, y checked under v1 and x under v2, the
//     call answers ErrCostExceedsCapacity at 1. Steered by linSteer: in a
//     round with a cutover, an AllowAll asks 1 token of each key once,
//     which no policy refuses. (TestKnownBugMixedVersions)
//  3. AllowAll reserves room in the key bound for its new keys as it holds
//     each shard, before it is decided, and a refused call (or one that
//     fails on a later shard) gives the room back: meanwhile KeyCount
//     counts keys that never exist, and a call on another shard that would
//     create a key is refused ErrKeyCapacity for room nothing kept. With
//     MaxKeys 2 and key a tracked and empty, AllowAll([{n 1} {a 1}]) is
//     refused and creates nothing, yet a concurrent Allow(z) on a third
//     shard's new key answers ErrKeyCapacity. Steered by linSteer, in the
//     histories whose KeyCount and key bound are checked exactly
//     (unpartitioned): a round with an AllowAll has no KeyCount and, on
//     several shards, no other call that may create a key.
//     (TestKnownBugPhantomKeys)

// allWithinInt64 returns reqs without the requests that would take their
// key's summed cost past math.MaxInt64 (requests with a cost below 1 are
// kept: they make the call ErrInvalidCost before any sum counts): the
// steering around known bug 1.
func allWithinInt64(reqs []engine.Request) []engine.Request {
	sums := map[string]int64{}
	out := reqs[:0:0]
	for _, r := range reqs {
		if r.Cost >= 1 {
			if sums[r.Key] > math.MaxInt64-r.Cost {
				continue
			}
			sums[r.Key] += r.Cost
		}
		out = append(out, r)
	}
	return out
}
