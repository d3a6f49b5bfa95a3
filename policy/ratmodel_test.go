package policy_test

import (
	"fmt"
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// This file holds the rational model of a band of any rate, the one the
// Level and Bucket arithmetic for rates of N tokens per P ns is checked
// against. It keeps a band's balance as a math/big.Rat number of tokens and
// is written straight from the definitions, with no units and no
// Tokens/Frac split, so it cannot share a representation bug with the code
// under test:
//
//	refill:     balance = min(capacity, balance + elapsed*N/P)
//	decide:     allowed iff balance >= cost, then balance -= cost
//	Remaining:  floor(balance)
//	RetryAfter: ceil((cost - balance) * P/N) ns, 0 if balance >= cost
//	ResetAfter: ceil((capacity - balance) * P/N) ns, 0 when full
//	Credit:     balance = min(capacity, balance + n)
//	Charge:     balance = max(-capacity, balance - n)
//	Convert:    balance = clamp(floor(balance*Pnext)/Pnext, -next capacity, next capacity)
//
// A balance may be negative, a debt, down to minus the capacity.
//
// Times saturate at math.MaxInt64.

// ratRate returns l's rate as N tokens per P ns, from the fields as the
// package doc defines them: TokensPerSecond n is n per 1e9 ns.
func ratRate(l policy.Limit) (n, p *big.Int) {
	if l.TokensPerSecond != 0 {
		return big.NewInt(l.TokensPerSecond), big.NewInt(1_000_000_000)
	}
	return big.NewInt(l.Refill.Tokens), big.NewInt(int64(l.Refill.Per))
}

// ratTokens returns n tokens as a Rat.
func ratTokens(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

// ratOfLevel converts a Level of l into tokens: Tokens + Frac/P.
func ratOfLevel(l policy.Limit, v policy.Level) *big.Rat {
	_, p := ratRate(l)
	r := new(big.Rat).SetFrac(new(big.Int).SetUint64(v.Frac), p)
	return r.Add(r, ratTokens(v.Tokens))
}

// levelOfRat converts a balance in tokens back to a Level of l: Tokens =
// floor(x), Frac = (x - Tokens)*P. It panics unless x is a whole number of
// l's units, with whole tokens that fit in int64; a debt has negative
// Tokens and 0 <= Frac < P.
func levelOfRat(l policy.Limit, x *big.Rat) policy.Level {
	_, p := ratRate(l)
	units := new(big.Rat).Mul(x, new(big.Rat).SetInt(p))
	if !units.IsInt() {
		panic(fmt.Sprintf("levelOfRat: %v tokens is not a whole number of 1/%v", x, p))
	}
	tokens, frac := new(big.Int).DivMod(units.Num(), p, new(big.Int)) // Euclidean: floor for p > 0
	if !tokens.IsInt64() {
		panic(fmt.Sprintf("levelOfRat: %v whole tokens overflow int64", tokens))
	}
	return policy.Level{Tokens: tokens.Int64(), Frac: frac.Uint64()}
}

// ratRefill returns min(capacity, x + elapsed*N/P) for elapsed >= 0.
func ratRefill(l policy.Limit, x *big.Rat, elapsed int64) *big.Rat {
	if elapsed < 0 {
		panic("ratRefill: negative elapsed")
	}
	n, p := ratRate(l)
	earned := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(elapsed), n), p)
	return ratMin(ratTokens(l.Capacity), new(big.Rat).Add(x, earned))
}

// ratWait returns ceil((target - x) * P/N) ns saturated, 0 if x >= target.
func ratWait(l policy.Limit, x *big.Rat, target int64) int64 {
	missing := new(big.Rat).Sub(ratTokens(target), x)
	if missing.Sign() <= 0 {
		return 0
	}
	n, p := ratRate(l)
	ns := missing.Mul(missing, new(big.Rat).SetFrac(p, n))
	return saturate(ratCeil(ns))
}

// ratFloor returns floor(x) as an int64.
func ratFloor(x *big.Rat) int64 {
	q := new(big.Int).Div(x.Num(), x.Denom()) // Euclidean division: floor, as Denom > 0
	if !q.IsInt64() {
		panic(fmt.Sprintf("ratFloor(%v)", x))
	}
	return q.Int64()
}

