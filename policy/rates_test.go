package policy_test

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// rateLimit returns a limit of capacity tokens refilled at tokens per per.
func rateLimit(capacity, tokens int64, per time.Duration) policy.Limit {
	return policy.Limit{Capacity: capacity, Refill: policy.Rate{Tokens: tokens, Per: per}}
}

// awkwardLimits are rates that no whole number per second can express, or
// that sit at the edges of the arithmetic, each at small and extreme
// capacities.
func awkwardLimits() map[string]policy.Limit {
	out := map[string]policy.Limit{}
	for _, r := range []struct {
		name string
		rate policy.Rate
	}{
		{"7/3s", policy.Rate{Tokens: 7, Per: 3 * time.Second}},
		{"1/day", policy.PerDay(1)},
		{"1/MaxInt64ns", policy.Rate{Tokens: 1, Per: maxInt64}},
		{"MaxInt64/1ns", policy.Rate{Tokens: maxInt64, Per: 1}},
		{"MaxInt64/MaxInt64ns", policy.Rate{Tokens: maxInt64, Per: maxInt64}},
		{"100/minute", policy.PerMinute(100)},
		{"1000/hour", policy.PerHour(1000)},
		{"3/s as Refill", policy.PerSecond(3)},
		{"1/2^32ns (compact edge)", policy.Rate{Tokens: 1, Per: 1 << 32}},
		{"1/(2^32+1)ns (past it)", policy.Rate{Tokens: 1, Per: 1<<32 + 1}},
		{"(2^63-1)/(2^32)ns", policy.Rate{Tokens: maxInt64, Per: 1 << 32}},
	} {
		for _, c := range []int64{1, 2, 10, 1 << 40, maxInt64} {
			out[fmt.Sprintf("%s/capacity=%d", r.name, c)] = policy.Limit{Capacity: c, Refill: r.rate}
		}
	}
	out["100/minute/capacity=1"] = rateLimit(1, 100, time.Minute)
	out["3/s as TokensPerSecond"] = policy.Limit{Capacity: 10, TokensPerSecond: 3}
	out["MaxInt64/s as TokensPerSecond"] = policy.Limit{Capacity: maxInt64, TokensPerSecond: maxInt64}
	return out
}

// period returns P of l's rate as an int64.
func period(l policy.Limit) int64 {
	_, p := ratRate(l)
	return p.Int64()
}

// levelsFor returns hand-picked and random valid levels of l: empty, full,
// one unit, one unit short of a token, one unit short of full, and some
// drawn by interesting.
func levelsFor(r *rand.Rand, l policy.Limit) []policy.Level {
	p := uint64(period(l))
	out := []policy.Level{
		{},
		{Tokens: l.Capacity},
		{Frac: min(1, p-1)},
		{Frac: p - 1},
		{Tokens: l.Capacity - 1, Frac: p - 1},
		{Tokens: l.Capacity - 1},
		{Tokens: l.Capacity / 2, Frac: p / 2},
	}
	for range 12 {
		out = append(out, randomLevel(r, l))
	}
	return out
}

// randomLevel returns a valid level of l.
func randomLevel(r *rand.Rand, l policy.Limit) policy.Level {
	v := policy.Level{Tokens: interesting(r, 0, l.Capacity), Frac: uint64(interesting(r, 0, period(l)-1))}
	if v.Tokens == l.Capacity {
		v.Frac = 0
	}
	return v
}

// elapsedFor returns instants that matter for l: none, one ns, about a
// unit, a token's worth either side of it, a period, and extremes.
func elapsedFor(r *rand.Rand, l policy.Limit) []int64 {
	n, p := ratRate(l)
	token := ratCeil(new(big.Rat).SetFrac(p, n)) // ns to earn one token
	tok := saturate(token)
	out := []int64{0, 1, 2, tok - 1, tok, satAdd(tok, 1), period(l) - 1, period(l), maxInt64 / 2, maxInt64}
	for range 6 {
		out = append(out, interesting(r, 0, maxInt64))
	}
	return out
}

// costsFor returns costs in [1, capacity] that matter for l.
func costsFor(r *rand.Rand, l policy.Limit) []int64 {
	return []int64{1, min(2, l.Capacity), l.Capacity, max(1, l.Capacity-1), interesting(r, 1, l.Capacity)}
}

