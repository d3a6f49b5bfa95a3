package policy_test

import (
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// randomDebtLevel returns a valid level of l anywhere in [-capacity,
// capacity], a debt half the time, often at or near the floor.
func randomDebtLevel(r *rand.Rand, l policy.Limit) policy.Level {
	v := randomLevel(r, l)
	if r.IntN(2) == 0 {
		v.Tokens = -interesting(r, 1, l.Capacity)
		v.Frac = uint64(interesting(r, 0, period(l)-1))
	}
	return v
}

// ratCharged is the answer to a charge that left the bands of sh at xs:
// allowed, describing the band with the fewest whole tokens left, ties to
// the lowest index.
func ratCharged(sh policy.Shape, xs []*big.Rat) (policy.Outcome, int) {
	at := 0
	for i := range xs {
		if ratFloor(xs[i]) < ratFloor(xs[at]) {
			at = i
		}
	}
	return policy.Outcome{Allowed: true, Remaining: ratFloor(xs[at]), ResetAfter: ratWait(sh.Band(at), xs[at], sh.Band(at).Capacity)}, at
}

// TestChargeWorked pins charges worked by hand, each checked against the
// rational model too.
func TestChargeWorked(t *testing.T) {
	perSecond := policy.Limit{Capacity: 10, TokensPerSecond: 1}
	for _, c := range []struct {
		name  string
		l     policy.Limit
		from  policy.Level
		n     int64
		want  policy.Level
		reset int64 // ResetAfter afterwards
		retry int64 // RetryAfter(1) afterwards
	}{
		{"into debt", perSecond, policy.Level{Tokens: 6}, 12, policy.Level{Tokens: -6}, 16e9, 7e9},
		{"to the floor exactly", perSecond, policy.Level{Tokens: 10}, 20, policy.Level{Tokens: -10}, 20e9, 11e9},
		{"past the floor: forgiven", perSecond, policy.Level{Tokens: 10}, 25, policy.Level{Tokens: -10}, 20e9, 11e9},
		{"the fraction is kept", perSecond, policy.Level{Tokens: 0, Frac: 250_000_000}, 3, policy.Level{Tokens: -3, Frac: 250_000_000}, 12_750_000_000, 3_750_000_000},
		{"a fraction above the floor stays", perSecond, policy.Level{Tokens: 0, Frac: 1}, 10, policy.Level{Tokens: -10, Frac: 1}, 19_999_999_999, 10_999_999_999},
		{"one more is floored", perSecond, policy.Level{Tokens: 0, Frac: 1}, 11, policy.Level{Tokens: -10}, 20e9, 11e9},
		{"a debt deepened", perSecond, policy.Level{Tokens: -4, Frac: 5}, 5, policy.Level{Tokens: -9, Frac: 5}, 18_999_999_995, 9_999_999_995},
		{"the widest band", policy.Limit{Capacity: maxInt64, TokensPerSecond: maxInt64}, policy.Level{Tokens: maxInt64}, maxInt64, policy.Level{}, 1e9, 1_000_000_000/maxInt64 + 1},
		{"the widest band, twice", policy.Limit{Capacity: maxInt64, TokensPerSecond: maxInt64}, policy.Level{}, maxInt64, policy.Level{Tokens: -maxInt64}, 2e9, 1_000_000_001},
		{"the widest band, saturated", policy.Limit{Capacity: maxInt64, Refill: policy.Rate{Tokens: 1, Per: maxInt64}}, policy.Level{Tokens: -maxInt64 + 1, Frac: 7}, maxInt64, policy.Level{Tokens: -maxInt64}, math.MaxInt64, math.MaxInt64},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := c.from
			v.Charge(c.l, c.n)
			assert.Equal(t, c.want, v)
			assert.Equal(t, c.reset, v.ResetAfter(c.l), "ResetAfter")
			assert.Equal(t, c.retry, v.RetryAfter(c.l, 1), "RetryAfter(1)")
			assert.False(t, v.Full(c.l))
			requireLevel(t, c.l, ratCharge(c.l, ratOfLevel(c.l, c.from), c.n), v)
			assert.Equal(t, ratWait(c.l, ratOfLevel(c.l, v), c.l.Capacity), v.ResetAfter(c.l))
			assert.Equal(t, ratWait(c.l, ratOfLevel(c.l, v), 1), v.RetryAfter(c.l, 1))
		})
	}
}