// ratCeil returns ceil(x) for x >= 0.
func ratCeil(x *big.Rat) *big.Int {
	q, r := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// ratConvert is a cutover's carry from old to next: the balance rounded
// down (toward more debt) to a whole number of next's units, then clamped
// to next's capacity and to its floor, minus that capacity.
func ratConvert(next policy.Limit, x *big.Rat) *big.Rat {
	_, p := ratRate(next)
	pr := new(big.Rat).SetInt(p)
	units := new(big.Rat).Mul(x, pr)
	floored := new(big.Int).Div(units.Num(), units.Denom())
	y := ratMin(ratTokens(next.Capacity), new(big.Rat).SetFrac(floored, p))
	return ratMax(ratFloorOf(next), y)
}

// ratCharge returns max(-capacity, x - n).
func ratCharge(l policy.Limit, x *big.Rat, n int64) *big.Rat {
	return ratMax(ratFloorOf(l), new(big.Rat).Sub(x, ratTokens(n)))
}

// ratFloorOf returns the deepest debt a band of l may hold: -capacity.
func ratFloorOf(l policy.Limit) *big.Rat { return ratTokens(-l.Capacity) }

func ratMax(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return new(big.Rat).Set(a)
	}
	return new(big.Rat).Set(b)
}

// ratCredit returns min(capacity, x + n).
func ratCredit(l policy.Limit, x *big.Rat, n int64) *big.Rat {
	return ratMin(ratTokens(l.Capacity), new(big.Rat).Add(x, ratTokens(n)))
}

func ratMin(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return new(big.Rat).Set(a)
	}
	return new(big.Rat).Set(b)
}

// ratDecide decides cost over every band of sh at once, xs[i] being band i
// refilled to the instant of the decision, as DecideLevels documents it:
// allowed only if every band holds cost, and then cost is taken from each;
// the binding band is, on a denial, the one with the longest wait (waits
// compared as reported, saturated), and when allowed the one with the
// fewest whole tokens left, ties to the lowest index. take false is a peek:
// it decides but takes nothing.
func ratDecide(sh policy.Shape, xs []*big.Rat, cost int64, take bool) (policy.Outcome, int) {
	c := ratTokens(cost)
	o := policy.Outcome{Allowed: true}
	for _, x := range xs {
		if x.Cmp(c) < 0 {
			o.Allowed = false
		}
	}
	if o.Allowed && take {
		for i := range xs {
			xs[i] = new(big.Rat).Sub(xs[i], c)
		}
	}
	at := 0
	for i := range xs {
		if o.Allowed {
			if ratFloor(xs[i]) < ratFloor(xs[at]) {
				at = i
			}
		} else if w := ratWait(sh.Band(i), xs[i], cost); w > o.RetryAfter {
			o.RetryAfter, at = w, i
		}
	}
	o.Remaining = ratFloor(xs[at])
	o.ResetAfter = ratWait(sh.Band(at), xs[at], sh.Band(at).Capacity)
	return o, at
}

// requireLevel fails unless v is a valid Level of l (-capacity <= Tokens
// <= capacity, Frac < P, Frac == 0 when full) whose balance is want.
func requireLevel(t testing.TB, l policy.Limit, want *big.Rat, v policy.Level, msgAndArgs ...any) {
	t.Helper()
	_, p := ratRate(l)
	require.GreaterOrEqual(t, v.Tokens, -l.Capacity, msgAndArgs...)
	require.LessOrEqual(t, v.Tokens, l.Capacity, msgAndArgs...)
	require.Less(t, new(big.Int).SetUint64(v.Frac).Cmp(p), 0, msgAndArgs...)
	if v.Tokens == l.Capacity {
		require.Zero(t, v.Frac, msgAndArgs...)
	}
	require.Zero(t, want.Cmp(ratOfLevel(l, v)), append([]any{"balance %v tokens, want %v: "}, msgAndArgs...)...)
}