// TestRatesRefillMatchModel: Level.Refill over awkward rates equals the
// rational model, and so do RetryAfter (ceiling), ResetAfter (ceiling),
// Full and the whole tokens Remaining (floor).
func TestRatesRefillMatchModel(t *testing.T) {
	r, seed := newRand(t)
	for name, l := range awkwardLimits() {
		t.Run(name, func(t *testing.T) {
			for _, v0 := range levelsFor(r, l) {
				for _, d := range elapsedFor(r, l) {
					msg := []any{"seed %d: limit %+v level %+v refilled by %d", seed, l, v0, d}
					v := v0
					v.Refill(l, d)
					want := ratRefill(l, ratOfLevel(l, v0), d)
					requireLevel(t, l, want, v, msg...)
					require.Equal(t, ratFloor(want), v.Tokens, msg...)
					require.Equal(t, want.Cmp(ratTokens(l.Capacity)) == 0, v.Full(l), msg...)
					require.Equal(t, ratWait(l, want, l.Capacity), v.ResetAfter(l), msg...)
					for _, c := range costsFor(r, l) {
						require.Equal(t, ratWait(l, want, c), v.RetryAfter(l, c), append(msg, "cost", c)...)
					}
				}
			}
		})
	}
}

// TestRatesBucketAgreesWithLevel: for every compact limit (period up to
// 2^32 ns) the 24-byte Bucket and the Level give the same balance and the
// same answers, both the model's, through Refill, Decide and the estimates.
func TestRatesBucketAgreesWithLevel(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	compact := 0
	for name, l := range awkwardLimits() {
		require.Equal(t, period(l) <= 1<<32, l.Compact(), name)
		if !l.Compact() {
			continue
		}
		compact++
		t.Run(name, func(t *testing.T) {
			sh := policy.Shape{Primary: l}
			require.True(t, sh.Compact())
			for _, v0 := range levelsFor(r, l) {
				last := interesting(r, 0, maxInt64)
				for _, d := range elapsedFor(r, l) {
					now := satAdd(last, d)
					for _, c := range costsFor(r, l) {
						msg := []any{"seed %d: limit %+v level %+v last %d now %d cost %d", seed, l, v0, last, now, c}
						b := policy.Bucket{Tokens: v0.Tokens, Frac: uint32(v0.Frac), Last: last, Epoch: 7, Limit: 3}
						require.Equal(t, v0, policy.LevelOf(b), msg...)
						require.Equal(t, v0.RetryAfter(l, c), b.RetryAfter(l, c), msg...)
						require.Equal(t, v0.ResetAfter(l), b.ResetAfter(l), msg...)

						refilled := b
						refilled.Refill(l, now)
						v := v0
						v.Refill(l, now-last)
						require.Equal(t, v, policy.LevelOf(refilled), msg...)
						require.Equal(t, now, refilled.Last, msg...)

						got := b.Decide(l, now, c)
						lv := []policy.Level{v}
						want, band := policy.DecideLevels(sh, lv, c)
						require.Equal(t, 0, band, msg...)
						require.Equal(t, want, got, msg...)
						require.Equal(t, lv[0], policy.LevelOf(b), msg...)
						require.Equal(t, policy.Bucket{Tokens: b.Tokens, Frac: b.Frac, Last: now, Epoch: 7, Limit: 3}, b, msg...)

						xs := []*big.Rat{ratRefill(l, ratOfLevel(l, v0), now-last)}
						model, _ := ratDecide(sh, xs, c, true)
						require.Equal(t, model, got, msg...)
						requireLevel(t, l, xs[0], policy.LevelOf(b), msg...)
					}
				}
			}
		})
	}
	require.Greater(t, compact, 10, "the table has compact limits")
}

