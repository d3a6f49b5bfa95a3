package admissiontest

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// Random inputs for the model comparisons. Every draw comes from a seeded
// rand.Rand, so a seed names a run exactly.

// genKeys are the valid keys of the random tests: plain ones, ones that the
// generated overrides match exactly or by pattern, one containing '*' (which
// only patterns can match), and one of exactly the default bound.
var genKeys = []string{"a", "b", "c", "vip:1", "vip:2", "tenant:acme", "bob:login", "k*star", keyOfMaxBytes, " padded "}

// genBadKeys are keys every call refuses with ErrInvalidKey.
var genBadKeys = []string{"", " \t", keyOverMaxBytes}

// genMatches are the Match strings overrides are drawn from: exact keys
// and patterns, '*' alone included, so a key may move between the default,
// an exact override and a pattern from one policy to the next.
var genMatches = []string{"a", "tenant:acme", "vip:1", "vip:*", "*:login", "k*", "*"}

// genMagnitude draws a capacity or rate: mostly small, sometimes huge, so
// both the everyday path and the 128-bit corners are exercised.
func genMagnitude(r *rand.Rand) int64 {
	switch r.IntN(6) {
	case 0, 1:
		return 1 + r.Int64N(10)
	case 2, 3:
		return 1 + r.Int64N(1000)
	case 4:
		return 1 + r.Int64N(math.MaxInt64)
	default:
		return math.MaxInt64 - r.Int64N(3)
	}
}

// genOverrides draws an override set, nil half of the time, with its
// entries in random declaration order (which decides between patterns).
func genOverrides(t *testing.T, r *rand.Rand) *policy.OverrideSet {
	t.Helper()
	if r.IntN(2) == 0 {
		return nil
	}
	var os []policy.Override
	for _, i := range r.Perm(len(genMatches)) {
		if r.IntN(3) == 0 {
			os = append(os, policy.Override{Match: genMatches[i], Capacity: genMagnitude(r), TokensPerSecond: genMagnitude(r)})
		}
	}
	set, err := policy.NewOverrideSet(os...)
	require.NoError(t, err, "the suite built an invalid override set %+v", os)
	return set
}

// genPolicy draws a valid policy newer than cur: versions need not be
// consecutive, capacities and rates go up and down by any amount.
func genPolicy(t *testing.T, r *rand.Rand, cur policy.Policy) policy.Policy {
	t.Helper()
	return policy.Policy{
		Version:         cur.Version + 1 + r.Int64N(3),
		Capacity:        genMagnitude(r),
		TokensPerSecond: genMagnitude(r),
		Overrides:       genOverrides(t, r),
	}
}

// genCost draws a cost for key under p: mostly legal (1, the capacity,
// anything between), sometimes above the key's capacity or below 1.
func genCost(r *rand.Rand, p policy.Policy, key string) int64 {
	capacity := model.LimitOf(p, key).Capacity
	switch r.IntN(10) {
	case 0, 1:
		return 1
	case 2, 3:
		return capacity
	case 4, 5, 6:
		return 1 + r.Int64N(capacity)
	case 7:
		if capacity < math.MaxInt64 {
			return capacity + 1
		}
		return math.MaxInt64
	case 8:
		return []int64{0, -1, math.MinInt64}[r.IntN(3)]
	default:
		return math.MaxInt64
	}
}

// genValidCost draws a cost key can be charged under p: 1 to its capacity.
func genValidCost(r *rand.Rand, p policy.Policy, key string) int64 {
	capacity := model.LimitOf(p, key).Capacity
	if r.IntN(3) == 0 {
		return capacity
	}
	return 1 + r.Int64N(capacity)
}

// genKey draws a key, an invalid one now and then.
func genKey(r *rand.Rand) string {
	if r.IntN(10) == 0 {
		return genBadKeys[r.IntN(len(genBadKeys))]
	}
	return genKeys[r.IntN(len(genKeys))]
}

// genBatch draws up to 8 requests over genKeys, with repeats.
func genBatch(r *rand.Rand, p policy.Policy) []engine.Request {
	reqs := make([]engine.Request, r.IntN(9))
	for i := range reqs {
		key := genKey(r)
		reqs[i] = engine.Request{Key: key, Cost: genCost(r, p, key)}
	}
	return reqs
}

// genStep draws how far the clock moves. Small steps keep slow buckets
// partly filled; wide ones add steps of up to 1e16 ns (four months), so a
// run crosses refill products far beyond 64 bits while its total stays
// below math.MaxInt64.
func genStep(r *rand.Rand, wide bool) time.Duration {
	if !wide {
		return time.Duration(r.Int64N(int64(10 * time.Millisecond)))
	}
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return time.Duration(1 + r.Int64N(10))
	case 2, 3, 4:
		return time.Duration(r.Int64N(2e9))
	case 5, 6:
		return time.Duration(r.Int64N(1e12))
	default:
		return time.Duration(r.Int64N(1e16))
	}
}
