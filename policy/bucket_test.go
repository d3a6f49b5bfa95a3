package policy_test

import (
	"math"
	"math/big"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

const maxInt64 = math.MaxInt64

// Named instants, in nanoseconds of a clock that starts at 0, as
// x/time/rate's rate_test.go names t0, t1, ... so a step table reads like a
// timeline.
const (
	t0       int64 = 0
	t1ns     int64 = 1
	t250ms         = int64(250 * time.Millisecond)
	t500ms         = int64(500 * time.Millisecond)
	t750ms         = int64(750 * time.Millisecond)
	tThird   int64 = 333_333_333 // 1e9/3, floored: a third of a token short by one unit at 3/s
	tThirdUp int64 = 333_333_334 // ceil(1e9/3): the first instant 3/s has earned a token
	tMax     int64 = maxInt64
)

// step is one Decide call in a step table and what it must answer.
type step struct {
	at   int64
	cost int64
	want policy.Outcome
}

// allowed and denied build the expected Outcome of a step.
func allowed(remaining, resetAfter int64) policy.Outcome {
	return policy.Outcome{Allowed: true, Remaining: remaining, ResetAfter: resetAfter}
}

func denied(remaining, retryAfter, resetAfter int64) policy.Outcome {
	return policy.Outcome{Remaining: remaining, RetryAfter: retryAfter, ResetAfter: resetAfter}
}

// runSteps plays steps against b under l, checking each answer against the
// table and each answer and resulting balance against the model. It returns
// the bucket after the last step.
func runSteps(t *testing.T, l policy.Limit, b policy.Bucket, steps []step) policy.Bucket {
	t.Helper()
	m := modelOf(b)
	for i, s := range steps {
		got := b.Decide(l, s.at, s.cost)
		require.Equal(t, s.want, got, "step %d: Decide(at=%d, cost=%d)", i, s.at, s.cost)
		require.Equal(t, s.want, m.decide(l, s.at, s.cost), "step %d: the model disagrees with the table", i)
		requireSame(t, m, b, "step %d: balance after Decide(at=%d, cost=%d)", i, s.at, s.cost)
		requireValid(t, l, b, "step %d", i)
	}
	return b
}

// TestDecideWorkedExamples checks, at the bucket level, worked examples
// whose every figure a reader can recompute by hand from the formulas of
// Refill, RetryAfter and ResetAfter.
func TestDecideWorkedExamples(t *testing.T) {
	t.Run("capacity=10/rate=2", func(t *testing.T) {
		l := policy.Limit{Capacity: 10, TokensPerSecond: 2}
		b := policy.NewBucket(l, t0)
		fullIn := int64(5 * time.Second) // 10 tokens at 2/s
		b = runSteps(t, l, b, []step{
			{t0, 10, allowed(0, fullIn)},
			{t0, 1, denied(0, int64(500*time.Millisecond), fullIn)},
			{t250ms, 1, denied(0, int64(250*time.Millisecond), fullIn-t250ms)},
		})
		// The denial kept the half token it refilled, and the new Last.
		require.Equal(t, policy.Bucket{Tokens: 0, Frac: 500_000_000, Last: t250ms}, b)
		runSteps(t, l, b, []step{
			{t500ms, 1, allowed(0, fullIn)},
		})
	})

	t.Run("capacity=1/rate=3/sequence", func(t *testing.T) {
		l := policy.Limit{Capacity: 1, TokensPerSecond: 3}
		runSteps(t, l, policy.NewBucket(l, t0), []step{
			{t0, 1, allowed(0, tThirdUp)},       // just emptied at 0
			{tThird, 1, denied(0, 1, 1)},        // 999,999,999 units: one short
			{tThirdUp, 1, allowed(0, tThirdUp)}, // 1,000,000,002 units, clamped to 1e9
		})
	})

	// The same two instants, each as the first touch after emptying at 0.
	t.Run("capacity=1/rate=3/first-touch", func(t *testing.T) {
		l := policy.Limit{Capacity: 1, TokensPerSecond: 3}
		empty := policy.Bucket{Tokens: 0, Last: t0}
		runSteps(t, l, empty, []step{{tThird, 1, denied(0, 1, 1)}})
		runSteps(t, l, empty, []step{{tThirdUp, 1, allowed(0, tThirdUp)}})
	})

	t.Run("cutover", func(t *testing.T) {
		old := policy.Limit{Capacity: 10, TokensPerSecond: 2}
		next := policy.Limit{Capacity: 20, TokensPerSecond: 4}
		b := policy.Bucket{Tokens: 0, Last: t0} // empty under 2/s
		b.Cutover(old, next, t500ms)
		require.Equal(t, policy.Bucket{Tokens: 1, Last: t500ms}, b, "exactly 1 token at the cutover, not 2, not 20")
		b.Refill(next, t750ms)
		require.Equal(t, policy.Bucket{Tokens: 2, Last: t750ms}, b, "2 tokens at 0.75 s under 4/s")
	})
}

// edge is one hand-picked extreme state: the implementation must match the
// model on it, and on want/wantAfter where the table spells them out.
type edge struct {
	name      string
	l         policy.Limit
	b         policy.Bucket
	now, cost int64
	want      *policy.Outcome // nil: the model alone decides
	wantAfter *policy.Bucket  // nil: the model alone decides
}

func outcome(o policy.Outcome) *policy.Outcome { return &o }
func bucket(b policy.Bucket) *policy.Bucket    { return &b }

// twoTo64Minus returns 2^64 - k as a big.Int.
func twoTo64Minus(k int64) *big.Int {
	return new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(k))
}