// TestRatesPerSecondIsRefillPerSecond: TokensPerSecond n and Refill
// PerSecond(n) are the same limit, bit for bit, in a Bucket and a Level.
func TestRatesPerSecondIsRefillPerSecond(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 20_000 {
		tps := randomLimit(r)
		refill := policy.Limit{Capacity: tps.Capacity, Refill: policy.PerSecond(tps.TokensPerSecond)}
		require.Equal(t, tps.Rate(), refill.Rate())
		require.Equal(t, policy.Rate{Tokens: tps.TokensPerSecond, Per: time.Second}, tps.Rate())
		_, b, now, cost := randomState(r)
		b.Tokens = min(b.Tokens, tps.Capacity)
		if b.Tokens == tps.Capacity {
			b.Frac = 0
		}
		cost = min(cost, tps.Capacity)
		msg := []any{"seed %d iteration %d: %+v, %+v, now %d cost %d", seed, i, tps, b, now, cost}
		b1, b2 := b, b
		require.Equal(t, b1.Decide(tps, now, cost), b2.Decide(refill, now, cost), msg...)
		require.Equal(t, b1, b2, msg...)
		v1, v2 := policy.LevelOf(b), policy.LevelOf(b)
		v1.Refill(tps, now-b.Last)
		v2.Refill(refill, now-b.Last)
		require.Equal(t, v1, v2, msg...)
		b3 := b
		b3.Refill(refill, now)
		require.Equal(t, v1, policy.LevelOf(b3), msg...)
	}
}

// TestRatesSaturate: waits that do not fit in int64 ns are MaxInt64, and
// those just below it are exact.
func TestRatesSaturate(t *testing.T) {
	slowest := rateLimit(maxInt64, 1, maxInt64) // 1 token per MaxInt64 ns
	fastest := rateLimit(maxInt64, maxInt64, 1) // MaxInt64 tokens per ns
	daily := rateLimit(maxInt64, 1, 24*time.Hour)
	for _, tc := range []struct {
		name      string
		l         policy.Limit
		v         policy.Level
		cost      int64
		retry     int64
		reset     int64
		refillBy  int64
		refilled  policy.Level
		remaining int64
	}{
		{"1/MaxInt64ns empty, cost 1: exactly MaxInt64", slowest, policy.Level{}, 1, maxInt64, maxInt64, maxInt64, policy.Level{Tokens: 1}, 1},
		{"1/MaxInt64ns one unit in: MaxInt64-1", slowest, policy.Level{Frac: 1}, 1, maxInt64 - 1, maxInt64, maxInt64 - 1, policy.Level{Tokens: 1}, 1},
		{"1/MaxInt64ns, cost 2: 2*MaxInt64, saturated", slowest, policy.Level{}, 2, maxInt64, maxInt64, 1, policy.Level{Frac: 1}, 0},
		{"1/MaxInt64ns, capacity-1 short of full", slowest, policy.Level{Tokens: 1}, maxInt64, maxInt64, maxInt64, 0, policy.Level{Tokens: 1}, 1},
		{"MaxInt64/ns empty: a token in 1 ns", fastest, policy.Level{}, 1, 1, 1, 1, policy.Level{Tokens: maxInt64}, maxInt64},
		{"MaxInt64/ns, cost MaxInt64: 1 ns", fastest, policy.Level{}, maxInt64, 1, 1, 0, policy.Level{}, 0},
		{"1/day, capacity MaxInt64: saturated", daily, policy.Level{}, 1, int64(24 * time.Hour), maxInt64, maxInt64, policy.Level{Tokens: 106_751, Frac: 85_636_854_775_807}, 106_751},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := ratOfLevel(tc.l, tc.v)
			assert.Equal(t, tc.retry, tc.v.RetryAfter(tc.l, tc.cost), "RetryAfter")
			assert.Equal(t, ratWait(tc.l, x, tc.cost), tc.v.RetryAfter(tc.l, tc.cost), "RetryAfter, model")
			assert.Equal(t, tc.reset, tc.v.ResetAfter(tc.l), "ResetAfter")
			assert.Equal(t, ratWait(tc.l, x, tc.l.Capacity), tc.v.ResetAfter(tc.l), "ResetAfter, model")
			v := tc.v
			v.Refill(tc.l, tc.refillBy)
			assert.Equal(t, tc.refilled, v, "Refill")
			requireLevel(t, tc.l, ratRefill(tc.l, x, tc.refillBy), v)
			assert.Equal(t, tc.remaining, v.Tokens)
		})
	}
}

// TestRatesCredit: a refund is exact and capped at capacity, and keeps the
// fraction, at any rate.
func TestRatesCredit(t *testing.T) {
	r, seed := newRand(t)
	for name, l := range awkwardLimits() {
		t.Run(name, func(t *testing.T) {
			for _, v0 := range levelsFor(r, l) {
				for _, n := range []int64{1, 2, l.Capacity - v0.Tokens, l.Capacity, maxInt64, interesting(r, 1, maxInt64)} {
					if n < 1 {
						continue
					}
					v := v0
					v.Credit(l, n)
					requireLevel(t, l, ratCredit(l, ratOfLevel(l, v0), n), v, "seed %d: %+v credited %d", seed, v0, n)
					if n < l.Capacity-v0.Tokens {
						require.Equal(t, v0.Frac, v.Frac, "the fraction is kept")
					}
					if l.Compact() {
						b := policy.Bucket{Tokens: v0.Tokens, Frac: uint32(v0.Frac)}
						b.Credit(l, n)
						require.Equal(t, v, policy.LevelOf(b), "Bucket.Credit agrees")
					}
				}
			}
		})
	}
}