// TestRatModelSelfCheck pins the model's helpers on values worked by hand,
// so a bug in them cannot hide one in the code under test.
func TestRatModelSelfCheck(t *testing.T) {
	sevenPer3s := policy.Limit{Capacity: 10, Refill: policy.Rate{Tokens: 7, Per: 3_000_000_000}}
	perSecond := policy.Limit{Capacity: 10, TokensPerSecond: 2}

	// One unit of 7 per 3 s is 1/3e9 of a token.
	require.Equal(t, "1/3000000000", ratOfLevel(sevenPer3s, policy.Level{Frac: 1}).RatString())
	require.Equal(t, "7/2", ratOfLevel(perSecond, policy.Level{Tokens: 3, Frac: 500_000_000}).RatString())
	for _, v := range []policy.Level{{}, {Tokens: 10}, {Tokens: 3, Frac: 2_999_999_999}, {Frac: 1}} {
		require.Equal(t, v, levelOfRat(sevenPer3s, ratOfLevel(sevenPer3s, v)))
	}
	require.Panics(t, func() { levelOfRat(perSecond, big.NewRat(1, 3)) }, "a third is no whole number of 1e9 units")
	// A debt: Tokens is the floor, Frac counts up from it.
	require.Equal(t, policy.Level{Tokens: -3, Frac: 750_000_000}, levelOfRat(perSecond, big.NewRat(-9, 4)))
	require.Equal(t, policy.Level{Tokens: -1}, levelOfRat(perSecond, big.NewRat(-1, 1)))

	// 1 s at 7 per 3 s is 7/3 tokens; 10 s fills capacity 10 from empty
	// only at 30/7 s, so it clamps.
	require.Equal(t, "7/3", ratRefill(sevenPer3s, new(big.Rat), 1_000_000_000).RatString())
	require.Equal(t, "10", ratRefill(sevenPer3s, new(big.Rat), 10_000_000_000).RatString())
	// From empty, 1 token at 7 per 3 s takes ceil(3e9/7) = 428571429 ns.
	require.Equal(t, int64(428_571_429), ratWait(sevenPer3s, new(big.Rat), 1))
	require.Equal(t, int64(0), ratWait(sevenPer3s, ratTokens(1), 1))
	huge := policy.Limit{Capacity: maxInt64, Refill: policy.Rate{Tokens: 1, Per: maxInt64}}
	require.Equal(t, int64(math.MaxInt64), ratWait(huge, new(big.Rat), 1), "exactly MaxInt64")
	require.Equal(t, int64(math.MaxInt64), ratWait(huge, new(big.Rat), 2), "saturated")
	require.Equal(t, int64(math.MaxInt64-1), ratWait(huge, levelRat(huge, 0, 1), 1))

	require.Equal(t, int64(3), ratFloor(big.NewRat(7, 2)))
	require.Equal(t, int64(0), ratFloor(big.NewRat(1, 3)))
	require.Equal(t, int64(-1), ratFloor(big.NewRat(-1, 3)))
	require.Equal(t, int64(-3), ratFloor(big.NewRat(-3, 1)))
	require.Equal(t, "4", ratCeil(big.NewRat(7, 2)).String())
	require.Equal(t, "3", ratCeil(big.NewRat(3, 1)).String())

	// 1/3e9 token (one unit at 7 per 3 s) is a third of a unit at 1/s:
	// floored to nothing. 1/2 token moves exactly.
	require.Equal(t, "0", ratConvert(perSecond, big.NewRat(1, 3_000_000_000)).RatString())
	require.Equal(t, "1/2", ratConvert(perSecond, big.NewRat(1, 2)).RatString())
	require.Equal(t, "10", ratConvert(perSecond, ratTokens(11)).RatString(), "clamped")
	require.Equal(t, "10", ratCredit(perSecond, big.NewRat(19, 2), 1).RatString())
	// A debt converts toward more debt and is clamped to the new floor.
	require.Equal(t, "-1/1000000000", ratConvert(perSecond, big.NewRat(-1, 3_000_000_000)).RatString())
	require.Equal(t, "-10", ratConvert(perSecond, ratTokens(-11)).RatString(), "clamped to the floor")
	require.Equal(t, "-10", ratCharge(perSecond, ratTokens(2), 25).RatString(), "floored")
	require.Equal(t, "-5/2", ratCharge(perSecond, big.NewRat(1, 2), 3).RatString())
	// From -2 tokens at 2 per second, 1 token takes 1.5 s.
	require.Equal(t, int64(1_500_000_000), ratWait(perSecond, ratTokens(-2), 1))
}

// levelRat returns the balance tokens + frac/P of a band of l.
func levelRat(l policy.Limit, tokens int64, frac uint64) *big.Rat {
	return ratOfLevel(l, policy.Level{Tokens: tokens, Frac: frac})
}