func TestDecideEdgeCases(t *testing.T) {
	maxLimit := policy.Limit{Capacity: maxInt64, TokensPerSecond: maxInt64}
	// 2^63-1 units is 9223372036 tokens and 854775807 units.
	const maxUnitsTokens, maxUnitsFrac = 9_223_372_036, 854_775_807

	cases := []edge{
		{
			name: "capacity=max/full/cost=max",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: maxInt64},
			now:  t0, cost: maxInt64,
			want: outcome(allowed(0, maxInt64)), // Max*1e9 ns to refill saturates
		},
		{
			name: "capacity=max/rate=max/full/cost=1",
			l:    maxLimit,
			b:    policy.Bucket{Tokens: maxInt64},
			now:  t0, cost: 1,
			want: outcome(allowed(maxInt64-1, 1)), // ceil(1e9 / Max) = 1
		},
		{
			name: "rate=max/elapsed=1ns/empty",
			l:    maxLimit,
			b:    policy.Bucket{},
			now:  t1ns, cost: 1,
			// ceil((Max*1e9 - (Max-1e9)) / Max) = 1e9 - 1 + ceil(1e9/Max) = 1e9
			want:      outcome(allowed(maxUnitsTokens-1, 1_000_000_000)),
			wantAfter: bucket(policy.Bucket{Tokens: maxUnitsTokens - 1, Frac: maxUnitsFrac, Last: t1ns}),
		},
		{
			name: "time=max/rate=1/capacity=max/empty",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1},
			b:    policy.Bucket{Last: 0},
			now:  tMax, cost: 1,
			want:      outcome(allowed(maxUnitsTokens-1, maxInt64)),
			wantAfter: bucket(policy.Bucket{Tokens: maxUnitsTokens - 1, Frac: maxUnitsFrac, Last: tMax}),
		},
		{
			name: "time=max/rate=max/capacity=max/empty", // Max*Max units earned: full
			l:    maxLimit,
			b:    policy.Bucket{Last: 0},
			now:  tMax, cost: maxInt64,
			want:      outcome(allowed(0, 1_000_000_000)),
			wantAfter: bucket(policy.Bucket{Tokens: 0, Last: tMax}),
		},
		{
			name: "time=max/rate=max/capacity=1",
			l:    policy.Limit{Capacity: 1, TokensPerSecond: maxInt64},
			b:    policy.Bucket{Last: 0},
			now:  tMax, cost: 1,
			want: outcome(allowed(0, 1)),
		},
		{
			name: "last=max/now=max/elapsed=0",
			l:    policy.Limit{Capacity: 1, TokensPerSecond: 1},
			b:    policy.Bucket{Last: tMax},
			now:  tMax, cost: 1,
			want:      outcome(denied(0, 1_000_000_000, 1_000_000_000)),
			wantAfter: bucket(policy.Bucket{Last: tMax}),
		},
		{
			name: "rate=1/elapsed=1ns",
			l:    policy.Limit{Capacity: 1, TokensPerSecond: 1},
			b:    policy.Bucket{},
			now:  t1ns, cost: 1,
			want:      outcome(denied(0, 999_999_999, 999_999_999)),
			wantAfter: bucket(policy.Bucket{Frac: 1, Last: t1ns}),
		},
		{
			name: "rate=3/elapsed=0",
			l:    policy.Limit{Capacity: 1, TokensPerSecond: 3},
			b:    policy.Bucket{Frac: 5, Last: 10},
			now:  10, cost: 1,
			want:      outcome(denied(0, 333_333_332, 333_333_332)), // ceil(999,999,995/3)
			wantAfter: bucket(policy.Bucket{Frac: 5, Last: 10}),
		},
		{
			name: "rate=3/elapsed=1ns",
			l:    policy.Limit{Capacity: 1, TokensPerSecond: 3},
			b:    policy.Bucket{},
			now:  t1ns, cost: 1,
			want: outcome(denied(0, 333_333_333, 333_333_333)), // ceil(999,999,997/3)
		},
		{
			name: "cost=capacity/one-unit-short",
			l:    policy.Limit{Capacity: 10, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 9, Frac: 999_999_999},
			now:  t0, cost: 10,
			want: outcome(denied(9, 1, 1)),
		},
		{
			name: "cost=capacity/full",
			l:    policy.Limit{Capacity: 10, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 10},
			now:  t0, cost: 10,
			want: outcome(allowed(0, 10_000_000_000)),
		},
		{
			name: "cost=1/empty/rate=1",
			l:    policy.Limit{Capacity: 10, TokensPerSecond: 1},
			b:    policy.Bucket{},
			now:  t0, cost: 1,
			want: outcome(denied(0, 1_000_000_000, 10_000_000_000)),
		},
		{
			name: "frac=1e9-1/carry/rate=1",
			l:    policy.Limit{Capacity: 10, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 3, Frac: 999_999_999},
			now:  t1ns, cost: 4,
			want:      outcome(allowed(0, 10_000_000_000)),
			wantAfter: bucket(policy.Bucket{Tokens: 0, Last: t1ns}),
		},
		{
			name: "frac=1e9-1/carry/rate=2",
			l:    policy.Limit{Capacity: 10, TokensPerSecond: 2},
			b:    policy.Bucket{Tokens: 3, Frac: 999_999_999},
			now:  t1ns, cost: 5,
			// 4 tokens and 1 unit: ceil((1e9-1)/2), ceil((6e9-1)/2)
			want:      outcome(denied(4, 500_000_000, 3_000_000_000)),
			wantAfter: bucket(policy.Bucket{Tokens: 4, Frac: 1, Last: t1ns}),
		},
		{
			// 2*Max = 2^64-2 units earned: adding Frac carries out of the
			// low 64 bits.
			name: "frac=1e9-1/carry-out-of-64-bits",
			l:    maxLimit,
			b:    policy.Bucket{Frac: 999_999_999},
			now:  2, cost: 1,
			// 2^64 - 2 + 999,999,999 = 18446744074 tokens + 709551613 units
			wantAfter: bucket(policy.Bucket{Tokens: 18_446_744_073, Frac: 709_551_613, Last: 2}),
		},
		{
			name: "earned=deficit/exactly-full",
			l:    policy.Limit{Capacity: 2, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 1, Frac: 500_000_000},
			now:  t500ms, cost: 2,
			want:      outcome(allowed(0, 2_000_000_000)),
			wantAfter: bucket(policy.Bucket{Tokens: 0, Last: t500ms}),
		},
		{
			name: "earned=deficit-1/one-unit-short",
			l:    policy.Limit{Capacity: 2, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 1, Frac: 500_000_000},
			now:  t500ms - 1, cost: 2,
			want:      outcome(denied(1, 1, 1)),
			wantAfter: bucket(policy.Bucket{Tokens: 1, Frac: 999_999_999, Last: t500ms - 1}),
		},
		{
			name: "earned>deficit/clamped",
			l:    policy.Limit{Capacity: 2, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 1, Frac: 500_000_000},
			now:  t500ms + 1, cost: 1,
			want:      outcome(allowed(1, 1_000_000_000)),
			wantAfter: bucket(policy.Bucket{Tokens: 1, Last: t500ms + 1}),
		},
		{
			name: "retry-after/saturates",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1},
			b:    policy.Bucket{},
			now:  t0, cost: maxInt64,
			want: outcome(denied(0, maxInt64, maxInt64)),
		},
		{
			// (Max*1e9 - (1e9-1)) / 1e9 = Max - 1 + 1/1e9: rounds up to Max
			// exactly, which is not saturation.
			name: "retry-after/rounds-up-to-max",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1_000_000_000},
			b:    policy.Bucket{Frac: 999_999_999},
			now:  t0, cost: maxInt64,
			want: outcome(denied(0, maxInt64, maxInt64)),
		},
		{
			name: "retry-after/exact-max",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1_000_000_000},
			b:    policy.Bucket{},
			now:  t0, cost: maxInt64,
			want: outcome(denied(0, maxInt64, maxInt64)),
		},
		{
			name: "retry-after/exact-max-1",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1_000_000_000},
			b:    policy.Bucket{Tokens: 1},
			now:  t0, cost: maxInt64,
			want: outcome(denied(1, maxInt64-1, maxInt64-1)),
		},
		{
			name: "reset-after/capacity=max/one-token-short",
			l:    policy.Limit{Capacity: maxInt64, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: maxInt64 - 1},
			now:  t0, cost: 1,
			want: outcome(allowed(maxInt64-2, 2_000_000_000)),
		},
		// ceilDiv corners reached through the public API. Capacity n and Frac
		// f are picked so the deficit n*1e9 - f is the dividend named.
		{
			// 2^65-1 over 2: quotient 2^64-1 remainder 1. Rounding up would
			// wrap to 0 in 64 bits; it must saturate.
			name: "ceil-div/2^65-1-over-2",
			l:    policy.Limit{Capacity: 36_893_488_148, TokensPerSecond: 2},
			b:    policy.Bucket{Frac: 580_896_769},
			now:  t0, cost: 36_893_488_148,
			want: outcome(denied(0, maxInt64, maxInt64)),
		},
		{
			// 2^64-1 over 2: quotient 2^63-1 (= Max) remainder 1: ceil is 2^63.
			name: "ceil-div/2^64-1-over-2",
			l:    policy.Limit{Capacity: 18_446_744_074, TokensPerSecond: 2},
			b:    policy.Bucket{Frac: 290_448_385},
			now:  t0, cost: 18_446_744_074,
			want: outcome(denied(0, maxInt64, maxInt64)),
		},
		{
			// 2^64-3 over 2: quotient 2^63-2 remainder 1: ceil is Max exactly.
			name: "ceil-div/2^64-3-over-2",
			l:    policy.Limit{Capacity: 18_446_744_074, TokensPerSecond: 2},
			b:    policy.Bucket{Frac: 290_448_387},
			now:  t0, cost: 18_446_744_074,
			want: outcome(denied(0, maxInt64, maxInt64)),
		},
		{
			// 2^64-4 over 2: quotient Max-1, no remainder.
			name: "ceil-div/2^64-4-over-2",
			l:    policy.Limit{Capacity: 18_446_744_074, TokensPerSecond: 2},
			b:    policy.Bucket{Frac: 290_448_388},
			now:  t0, cost: 18_446_744_074,
			want: outcome(denied(0, maxInt64-1, maxInt64-1)),
		},
		{
			// 2^64-1 over 1: quotient 2^64-1, no remainder, still saturates.
			name: "ceil-div/2^64-1-over-1",
			l:    policy.Limit{Capacity: 18_446_744_074, TokensPerSecond: 1},
			b:    policy.Bucket{Frac: 290_448_385},
			now:  t0, cost: 1,
			want: outcome(denied(0, 1_000_000_000-290_448_385, maxInt64)),
		},
		{
			// Rate Max: the high word of the deficit is always below the
			// divisor, and the quotient is small.
			name: "ceil-div/rate=max",
			l:    maxLimit,
			b:    policy.Bucket{},
			now:  t0, cost: maxInt64,
			want: outcome(denied(0, 1_000_000_000, 1_000_000_000)),
		},
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			requireValid(t, c.l, c.b, "the case's starting bucket")
			m := modelOf(c.b)
			b := c.b
			got := b.Decide(c.l, c.now, c.cost)
			want := m.decide(c.l, c.now, c.cost)
			require.Equal(t, want, got, "Decide vs the model")
			requireSame(t, m, b, "balance after Decide vs the model")
			requireValid(t, c.l, b)
			if c.want != nil {
				require.Equal(t, *c.want, got, "Decide vs the table")
			}
			if c.wantAfter != nil {
				require.Equal(t, *c.wantAfter, b, "balance after Decide vs the table")
			}
		})
	}

	// The dividends named in the ceil-div cases above really are what the
	// comments say, so the cases test what they claim to.
	for _, d := range []struct {
		capacity int64
		frac     uint32
		want     *big.Int
	}{
		{36_893_488_148, 580_896_769, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 65), big.NewInt(1))},
		{18_446_744_074, 290_448_385, twoTo64Minus(1)},
		{18_446_744_074, 290_448_387, twoTo64Minus(3)},
		{18_446_744_074, 290_448_388, twoTo64Minus(4)},
	} {
		got := new(big.Int).Sub(capUnits(policy.Limit{Capacity: d.capacity}), big.NewInt(int64(d.frac)))
		require.Zero(t, got.Cmp(d.want), "deficit %v, want %v", got, d.want)
	}
}