// TestRatesConvert: a cutover's carry from one shape to another (Level.Convert,
// and Bucket.Cutover where both are compact) floors the balance to the new
// unit and clamps it to the new capacity: it may lose part of a unit, never
// mint one. Hand-worked cases first, then every pair of awkward limits.
func TestRatesConvert(t *testing.T) {
	skipUnderRace(t)
	sevenPer3s := rateLimit(10, 7, 3*time.Second)
	for _, tc := range []struct {
		name       string
		old, next  policy.Limit
		v, want    policy.Level
		wantTokens string // the balance after, in tokens
	}{
		{"half a token 3s -> 1m: exact", sevenPer3s, rateLimit(10, 100, time.Minute),
			policy.Level{Tokens: 2, Frac: 1_500_000_000}, policy.Level{Tokens: 2, Frac: 30_000_000_000}, "5/2"},
		{"one unit 3s -> 1s: a third of a unit lost", sevenPer3s, policy.Limit{Capacity: 10, TokensPerSecond: 5},
			policy.Level{Tokens: 4, Frac: 1}, policy.Level{Tokens: 4}, "4"},
		{"two units 3s -> 1s: floor(2/3) = 0", sevenPer3s, policy.Limit{Capacity: 10, TokensPerSecond: 5},
			policy.Level{Frac: 2}, policy.Level{}, "0"},
		{"three units 3s -> 1s: exactly one", sevenPer3s, policy.Limit{Capacity: 10, TokensPerSecond: 5},
			policy.Level{Frac: 3}, policy.Level{Frac: 1}, "1/1000000000"},
		{"1s -> 3s: exact, 3 units per unit", policy.Limit{Capacity: 10, TokensPerSecond: 5}, sevenPer3s,
			policy.Level{Tokens: 1, Frac: 1}, policy.Level{Tokens: 1, Frac: 3}, "1000000001/1000000000"},
		{"same period: untouched", sevenPer3s, rateLimit(20, 1, 3*time.Second),
			policy.Level{Tokens: 9, Frac: 2_999_999_999}, policy.Level{Tokens: 9, Frac: 2_999_999_999}, "29999999999/3000000000"},
		{"clamped, fraction dropped", sevenPer3s, rateLimit(3, 1, time.Hour),
			policy.Level{Tokens: 3, Frac: 5}, policy.Level{Tokens: 3}, "3"},
		{"raised capacity: no top-up", sevenPer3s, rateLimit(100, 1, time.Hour),
			policy.Level{Tokens: 10}, policy.Level{Tokens: 10}, "10"},
		{"MaxInt64 ns -> 1 ns: all but the whole tokens lost", rateLimit(5, 1, maxInt64), rateLimit(5, 1, 1),
			policy.Level{Tokens: 1, Frac: maxInt64 - 1}, policy.Level{Tokens: 1}, "1"},
		{"1 ns -> MaxInt64 ns: nothing to lose", rateLimit(5, 1, 1), rateLimit(5, 1, maxInt64),
			policy.Level{Tokens: 2}, policy.Level{Tokens: 2}, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.v
			v.Convert(tc.old, tc.next)
			assert.Equal(t, tc.want, v)
			assert.Equal(t, tc.wantTokens, ratOfLevel(tc.next, v).RatString())
			requireLevel(t, tc.next, ratConvert(tc.next, ratOfLevel(tc.old, tc.v)), v)
		})
	}

	r, seed := newRand(t)
	limits := awkwardLimits()
	for oldName, old := range limits {
		for nextName, next := range limits {
			for _, v0 := range levelsFor(r, old)[:9] {
				msg := []any{"seed %d: %s -> %s of %+v", seed, oldName, nextName, v0}
				before := ratOfLevel(old, v0)
				v := v0
				v.Convert(old, next)
				requireLevel(t, next, ratConvert(next, before), v, msg...)
				require.LessOrEqual(t, ratOfLevel(next, v).Cmp(before), 0, msg...)
				if old.Compact() && next.Compact() {
					// Bucket.Cutover is Refill under old, then this carry.
					b := policy.Bucket{Tokens: v0.Tokens, Frac: uint32(v0.Frac), Last: 5}
					at := satAdd(5, interesting(r, 0, maxInt64))
					b.Cutover(old, next, at)
					w := v0
					w.Refill(old, at-5)
					w.Convert(old, next)
					require.Equal(t, w, policy.LevelOf(b), msg...)
					require.Equal(t, at, b.Last, msg...)
				}
			}
		}
	}
}