// TestDebtRepaid: a refill repays a debt first, a credit repays it and
// stops at the capacity, and a bucket of the widest band comes back from
// its floor to full in one refill without overflowing.
func TestDebtRepaid(t *testing.T) {
	l := policy.Limit{Capacity: 10, TokensPerSecond: 1}
	v := policy.Level{Tokens: -6}
	v.Refill(l, 6_500_000_000)
	assert.Equal(t, policy.Level{Tokens: 0, Frac: 500_000_000}, v)
	v = policy.Level{Tokens: -6, Frac: 1}
	v.Credit(l, 3)
	assert.Equal(t, policy.Level{Tokens: -3, Frac: 1}, v)
	v.Credit(l, 13)
	assert.Equal(t, policy.Level{Tokens: 10}, v, "capped at the capacity")

	wide := policy.Limit{Capacity: maxInt64, TokensPerSecond: maxInt64}
	v = policy.Level{Tokens: -maxInt64}
	v.Refill(wide, 1e9)
	assert.Equal(t, policy.Level{Tokens: 0}, v, "one second repays a whole capacity")
	v = policy.Level{Tokens: -maxInt64}
	v.Refill(wide, maxInt64)
	assert.Equal(t, policy.Level{Tokens: maxInt64}, v)
	v = policy.Level{Tokens: -maxInt64}
	v.Credit(wide, maxInt64)
	assert.Equal(t, policy.Level{}, v)
	v = policy.Level{Tokens: -maxInt64, Frac: 3}
	v.Credit(wide, maxInt64)
	v.Credit(wide, maxInt64)
	assert.Equal(t, policy.Level{Tokens: maxInt64}, v)

	b := policy.Bucket{Tokens: -maxInt64, Frac: 999_999_999}
	b.Credit(wide, maxInt64)
	assert.Equal(t, int64(0), b.Tokens)
	assert.Equal(t, uint32(999_999_999), b.Frac)
	b.Credit(wide, maxInt64)
	assert.Equal(t, policy.Bucket{Tokens: maxInt64}, b)
}

// TestConvertDebt: a cutover keeps a debt, rounds it toward more debt when
// the period changes, and clamps it to the new floor if that is shallower.
func TestConvertDebt(t *testing.T) {
	sevenPer3s := policy.Limit{Capacity: 10, Refill: policy.Rate{Tokens: 7, Per: 3_000_000_000}}
	perSecond := policy.Limit{Capacity: 10, TokensPerSecond: 1}
	small := policy.Limit{Capacity: 4, TokensPerSecond: 1}

	// -3 + 1/3e9 tokens is -3 + a third of a unit at 1/s: floored to -3.
	v := policy.Level{Tokens: -3, Frac: 1}
	v.Convert(sevenPer3s, perSecond)
	assert.Equal(t, policy.Level{Tokens: -3}, v)
	// -0.5 + 1/3e9 at 1/s floors to -0.5 exactly plus nothing.
	v = policy.Level{Tokens: -1, Frac: 1_500_000_001}
	v.Convert(sevenPer3s, perSecond)
	assert.Equal(t, policy.Level{Tokens: -1, Frac: 500_000_000}, v)
	v = policy.Level{Tokens: -7, Frac: 5}
	v.Convert(perSecond, small)
	assert.Equal(t, policy.Level{Tokens: -4}, v, "clamped to the new floor")
	v = policy.Level{Tokens: -4, Frac: 5}
	v.Convert(perSecond, small)
	assert.Equal(t, policy.Level{Tokens: -4, Frac: 5}, v, "above the new floor: kept")
	v = policy.Level{Tokens: -3}
	v.Convert(small, perSecond)
	assert.Equal(t, policy.Level{Tokens: -3}, v, "a larger capacity keeps the debt as it is")

	b := policy.Bucket{Tokens: -7, Frac: 5, Last: 0}
	b.Cutover(perSecond, small, 0)
	assert.Equal(t, policy.Bucket{Tokens: -4}, b)
	b = policy.Bucket{Tokens: -7, Frac: 5, Last: 0}
	b.Cutover(perSecond, small, 2_000_000_000)
	assert.Equal(t, policy.Bucket{Tokens: -4, Last: 2_000_000_000}, b, "refilled under the old limit, then clamped")
	b = policy.Bucket{Tokens: -7, Frac: 5, Last: 0}
	b.Cutover(perSecond, small, 4_000_000_000)
	assert.Equal(t, policy.Bucket{Tokens: -3, Frac: 5, Last: 4_000_000_000}, b, "refilled above the new floor: kept")
}