func TestCeilDiv(t *testing.T) {
	const maxU = math.MaxUint64
	cases := []struct {
		hi, lo, d uint64
		want      int64
	}{
		{0, 0, 1, 0},
		{0, 0, maxU, 0},
		{0, 1, 1, 1},
		{0, 1, 2, 1},
		{0, 1, maxU, 1},
		{0, 9, 3, 3},
		{0, 10, 3, 4},
		{0, maxU, maxU, 1},
		{0, maxInt64 - 1, 1, maxInt64 - 1},
		{0, maxInt64, 1, maxInt64},           // quotient exactly Max: not saturation
		{0, maxInt64 + 1, 1, maxInt64},       // 2^63: saturated
		{0, maxU, 1, maxInt64},               // 2^64-1: saturated
		{0, maxU - 3, 2, maxInt64 - 1},       // 2^63-2, no remainder
		{0, maxU - 2, 2, maxInt64},           // 2^63-2 remainder 1: ceil is Max exactly
		{0, maxU - 1, 2, maxInt64},           // Max, no remainder
		{0, maxU, 2, maxInt64},               // Max remainder 1: ceil 2^63 saturates
		{1, 0, 2, maxInt64},                  // 2^63
		{1, maxU, 2, maxInt64},               // 2^64-1 remainder 1: q++ would wrap to 0
		{1, 0, 1, maxInt64},                  // hi >= d: the quotient needs 65 bits
		{5, 0, 5, maxInt64},                  // hi == d
		{4, maxU, 5, maxInt64},               // (5*2^64-1)/5 = 2^64-1 remainder 4
		{maxU - 1, maxU, maxU, maxInt64},     // the largest dividend Div64 accepts for d
		{1, 0, maxU, 2},                      // 2^64 / (2^64-1) = 1 remainder 1
		{maxInt64, 0, maxU, maxInt64},        // floor Max, remainder: ceil 2^63 saturates
		{1 << 30, 0, 1 << 31, maxInt64},      // 2^94 / 2^31 = 2^63: saturated
		{1 << 30, 0, 1 << 32, 1 << 62},       // 2^94 / 2^32 = 2^62 exactly
		{1 << 30, 1, 1 << 32, 1<<62 + 1},     // the same with a remainder
		{1<<31 - 1, maxU, 1 << 32, maxInt64}, // (2^95-1) / 2^32: floor Max, ceil 2^63
	}
	for _, c := range cases {
		got := policy.CeilDiv(c.hi, c.lo, c.d)
		assert.Equal(t, c.want, got, "ceilDiv(%d, %d, %d)", c.hi, c.lo, c.d)
		assert.Equal(t, bigCeilDiv(c.hi, c.lo, c.d), got, "ceilDiv(%d, %d, %d) vs big", c.hi, c.lo, c.d)
	}
}

