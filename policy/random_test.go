package policy_test

import (
	"flag"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestRefillComposes: refilling a->b then b->c equals refilling a->c, since
// min(C, min(C, u+x) + y) = min(C, u+x+y) for x, y >= 0 and the arithmetic
// is exact.
func TestRefillComposes(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 50_000 {
		l, start, mid, _ := randomState(r)
		end := mid + interesting(r, 0, maxInt64-mid)

		twoSteps := start
		twoSteps.Refill(l, mid)
		twoSteps.Refill(l, end)
		oneStep := start
		oneStep.Refill(l, end)
		require.Equal(t, oneStep, twoSteps, "seed %d iteration %d: limit %+v bucket %+v, %d -> %d -> %d",
			seed, i, l, start, start.Last, mid, end)

		m := modelOf(start)
		m.refill(l, end)
		requireSame(t, m, oneStep, "seed %d iteration %d: limit %+v bucket %+v, refill to %d", seed, i, l, start, end)
	}
}

// TestDecideMatchesModelRandom runs random sequences of Decide, Cutover and
// the read-only estimates against the model: the same comparison as
// FuzzDecide, with a fresh seed each run.
func TestDecideMatchesModelRandom(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 5_000 {
		l, b, now, cost := randomState(r)
		m := modelOf(b)
		for j := range 4 {
			msg := []any{"seed %d iteration %d step %d: limit %+v bucket %+v now %d cost %d", seed, i, j, l, b, now, cost}
			require.Equal(t, m.retryAfter(l, cost), b.RetryAfter(l, cost), msg...)
			require.Equal(t, m.resetAfter(l), b.ResetAfter(l), msg...)
			require.Equal(t, m.full(l), b.Full(l), msg...)
			if r.IntN(4) == 0 {
				next := randomLimit(r)
				b.Cutover(l, next, now)
				m.cutover(l, next, now)
				l = next
				cost = interesting(r, 1, l.Capacity)
				requireSame(t, m, b, msg...)
			}
			require.Equal(t, m.decide(l, now, cost), b.Decide(l, now, cost), msg...)
			requireSame(t, m, b, msg...)
			requireValid(t, l, b, msg...)
			now += interesting(r, 0, maxInt64-now)
			cost = interesting(r, 1, l.Capacity)
		}
	}
}

var seedFlag = flag.Uint64("seed", 0, "seed for the randomised policy tests (0: pick one and log it)")

// newRand returns a generator seeded from -seed or from the clock. The seed
// is logged when the test fails, and is in every failure message, so a
// failure can be replayed with -seed.
func newRand(t *testing.T) (*rand.Rand, uint64) {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with -seed=%d", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed
}

// interesting returns a value in [lo, hi] (0 <= lo <= hi), drawn mostly from
// the places arithmetic goes wrong: the ends of the range, near them, powers
// of two and multiples of 1e9, plus uniform values.
func interesting(r *rand.Rand, lo, hi int64) int64 {
	span := uint64(hi - lo) // lo >= 0, so this cannot overflow
	clampTo := func(v uint64) int64 {
		if v > span {
			v = span
		}
		return lo + int64(v)
	}
	small := uint64(r.IntN(4))
	switch r.IntN(9) {
	case 0:
		return lo
	case 1:
		return hi
	case 2:
		return clampTo(small)
	case 3:
		return hi - int64(min(small, span))
	case 4: // a power of two, give or take one
		p := uint64(1) << r.IntN(bits.Len64(span)+1)
		return clampTo(p - 1 + uint64(r.IntN(3)))
	case 5: // a whole number of tokens, give or take a unit
		n := uint64(r.Int64N(maxInt64/policy.UnitsPerToken + 1))
		if n > 0 && r.IntN(2) == 0 {
			n = uint64(r.IntN(20))
		}
		return clampTo(n*policy.UnitsPerToken - 1 + uint64(r.IntN(3)))
	case 6: // small
		return clampTo(uint64(r.IntN(1_000)))
	default:
		if span == math.MaxUint64 {
			return lo + int64(r.Uint64())
		}
		return lo + int64(r.Uint64N(span+1))
	}
}

// randomLimit returns a valid limit with interesting capacity and rate.
func randomLimit(r *rand.Rand) policy.Limit {
	return policy.Limit{Capacity: interesting(r, 1, maxInt64), TokensPerSecond: interesting(r, 1, maxInt64)}
}

// randomState returns a valid limit, a valid bucket for it, a reading
// now >= Last and a cost in [1, Capacity].
func randomState(r *rand.Rand) (policy.Limit, policy.Bucket, int64, int64) {
	l := randomLimit(r)
	b := policy.Bucket{
		Tokens: interesting(r, 0, l.Capacity),
		Frac:   uint32(interesting(r, 0, policy.UnitsPerToken-1)),
		Last:   interesting(r, 0, maxInt64),
		Epoch:  uint16(r.Uint32()),
		Limit:  policy.LimitIndex(r.Uint32()),
	}
	if b.Tokens == l.Capacity {
		b.Frac = 0
	}
	now := b.Last + interesting(r, 0, maxInt64-b.Last)
	return l, b, now, interesting(r, 1, l.Capacity)
}