// TestChargeLevelsWorked: the daily band of a two-band shape binds a
// charge that floors the primary.
func TestChargeLevelsWorked(t *testing.T) {
	sh := policy.Shape{Primary: policy.Limit{Capacity: 5, TokensPerSecond: 5},
		Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})}
	lv := []policy.Level{policy.FullLevel(sh.Band(0)), policy.FullLevel(sh.Band(1))}
	o, band := policy.ChargeLevels(sh, lv, 30)
	assert.Equal(t, []policy.Level{{Tokens: -5}, {Tokens: -10}}, lv)
	assert.Equal(t, 1, band)
	assert.Equal(t, policy.Outcome{Allowed: true, Remaining: -10, ResetAfter: 30 * 4320 * int64(time.Second)}, o)
	o, band = policy.DecideLevels(sh, lv, 1)
	assert.Equal(t, 1, band)
	assert.False(t, o.Allowed)
	assert.Equal(t, 47_520*int64(time.Second), o.RetryAfter)
	assert.Equal(t, []policy.Level{{Tokens: -5}, {Tokens: -10}}, lv, "a denial takes nothing")
}

// TestDebtLevelsMatchModelRandom runs random sequences of refills,
// decisions, charges, peeks, credits and cutovers, from balances in debt as
// often as not, over shapes of random bands (capacities and rates up to
// math.MaxInt64) against the rational model.
func TestDebtLevelsMatchModelRandom(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 3_000 {
		sh := randomShape(t, r)
		lv := make([]policy.Level, sh.Len())
		for j := range lv {
			lv[j] = randomDebtLevel(r, sh.Band(j))
		}
		xs := ratsOf(sh, lv)
		for step := range 10 {
			msg := []any{"seed %d iteration %d step %d: shape %+v bands %v levels %+v", seed, i, step, sh, sh.Bands.Bands(), slices.Clone(lv)}
			op := r.IntN(12)
			msg = append(msg, "op", op)
			switch {
			case op < 2:
				d := interesting(r, 0, maxInt64)
				policy.RefillLevels(sh, lv, d)
				for j := range xs {
					xs[j] = ratRefill(sh.Band(j), xs[j], d)
				}
			case op < 4:
				cost := interesting(r, 1, minCapacity(sh))
				got, band := policy.DecideLevels(sh, lv, cost)
				want, wantBand := ratDecide(sh, xs, cost, true)
				require.Equal(t, want, got, append(msg, "cost", cost)...)
				require.Equal(t, wantBand, band, append(msg, "cost", cost)...)
			case op < 7:
				n := interesting(r, 1, maxInt64)
				got, band := policy.ChargeLevels(sh, lv, n)
				for j := range xs {
					xs[j] = ratCharge(sh.Band(j), xs[j], n)
				}
				want, wantBand := ratCharged(sh, xs)
				require.Equal(t, want, got, append(msg, "charge", n)...)
				require.Equal(t, wantBand, band, append(msg, "charge", n)...)
			case op < 8:
				got, band := policy.PeekLevels(sh, lv)
				want, wantBand := ratDecide(sh, xs, 1, false)
				require.Equal(t, want, got, msg...)
				require.Equal(t, wantBand, band, msg...)
			case op < 9:
				// A wait for any cost, above the capacity too.
				j := r.IntN(len(lv))
				cost := interesting(r, 1, maxInt64)
				require.Equal(t, ratWait(sh.Band(j), xs[j], cost), lv[j].RetryAfter(sh.Band(j), cost), append(msg, "band", j, "cost", cost)...)
			case op < 10:
				n := interesting(r, 1, maxInt64)
				for j := range lv {
					lv[j].Credit(sh.Band(j), n)
					xs[j] = ratCredit(sh.Band(j), xs[j], n)
				}
			default:
				next := randomShape(t, r)
				out := make([]policy.Level, next.Len())
				policy.CutoverLevels(sh, lv, next, out)
				nx := make([]*big.Rat, next.Len())
				for j := range nx {
					nx[j] = ratTokens(next.Band(j).Capacity)
					if k := next.BandName(j); j == 0 {
						nx[j] = ratConvert(next.Band(0), xs[0])
					} else if o := sh.Bands.Index(k); o >= 0 {
						nx[j] = ratConvert(next.Band(j), xs[o+1])
					}
				}
				sh, lv, xs = next, out, nx
			}
			requireLevels(t, sh, xs, lv, msg...)
			full := true
			for j := range xs {
				full = full && xs[j].Cmp(ratTokens(sh.Band(j).Capacity)) == 0
				require.Equal(t, ratWait(sh.Band(j), xs[j], sh.Band(j).Capacity), lv[j].ResetAfter(sh.Band(j)), msg...)
			}
			require.Equal(t, full, policy.FullLevels(sh, lv), msg...)
		}
	}
}

