package policy_test

import (
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// fuzzLimit folds raw inputs into a valid limit: a rate of n per per ns,
// or n per second as TokensPerSecond when perSecond is set.
func fuzzLimit(capacity, n, per int64, perSecond bool) policy.Limit {
	if perSecond {
		return policy.Limit{Capacity: positive(capacity), TokensPerSecond: positive(n)}
	}
	return policy.Limit{Capacity: positive(capacity), Refill: policy.Rate{Tokens: positive(n), Per: time.Duration(positive(per))}}
}

// fuzzLevel folds raw inputs into a valid level of l.
func fuzzLevel(l policy.Limit, tokens int64, frac uint64) policy.Level {
	v := policy.Level{Tokens: upTo(tokens, l.Capacity), Frac: frac % uint64(period(l))}
	if v.Tokens == l.Capacity {
		v.Frac = 0
	}
	return v
}

// FuzzLevels compares the Level arithmetic for any rate, capacity, balance,
// cost and elapsed time with the rational model: refill, the decision over
// one or two bands, Remaining and RetryAfter (and ResetAfter). Where the
// key's limit is one band of a compact period, the 24-byte Bucket must give
// the same answers and balance.
func FuzzLevels(f *testing.F) {
	const day = int64(24 * time.Hour)
	type seed struct {
		c1, n1, p1, t1 int64
		f1             uint64
		c2, n2, p2, t2 int64
		f2             uint64
		flags          uint8 // 1: a second band; 2: the primary is TokensPerSecond
		d1, k1, d2, k2 int64
	}
	for _, s := range []seed{
		// Two worked examples: capacity 10 at 100 per minute, and 5
		// at 5/s with "daily" 20 per day, both emptied.
		{10, 100, int64(time.Minute), 0, 0, 0, 0, 0, 0, 0, 0, 599_999_999, 1, 1, 1},
		{5, 5, 0, 0, 0, 20, 20, day, 0, 0, 3, int64(4 * time.Second), 1, 4316 * int64(time.Second), 1},
		// 7 per 3 s, compact, from one unit.
		{10, 7, 3_000_000_000, 0, 1, 0, 0, 0, 0, 0, 0, 428_571_428, 1, 1, 1},
		// 1 per day and 1 per MaxInt64 ns.
		{1, 1, day, 0, 0, 0, 0, 0, 0, 0, 0, day - 1, 1, 1, 1},
		{fMax, 1, fMax, 0, 0, 2, 1, fMax, 0, 1, 1, fMax, 2, fMax, fMax},
		// MaxInt64 per 1 ns, at capacity 1 and MaxInt64.
		{1, fMax, 1, 0, 0, fMax, fMax, 1, 0, 0, 1, 1, 1, 0, 1},
		{fMax, fMax, 1, 0, 0, 0, 0, 0, 0, 0, 0, fMax, fMax, fMax, fMax},
		// 100 per minute at capacity 1, a unit short of a token.
		{1, 100, int64(time.Minute), 0, uint64(time.Minute) - 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1},
		// The compact edge, 2^32 ns, and just past it.
		{3, 1, 1 << 32, 1, 1<<32 - 1, 3, 1, 1<<32 + 1, 1, 1 << 32, 1, 1, 2, 1, 3},
		// Values that fold to the edges: -1 -> MaxInt64, MinInt64 -> 1.
		{-1, -1, -1, -1, ^uint64(0), -1, -1, -1, -1, ^uint64(0), 255, -1, -1, -1, -1},
		{fMin, fMin, fMin, fMin, 0, fMin, fMin, fMin, fMin, 0, 0, fMin, fMin, fMin, fMin},
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		f.Add(s.c1, s.n1, s.p1, s.t1, s.f1, s.c2, s.n2, s.p2, s.t2, s.f2, s.flags, s.d1, s.k1, s.d2, s.k2)
	}
	f.Fuzz(func(t *testing.T, c1, n1, p1, t1 int64, f1 uint64, c2, n2, p2, t2 int64, f2 uint64,
		flags uint8, d1, k1, d2, k2 int64,
	) {
		sh := policy.Shape{Primary: fuzzLimit(c1, n1, p1, flags&2 != 0)}
		if flags&1 != 0 {
			b2 := fuzzLimit(c2, n2, p2, false)
			bands, err := policy.NewBands(policy.Band{Name: "b", Capacity: b2.Capacity, Refill: b2.Refill})
			require.NoError(t, err)
			sh.Bands = bands
		}
		lv := []policy.Level{fuzzLevel(sh.Band(0), t1, f1)}
		if sh.Len() == 2 {
			lv = append(lv, fuzzLevel(sh.Band(1), t2, f2))
		}
		xs := ratsOf(sh, lv)
		// The Bucket, when one can hold the key: its clock starts at 0.
		compact := sh.Compact()
		var b policy.Bucket
		if compact {
			b = policy.Bucket{Tokens: lv[0].Tokens, Frac: uint32(lv[0].Frac)}
		}

		for i, s := range [2][2]int64{{d1, k1}, {d2, k2}} {
			elapsed := nonNegative(s[0])
			if compact {
				elapsed = later(b.Last, elapsed) - b.Last // the Bucket's clock stops at MaxInt64
			}
			cost := costFor(s[1], minCapacity(sh))
			msg := []any{"step %d: shape %+v bands %v levels %+v elapsed %d cost %d", i, sh, sh.Bands.Bands(), slices.Clone(lv), elapsed, cost}

			unrefilled := lv[0]
			policy.RefillLevels(sh, lv, elapsed)
			for j := range xs {
				xs[j] = ratRefill(sh.Band(j), xs[j], elapsed)
			}
			requireLevels(t, sh, xs, lv, msg...)
			for j := range lv {
				l := sh.Band(j)
				require.Equal(t, ratFloor(xs[j]), lv[j].Tokens, msg...)
				require.Equal(t, ratWait(l, xs[j], cost), lv[j].RetryAfter(l, cost), msg...)
				require.Equal(t, ratWait(l, xs[j], l.Capacity), lv[j].ResetAfter(l), msg...)
				require.Equal(t, xs[j].Cmp(ratTokens(l.Capacity)) == 0, lv[j].Full(l), msg...)
			}

			peek, peekBand := policy.PeekLevels(sh, lv)
			wantPeek, wantPeekBand := ratDecide(sh, xs, 1, false)
			require.Equal(t, wantPeek, peek, msg...)
			require.Equal(t, wantPeekBand, peekBand, msg...)

			before := slices.Clone(lv)
			got, band := policy.DecideLevels(sh, lv, cost)
			want, wantBand := ratDecide(sh, xs, cost, true)
			require.Equal(t, want, got, msg...)
			require.Equal(t, wantBand, band, msg...)
			requireLevels(t, sh, xs, lv, msg...)
			if !got.Allowed {
				require.Equal(t, before, lv, append(msg, "a denial takes nothing")...)
			}

			if compact {
				l := sh.Primary
				require.Equal(t, unrefilled, policy.LevelOf(b), msg...)
				require.Equal(t, unrefilled.RetryAfter(l, cost), b.RetryAfter(l, cost), msg...)
				require.Equal(t, unrefilled.ResetAfter(l), b.ResetAfter(l), msg...)
				now := b.Last + elapsed
				require.Equal(t, want, b.Decide(l, now, cost), msg...)
				require.Equal(t, lv[0], policy.LevelOf(b), msg...)
				require.Equal(t, now, b.Last, msg...)
			}
		}
		// A balance never exceeds a capacity, and the model agrees.
		for j := range xs {
			require.LessOrEqual(t, xs[j].Cmp(new(big.Rat).SetInt64(sh.Band(j).Capacity)), 0)
		}
	})
}