// TestRatesWindowSeconds: the "w" of RateLimit-Policy is ceil(capacity x
// Per / Tokens) seconds, saturated, by hand and against the model.
func TestRatesWindowSeconds(t *testing.T) {
	for _, tc := range []struct {
		rate     policy.Rate
		capacity int64
		want     int64
	}{
		{policy.PerMinute(100), 10, 6},
		{policy.PerMinute(100), 1, 1}, // 0.6 s, rounded up
		{policy.PerMinute(100), 100, 60},
		{policy.PerDay(20), 20, 86_400},
		{policy.PerSecond(5), 5, 1},
		{policy.PerSecond(2), 10, 5},
		{policy.PerSecond(3), 10, 4},                          // 3.33 s
		{policy.PerSecond(maxInt64), 1, 1},                    // a fraction of a ns, still 1 s
		{policy.Rate{Tokens: 7, Per: 3 * time.Second}, 10, 5}, // 30/7 = 4.29 s
		{policy.Rate{Tokens: 1, Per: maxInt64}, 1, 9_223_372_037},
		{policy.Rate{Tokens: 1, Per: maxInt64}, maxInt64, maxInt64},
		{policy.PerSecond(1), maxInt64, maxInt64},
		{policy.Rate{Tokens: maxInt64, Per: maxInt64}, maxInt64, 9_223_372_037},
		{policy.Rate{Tokens: maxInt64, Per: 1}, maxInt64, 1},
		// capacity x Per = 2^65-1: the first step's ceiling, 2^64, carries
		// into the high word.
		{policy.Rate{Tokens: 2, Per: 31}, 1_190_112_520_884_487_201, 18_446_744_074},
	} {
		name := fmt.Sprintf("%v/capacity=%d", tc.rate, tc.capacity)
		got := tc.rate.WindowSeconds(tc.capacity)
		assert.Equal(t, tc.want, got, name)
		assert.Equal(t, windowModel(tc.rate, tc.capacity), got, name)
	}
	r, seed := newRand(t)
	for i := range 20_000 {
		rate := policy.Rate{Tokens: interesting(r, 1, maxInt64), Per: time.Duration(interesting(r, 1, maxInt64))}
		c := interesting(r, 1, maxInt64)
		require.Equal(t, windowModel(rate, c), rate.WindowSeconds(c), "seed %d iteration %d: %v capacity %d", seed, i, rate, c)
	}
}

func windowModel(rate policy.Rate, capacity int64) int64 {
	x := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(capacity), big.NewInt(int64(rate.Per))), big.NewInt(rate.Tokens))
	return saturate(ratCeil(x.Quo(x, big.NewRat(1_000_000_000, 1))))
}

// TestRatesHelpers: the constructors, IsZero and String.
func TestRatesHelpers(t *testing.T) {
	assert.Equal(t, policy.Rate{Tokens: 3, Per: time.Second}, policy.PerSecond(3))
	assert.Equal(t, policy.Rate{Tokens: 100, Per: time.Minute}, policy.PerMinute(100))
	assert.Equal(t, policy.Rate{Tokens: 1000, Per: time.Hour}, policy.PerHour(1000))
	assert.Equal(t, policy.Rate{Tokens: 20, Per: 24 * time.Hour}, policy.PerDay(20))
	assert.True(t, policy.Rate{}.IsZero())
	assert.False(t, policy.Rate{Per: 1}.IsZero())
	assert.False(t, policy.Rate{Tokens: 1}.IsZero())
	assert.Equal(t, "100/1m0s", policy.PerMinute(100).String())
	assert.Equal(t, int64(math.MaxInt64), int64(policy.Rate{Tokens: maxInt64, Per: 1}.Tokens))
}
