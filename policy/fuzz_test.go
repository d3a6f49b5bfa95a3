package policy_test

import (
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// The fuzz targets take raw int64s and fold them into the preconditions the
// policy functions document (the shard checks these before calling), so
// every input the fuzzer invents is a legal state and every disagreement
// with the model is a bug.

// positive folds x into [1, MaxInt64], keeping MaxInt64 and small values as
// they are: clearing the sign bit maps -1 to MaxInt64.
func positive(x int64) int64 {
	x &= math.MaxInt64
	if x == 0 {
		return 1
	}
	return x
}

// nonNegative folds x into [0, MaxInt64].
func nonNegative(x int64) int64 { return x & math.MaxInt64 }

// upTo folds x into [0, hi] for hi >= 0.
func upTo(x, hi int64) int64 {
	x = nonNegative(x)
	if x <= hi {
		return x
	}
	return x % (hi + 1) // x > hi, so hi < MaxInt64 and hi+1 cannot overflow
}

// costFor folds x into [1, capacity].
func costFor(x, capacity int64) int64 {
	x = positive(x)
	if x <= capacity {
		return x
	}
	return 1 + (x-1)%capacity
}

// later returns last + d for d folded to >= 0, saturated at MaxInt64.
func later(last, d int64) int64 {
	d = nonNegative(d)
	if last > math.MaxInt64-d {
		return math.MaxInt64
	}
	return last + d
}

// fuzzBucket builds a valid bucket for l from raw inputs.
func fuzzBucket(l policy.Limit, tokens int64, frac uint32, last int64, epoch uint32) policy.Bucket {
	b := policy.Bucket{
		Tokens: upTo(tokens, l.Capacity),
		Frac:   frac % policy.UnitsPerToken,
		Last:   nonNegative(last),
		Epoch:  uint16(epoch),
		Limit:  policy.LimitIndex(epoch >> 16),
	}
	if b.Tokens == l.Capacity {
		b.Frac = 0
	}
	return b
}

const (
	fMax = math.MaxInt64
	fMin = math.MinInt64
)

func FuzzDecide(f *testing.F) {
	// capacity, rate, tokens, frac, last,
	// d1, c1, d2, c2, d3, c3, steps,
	// cutBefore, newCapacity, newRate, dCut
	type seed struct {
		capacity, rate, tokens int64
		frac                   uint32
		last                   int64
		d1, c1, d2, c2, d3, c3 int64
		steps, cutBefore       uint8
		newCapacity, newRate   int64
		dCut                   int64
	}
	const noCut = 3
	for _, s := range []seed{
		// TestDecideWorkedExamples: capacity 10 at 2/s, and capacity 1 at 3/s.
		{10, 2, 10, 0, 0, 0, 10, 0, 1, 250_000_000, 1, 3, noCut, 0, 0, 0},
		{1, 3, 0, 0, 0, 333_333_333, 1, 1, 1, 0, 1, 2, noCut, 0, 0, 0},
		// Its cutover: empty at 2/s, 0.5 s later capacity 20 at 4/s.
		{10, 2, 0, 0, 0, 500_000_000, 1, 250_000_000, 2, 0, 1, 2, 0, 20, 4, 500_000_000},
		// Everything at its maximum.
		{fMax, fMax, fMax, 0, 0, fMax, fMax, fMax, fMax, fMax, fMax, 3, 1, fMax, fMax, fMax},
		{fMax, fMax, 0, 999_999_999, 0, 2, 1, 0, fMax, fMax, 1, 3, noCut, 0, 0, 0},
		{fMax, 1, 0, 0, 0, fMax, fMax, 0, 1, 0, fMax, 3, noCut, 0, 0, 0},
		{fMax, 1_000_000_000, 0, 999_999_999, 0, 0, fMax, 0, fMax, 0, fMax, 1, noCut, 0, 0, 0},
		{fMax, fMax, 0, 0, fMax, 0, 1, 0, 1, 0, 1, 3, noCut, 0, 0, 0},
		// Values that fold to the edges: -1 -> MaxInt64, MinInt64 -> 1.
		{-1, -1, -1, math.MaxUint32, -1, -1, -1, -1, -1, -1, -1, 255, 255, -1, -1, -1},
		{fMin, fMin, fMin, 0, fMin, fMin, fMin, fMin, fMin, fMin, fMin, 0, 0, fMin, fMin, fMin},
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		// ceilDiv corners: deficits of 2^65-1 and 2^64-1 at rate 2.
		{36_893_488_148, 2, 0, 580_896_769, 0, 0, 36_893_488_148, 0, 1, 1, 1, 3, noCut, 0, 0, 0},
		{18_446_744_074, 2, 0, 290_448_385, 0, 0, 18_446_744_074, 0, 1, 1, 1, 3, noCut, 0, 0, 0},
		{18_446_744_074, 1, 0, 290_448_385, 0, 0, 18_446_744_074, 0, 1, 1, 1, 3, noCut, 0, 0, 0},
		// Cutovers that raise and lower the capacity from extremes.
		{fMax, fMax, fMax, 0, 0, 0, 1, 1, 1, 1, 1, 3, 2, 1, 1, fMax},
		{1, 1, 0, 999_999_999, 0, 1, 1, 1, 1, 1, 1, 3, 1, fMax, fMax, 0},
		{10, 1, 9, 999_999_999, 5, 0, 10, 1, 10, 1, 10, 3, 0, 9, 1, 0},
	} {
		f.Add(s.capacity, s.rate, s.tokens, s.frac, s.last,
			s.d1, s.c1, s.d2, s.c2, s.d3, s.c3, s.steps,
			s.cutBefore, s.newCapacity, s.newRate, s.dCut)
	}

	f.Fuzz(func(t *testing.T, capacity, rate, tokens int64, frac uint32, last int64,
		d1, c1, d2, c2, d3, c3 int64, steps uint8,
		cutBefore uint8, newCapacity, newRate, dCut int64,
	) {
		l := policy.Limit{Capacity: positive(capacity), TokensPerSecond: positive(rate)}
		b := fuzzBucket(l, tokens, frac, last, uint32(steps))
		m := modelOf(b)
		n := 1 + int(steps%3)
		cut := int(cutBefore % 4) // 0..2: cut over before that step; 3 or past n: no cutover
		ds := [3]int64{d1, d2, d3}
		cs := [3]int64{c1, c2, c3}

		for i := range n {
			if i == cut {
				next := policy.Limit{Capacity: positive(newCapacity), TokensPerSecond: positive(newRate)}
				at := later(b.Last, dCut)
				before := b
				b.Cutover(l, next, at)
				m.cutover(l, next, at)
				requireSame(t, m, b, "Cutover(%+v, %+v, %d) of %+v", l, next, at, before)
				requireValid(t, next, b, "after Cutover")
				l = next
			}
			now := later(b.Last, ds[i])
			cost := costFor(cs[i], l.Capacity)
			before := b
			msg := []any{"step %d: limit %+v bucket %+v Decide(now=%d, cost=%d)", i, l, before, now, cost}

			// The read-only estimates on the state as it stands.
			require.Equal(t, m.retryAfter(l, cost), b.RetryAfter(l, cost), msg...)
			require.Equal(t, m.resetAfter(l), b.ResetAfter(l), msg...)
			require.Equal(t, m.full(l), b.Full(l), msg...)

			got := b.Decide(l, now, cost)
			want := m.decide(l, now, cost)
			require.Equal(t, want.Allowed, got.Allowed, msg...)
			require.Equal(t, want.Remaining, got.Remaining, msg...)
			require.Equal(t, want.RetryAfter, got.RetryAfter, msg...)
			require.Equal(t, want.ResetAfter, got.ResetAfter, msg...)
			requireSame(t, m, b, msg...)
			requireValid(t, l, b, msg...)
			require.Equal(t, before.Epoch, b.Epoch, "Decide never touches Epoch")
			require.Equal(t, before.Limit, b.Limit, "Decide never touches Limit")
		}
	})
}

func FuzzCutover(f *testing.F) {
	for _, s := range []struct {
		capacity, rate, tokens int64
		frac                   uint32
		last                   int64
		newCapacity, newRate   int64
		dAt, dAfter, cost      int64
	}{
		{10, 2, 0, 0, 0, 20, 4, 500_000_000, 250_000_000, 1}, // TestDecideWorkedExamples's cutover
		{10, 2, 10, 0, 0, 20, 4, 0, 0, 20},                   // raising never tops up
		{10, 2, 10, 0, 0, 4, 4, 0, 0, 4},                     // lowering clamps
		{fMax, fMax, 0, 999_999_999, 0, 1, 1, fMax, fMax, 1},
		{1, 1, 0, 999_999_999, 0, fMax, fMax, 0, 1, fMax},
		{fMax, 1, 0, 0, fMax, fMax, 1, fMax, fMax, fMax},
		{-1, -1, -1, math.MaxUint32, -1, -1, -1, -1, -1, -1},
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		f.Add(s.capacity, s.rate, s.tokens, s.frac, s.last, s.newCapacity, s.newRate, s.dAt, s.dAfter, s.cost)
	}
	f.Fuzz(func(t *testing.T, capacity, rate, tokens int64, frac uint32, last int64,
		newCapacity, newRate, dAt, dAfter, cost int64,
	) {
		old := policy.Limit{Capacity: positive(capacity), TokensPerSecond: positive(rate)}
		next := policy.Limit{Capacity: positive(newCapacity), TokensPerSecond: positive(newRate)}
		b := fuzzBucket(old, tokens, frac, last, 0)
		at := later(b.Last, dAt)
		start := b
		m := modelOf(b)

		b.Cutover(old, next, at)
		m.cutover(old, next, at)
		msg := []any{"Cutover(%+v, %+v, %d) of %+v", old, next, at, start}
		requireSame(t, m, b, msg...)
		requireValid(t, next, b, msg...)

		// Never more than the old limit alone would hold at the cutover.
		underOld := modelOf(start)
		underOld.refill(old, at)
		require.LessOrEqual(t, m.units.Cmp(underOld.units), 0, msg...)

		// From then on the new limit decides.
		now := later(at, dAfter)
		c := costFor(cost, next.Capacity)
		require.Equal(t, m.decide(next, now, c), b.Decide(next, now, c), msg...)
		requireSame(t, m, b, msg...)
	})
}

func FuzzCeilDiv(f *testing.F) {
	const maxU = math.MaxUint64
	for _, s := range [][3]uint64{
		{0, 0, 1}, {0, 1, 2}, {1, maxU, 2}, {0, maxU, 2}, {0, maxU - 2, 2},
		{maxU - 1, maxU, maxU}, {1, 0, maxU}, {0, math.MaxInt64, 1},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, hi, lo, d uint64) {
		if d == 0 {
			d = 1
		}
		want := saturate(ceilBig(u128(hi, lo), new(big.Int).SetUint64(d)))
		require.Equal(t, want, policy.CeilDiv(hi, lo, d), "ceilDiv(%d, %d, %d)", hi, lo, d)
	})
}