// u128 returns hi<<64 | lo as a big.Int.
func u128(hi, lo uint64) *big.Int {
	x := new(big.Int).Lsh(new(big.Int).SetUint64(hi), 64)
	return x.Or(x, new(big.Int).SetUint64(lo))
}

// bigCeilDiv is ceil((hi<<64 | lo) / d) saturated at MaxInt64, in big.
func bigCeilDiv(hi, lo, d uint64) int64 {
	return saturate(ceilBig(u128(hi, lo), new(big.Int).SetUint64(d)))
}

func TestNewBucket(t *testing.T) {
	for _, l := range []policy.Limit{
		{Capacity: 1, TokensPerSecond: 1},
		{Capacity: 10, TokensPerSecond: 2},
		{Capacity: maxInt64, TokensPerSecond: maxInt64},
	} {
		for _, now := range []int64{t0, t500ms, tMax} {
			b := policy.NewBucket(l, now)
			require.Equal(t, policy.Bucket{Tokens: l.Capacity, Last: now}, b)
			require.True(t, b.Full(l))
			require.Zero(t, b.ResetAfter(l))
			require.Zero(t, b.RetryAfter(l, l.Capacity))
			requireSame(t, newModel(l, now), b)
		}
	}
}

// TestRefillNeverRunsBackwards checks the documented guard: a reading at or
// before Last changes nothing, not even Last.
func TestRefillNeverRunsBackwards(t *testing.T) {
	l := policy.Limit{Capacity: 10, TokensPerSecond: 2}
	start := policy.Bucket{Tokens: 3, Frac: 7, Last: t500ms, Epoch: 9}
	for _, now := range []int64{t500ms, t500ms - 1, t0, -1, math.MinInt64} {
		b := start
		b.Refill(l, now)
		require.Equal(t, start, b, "Refill(now=%d)", now)
	}
}