// TestDebtBucketMatchesLevel: the compact Bucket, in debt, agrees with a
// Level of the same limit (checked against the model above) on every
// operation: refill, decide, charge, credit and cutover.
func TestDebtBucketMatchesLevel(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 5_000 {
		l := randomLimit(r)
		v := randomDebtLevel(r, l)
		b := policy.Bucket{Tokens: v.Tokens, Frac: uint32(v.Frac), Last: interesting(r, 0, maxInt64/2)}
		for step := range 10 {
			msg := []any{"seed %d iteration %d step %d: limit %+v bucket %+v", seed, i, step, l, b}
			now := b.Last + interesting(r, 0, (maxInt64-b.Last)/8)
			elapsed := now - b.Last
			switch op := r.IntN(5); op {
			case 0:
				cost := interesting(r, 1, l.Capacity)
				got := b.Decide(l, now, cost)
				v.Refill(l, elapsed)
				xs := []*big.Rat{ratOfLevel(l, v)}
				want, _ := policy.DecideLevels(policy.Shape{Primary: l}, []policy.Level{v}, cost)
				wantRat, _ := ratDecide(policy.Shape{Primary: l}, xs, cost, true)
				require.Equal(t, wantRat, want, msg...)
				require.Equal(t, want, got, msg...)
				if got.Allowed {
					v.Tokens -= cost
				}
			case 1:
				n := interesting(r, 1, maxInt64)
				got := b.Charge(l, now, n)
				v.Refill(l, elapsed)
				want, _ := policy.ChargeLevels(policy.Shape{Primary: l}, []policy.Level{v}, n)
				v.Charge(l, n)
				require.Equal(t, want, got, append(msg, "charge", n)...)
			case 2:
				n := interesting(r, 1, maxInt64)
				b.Refill(l, now)
				b.Credit(l, n)
				v.Refill(l, elapsed)
				v.Credit(l, n)
			case 3:
				next := randomLimit(r)
				b.Cutover(l, next, now)
				v.Refill(l, elapsed)
				v.Convert(l, next)
				l = next
			default:
				b.Refill(l, now)
				v.Refill(l, elapsed)
			}
			require.Equal(t, v, policy.LevelOf(b), msg...)
			require.GreaterOrEqual(t, b.Tokens, -l.Capacity, msg...)
			require.Equal(t, v.ResetAfter(l), b.ResetAfter(l), msg...)
			require.Equal(t, v.Full(l), b.Full(l), msg...)
		}
	}
}

// FuzzCharge checks a charge, then a refill, a wait and a credit, on any
// band and any balance in [-capacity, capacity], against the model.
func FuzzCharge(f *testing.F) {
	f.Add(int64(10), int64(1), int64(1e9), int64(6), uint64(0), int64(12), int64(7e9), int64(1), int64(3))
	const m = int64(maxInt64)
	f.Add(m, m, int64(1), -m, uint64(0), m, m, m, m)
	f.Add(m, int64(1), m, int64(0), uint64(1), m, int64(1), int64(2), int64(1))
	f.Fuzz(func(t *testing.T, capacity, n, per, tokens int64, frac uint64, charge, elapsed, cost, credit int64) {
		l := policy.Limit{Capacity: positive(capacity), Refill: policy.Rate{Tokens: positive(n), Per: time.Duration(positive(per))}}
		p := period(l)
		v := policy.Level{Tokens: max(-l.Capacity, min(tokens, l.Capacity)), Frac: frac % uint64(p)}
		if v.Tokens == l.Capacity {
			v.Frac = 0
		}
		x := ratOfLevel(l, v)
		charge, elapsed, cost, credit = positive(charge), nonNegative(elapsed), positive(cost), positive(credit)

		v.Charge(l, charge)
		x = ratCharge(l, x, charge)
		requireLevel(t, l, x, v, "charge")
		require.Equal(t, ratWait(l, x, cost), v.RetryAfter(l, cost))
		require.Equal(t, ratWait(l, x, l.Capacity), v.ResetAfter(l))
		v.Refill(l, elapsed)
		x = ratRefill(l, x, elapsed)
		requireLevel(t, l, x, v, "refill")
		v.Credit(l, credit)
		x = ratCredit(l, x, credit)
		requireLevel(t, l, x, v, "credit")
	})
}

// TestChargeAllocs: charging allocates nothing.
func TestChargeAllocs(t *testing.T) {
	sh := policy.Shape{Primary: policy.Limit{Capacity: 5, TokensPerSecond: 5},
		Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})}
	lv := []policy.Level{{Tokens: 5}, {Tokens: 20}}
	b := policy.NewBucket(sh.Primary, 0)
	var sink policy.Outcome
	allocs := testing.AllocsPerRun(100, func() {
		sink, _ = policy.ChargeLevels(sh, lv, 3)
		sink = b.Charge(sh.Primary, 1, 3)
	})
	assert.Zero(t, allocs)
	assert.True(t, sink.Allowed)
}
