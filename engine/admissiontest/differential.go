package admissiontest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tokenshard/tokenshard/policy"
)

// A random differential test: seeded sequences of every operation, valid
// and not, against the math/big model, comparing every Decision field,
// every error and the policy in force. On failure the op log shows the
// whole run.

var differentialBehaviours = []behaviour{
	{"Random", testDifferential},
}

// Differential runs: seeds, and operations per seed. The last
// diffEndOfTime operations run with the clock near math.MaxInt64, where
// Advance saturates and every elapsed time is enormous.
const (
	diffOps       = 300
	diffEndOfTime = 30
)

var diffSeeds = []uint64{1, 2, 3, 4, 5, 6}

func testDifferential(t *testing.T, f Factory) {
	for _, seed := range diffSeeds {
		name := fmt.Sprintf("seed=%d", seed)
		t.Run(name, func(t *testing.T) { runDifferential(t, f, seed, name) })
	}
}

func runDifferential(t *testing.T, f Factory, seed uint64, name string) {
	r := rand.New(rand.NewPCG(seed, 0xd1ff))
	w := newModelled(t, f, genPolicy(t, r, policy.Policy{}), "differential "+name)
	for op := range diffOps {
		if op == diffOps-diffEndOfTime {
			w.set(max(w.clk.Now(), math.MaxInt64-r.Int64N(1e15)))
		}
		switch p := r.IntN(100); {
		case p < 25:
			w.advance(genStep(r, true))
		case p < 65:
			key := genKey(r)
			w.allow(key, genCost(r, w.m.Policy(), key))
		case p < 77:
			w.batch(genBatch(r, w.m.Policy()), r.IntN(3))
		case p < 85:
			w.evict()
		default:
			next, expected := genReplace(t, r, w.m.Policy())
			w.replace(next, expected)
		}
	}
	for _, key := range genKeys {
		w.allow(key, 1)
	}
}

// genReplace draws a ReplacePolicy call against cur: mostly a valid cutover,
// sometimes stale (a wrong expectedVersion, or a next version not above
// cur's) or invalid (which wins over stale).
func genReplace(t *testing.T, r *rand.Rand, cur policy.Policy) (policy.Policy, int64) {
	next := genPolicy(t, r, cur)
	switch r.IntN(10) {
	case 0:
		return next, cur.Version - 1 - r.Int64N(2)
	case 1:
		return next, next.Version
	case 2:
		next.Version = cur.Version - r.Int64N(2)
	case 3:
		next.Version = []int64{0, -1, math.MinInt64}[r.IntN(3)]
	case 4:
		if r.IntN(2) == 0 {
			next.Capacity = -r.Int64N(2)
		} else {
			next.TokensPerSecond = -r.Int64N(2)
		}
	}
	return next, cur.Version
}