func TestTakeAndFull(t *testing.T) {
	l := policy.Limit{Capacity: 5, TokensPerSecond: 1}

	b := policy.Bucket{Tokens: 2, Frac: 999_999_999}
	require.False(t, b.Take(3), "2.999999999 tokens do not cover 3")
	require.Equal(t, policy.Bucket{Tokens: 2, Frac: 999_999_999}, b, "a denied Take changes nothing")
	require.True(t, b.Take(2))
	require.Equal(t, policy.Bucket{Tokens: 0, Frac: 999_999_999}, b, "Take keeps the fraction")
	require.False(t, b.Take(1))

	require.False(t, policy.Bucket{Tokens: 4, Frac: 999_999_999}.Full(l))
	require.True(t, policy.Bucket{Tokens: 5}.Full(l))
	require.True(t, policy.NewBucket(l, t0).Full(l))
}

// TestClamp: lowering a limit clamps the balance; raising it tops nobody up.
func TestClamp(t *testing.T) {
	cases := []struct {
		name     string
		b        policy.Bucket
		capacity int64
		want     policy.Bucket
	}{
		{"raise/full", policy.Bucket{Tokens: 10, Last: 5}, 20, policy.Bucket{Tokens: 10, Last: 5}},
		{"raise/partial", policy.Bucket{Tokens: 3, Frac: 4}, 20, policy.Bucket{Tokens: 3, Frac: 4}},
		{"raise/empty", policy.Bucket{}, maxInt64, policy.Bucket{}},
		{"same/full", policy.Bucket{Tokens: 10}, 10, policy.Bucket{Tokens: 10}},
		{"same/partial", policy.Bucket{Tokens: 9, Frac: 999_999_999}, 10, policy.Bucket{Tokens: 9, Frac: 999_999_999}},
		{"lower/full", policy.Bucket{Tokens: 10, Epoch: 2}, 4, policy.Bucket{Tokens: 4, Epoch: 2}},
		{"lower/fraction-dropped", policy.Bucket{Tokens: 7, Frac: 500}, 7, policy.Bucket{Tokens: 7}},
		{"lower/above-with-fraction", policy.Bucket{Tokens: 7, Frac: 500}, 3, policy.Bucket{Tokens: 3}},
		{"lower/below-new-capacity", policy.Bucket{Tokens: 2, Frac: 500}, 3, policy.Bucket{Tokens: 2, Frac: 500}},
		{"lower/max-to-1", policy.Bucket{Tokens: maxInt64}, 1, policy.Bucket{Tokens: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.b
			b.Clamp(c.capacity)
			require.Equal(t, c.want, b)
			got := unitsOf(b)
			require.LessOrEqual(t, got.Cmp(unitsOf(c.b)), 0, "Clamp never raises the balance")
			require.Zero(t, got.Cmp(bigMin(unitsOf(c.b), capUnits(policy.Limit{Capacity: c.capacity}))))
		})
	}
}

