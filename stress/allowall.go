package main

import (
	"math"

	"github.com/tokenshard/tokenshard/engine"
)

// allWithinInt64 returns reqs without the requests that would take their
// key's summed cost past math.MaxInt64 (requests with a cost below 1 are
// kept: they make the call ErrInvalidCost before any sum counts).
//
// The generators of AllowAll calls use it to steer around a known engine
// bug, so that the checks go on looking for others: the engine sums a key's
// costs saturating at math.MaxInt64, so a key whose every band has capacity
// math.MaxInt64 and whose costs add up past it (say math.MaxInt64 and 1) is
// admitted, taking math.MaxInt64, where the contract (and the model) says
// ErrCostExceedsCapacity. TestAllowAllSumPastMaxInt64 reproduces it.
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