// TestCutover: the old rate earns up to the cutover instant only, the result
// is clamped to the new capacity, and raising capacity never tops up.
func TestCutover(t *testing.T) {
	cases := []struct {
		name      string
		old, next policy.Limit
		b         policy.Bucket
		at        int64
		want      policy.Bucket
	}{
		{
			name: "raise-capacity/full-stays-at-old-capacity",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: 2},
			next: policy.Limit{Capacity: 20, TokensPerSecond: 4},
			b:    policy.Bucket{Tokens: 10},
			at:   t500ms,
			want: policy.Bucket{Tokens: 10, Last: t500ms},
		},
		{
			name: "raise-capacity/old-rate-refills-only-to-old-capacity",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: 2},
			next: policy.Limit{Capacity: 20, TokensPerSecond: 4},
			b:    policy.Bucket{},
			at:   tMax,
			want: policy.Bucket{Tokens: 10, Last: tMax},
		},
		{
			name: "lower-capacity/clamps",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: 2},
			next: policy.Limit{Capacity: 4, TokensPerSecond: 2},
			b:    policy.Bucket{Tokens: 10},
			at:   t0,
			want: policy.Bucket{Tokens: 4, Last: t0},
		},
		{
			name: "lower-capacity/refill-then-clamp",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: 2},
			next: policy.Limit{Capacity: 4, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 3, Frac: 200_000_000},
			at:   t500ms, // +1 token at the old rate: 4.2, clamped to 4
			want: policy.Bucket{Tokens: 4, Last: t500ms},
		},
		{
			name: "lower-capacity/below-new-capacity-untouched",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: 2},
			next: policy.Limit{Capacity: 4, TokensPerSecond: 1},
			b:    policy.Bucket{Tokens: 1, Frac: 200_000_000},
			at:   t250ms, // +0.5 token at the old rate
			want: policy.Bucket{Tokens: 1, Frac: 700_000_000, Last: t250ms},
		},
		{
			name: "old-rate-earns-up-to-at",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: 2},
			next: policy.Limit{Capacity: 10, TokensPerSecond: maxInt64},
			b:    policy.Bucket{},
			at:   t500ms,
			want: policy.Bucket{Tokens: 1, Last: t500ms},
		},
		{
			name: "at=last/no-earning",
			old:  policy.Limit{Capacity: 10, TokensPerSecond: maxInt64},
			next: policy.Limit{Capacity: 20, TokensPerSecond: maxInt64},
			b:    policy.Bucket{Tokens: 2, Frac: 3, Last: t750ms, Epoch: 1},
			at:   t750ms,
			want: policy.Bucket{Tokens: 2, Frac: 3, Last: t750ms, Epoch: 1},
		},
		{
			name: "extremes",
			old:  policy.Limit{Capacity: maxInt64, TokensPerSecond: maxInt64},
			next: policy.Limit{Capacity: 1, TokensPerSecond: 1},
			b:    policy.Bucket{},
			at:   tMax,
			want: policy.Bucket{Tokens: 1, Last: tMax},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := modelOf(c.b)
			b := c.b
			b.Cutover(c.old, c.next, c.at)
			m.cutover(c.old, c.next, c.at)
			require.Equal(t, c.want, b)
			requireSame(t, m, b)
			requireValid(t, c.next, b)

			// From the cutover on, the new rate applies: check one more
			// step against the model.
			later := c.at + min(int64(time.Second), maxInt64-c.at)
			cost := min(int64(1), c.next.Capacity)
			require.Equal(t, m.decide(c.next, later, cost), b.Decide(c.next, later, cost))
			requireSame(t, m, b)
		})
	}
}

// TestCutoverNeverTopsUp: whatever the limits, the balance after a cutover is
// at most what the old limit alone would have given at that instant.
func TestCutoverNeverTopsUp(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 20_000 {
		old, b, now, _ := randomState(r)
		next := randomLimit(r)
		refilledOld := b
		refilledOld.Refill(old, now)
		got := b
		got.Cutover(old, next, now)
		require.LessOrEqual(t, unitsOf(got).Cmp(unitsOf(refilledOld)), 0,
			"seed %d iteration %d: Cutover(%+v, %+v, %d) of %+v gave %+v, more than %+v", seed, i, old, next, now, b, got, refilledOld)
		requireValid(t, next, got, "seed %d iteration %d", seed, i)
		m := modelOf(b)
		m.cutover(old, next, now)
		requireSame(t, m, got, "seed %d iteration %d: Cutover(%+v, %+v, %d) of %+v", seed, i, old, next, now, b)
	}
}

// TestBucketSize holds the record at 24 bytes: the engine keeps one per key,
// and MaxKeys may be large.
func TestBucketSize(t *testing.T) {
	require.Equal(t, uintptr(24), unsafe.Sizeof(policy.Bucket{}))
}

// TestCredit checks refunds against the math/big model: exact, capped at
// capacity, fractional credit kept.
func TestCredit(t *testing.T) {
	l := policy.Limit{Capacity: 10, TokensPerSecond: 3}
	for _, tc := range []struct {
		name   string
		b      policy.Bucket
		tokens int64
		want   policy.Bucket
	}{
		{"empty", policy.Bucket{Last: 5}, 4, policy.Bucket{Tokens: 4, Last: 5}},
		{"fraction kept", policy.Bucket{Tokens: 2, Frac: 999_999_999}, 7, policy.Bucket{Tokens: 9, Frac: 999_999_999}},
		{"to exactly full", policy.Bucket{Tokens: 3}, 7, policy.Bucket{Tokens: 10}},
		{"fraction past full is capped", policy.Bucket{Tokens: 9, Frac: 1}, 1, policy.Bucket{Tokens: 10}},
		{"far past full", policy.Bucket{Tokens: 9}, math.MaxInt64, policy.Bucket{Tokens: 10}},
		{"already full", policy.Bucket{Tokens: 10}, 1, policy.Bucket{Tokens: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			b.Credit(l, tc.tokens)
			assert.Equal(t, tc.want, b)
			// The model: units + tokens*1e9, capped at capacity*1e9.
			m := modelOf(tc.b)
			m.units.Add(m.units, costUnits(tc.tokens))
			if c := capUnits(l); m.units.Cmp(c) > 0 {
				m.units = c
			}
			requireSame(t, m, b)
		})
	}
}
