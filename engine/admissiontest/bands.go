package admissiontest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Rates of any period and bands (policy.Rate, policy.BandSet): a token of a
// band refilled at N per P is P units, refilled elapsed*N units exactly; a
// request is decided over every band of its key at once; Decision.Band
// names the binding band, which Remaining, Limit and ResetAfter describe;
// a cutover matches bands by name. Every number below is worked out by
// hand in its comment.

var bandBehaviours = []behaviour{
	{"PerMinute", testPerMinute},
	{"DailyBand", testDailyBand},
	{"DailyBandAsBatches", testDailyBandAsBatches},
	{"EvictFullNeedsEveryBandFull", testEvictFullEveryBand},
	{"CutoverRaisingBandTopsNobodyUp", testCutoverRaisesBand},
	{"CutoverAddedBandStartsFull", testCutoverAddsBand},
	{"CutoverRemovedBandIsDropped", testCutoverRemovesBand},
	{"CutoverPeriodChangeRoundsDown", testCutoverPeriodChange},
	{"BindingBand", testBindingBand},
	{"OverrideNameAndBands", testOverrideNameAndBands},
	{"CostAboveAnyBand", testCostAboveAnyBand},
	{"PeekAndRefund", testPeekAndRefundBands},
	{"Random", testBandsDifferential},
}

// bandSet builds a BandSet, failing t if it is invalid (a bug in the suite).
func bandSet(t *testing.T, bs ...policy.Band) *policy.BandSet {
	t.Helper()
	set, err := policy.NewBands(bs...)
	require.NoError(t, err, "building the band set %+v", bs)
	return set
}

// inBand returns d with the binding band named band.
func inBand(d engine.Decision, band string) engine.Decision {
	d.Band = band
	return d
}

// dailyPolicy is the second worked example: capacity 5 at 5 per second and
// one band "daily" of capacity 20 at 20 per day, under version v.
func dailyPolicy(t *testing.T, v int64) policy.Policy {
	return policy.Policy{Version: v, Capacity: 5, TokensPerSecond: 5,
		Bands: bandSet(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})}
}

// testPerMinute: capacity 10 at 100 per minute. One token is 6e10 units and
// refill is 100 units per ns, so a token takes exactly 600ms.
func testPerMinute(t *testing.T, f Factory) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)}
	a, clk := newSubject(t, f, p)
	requirePolicy(t, p, a.Policy(), "Policy() of a policy given with Refill")
	for i := int64(1); i <= 10; i++ {
		expectAllow(t, a, "user", 1, allowed(10-i, p, 10, time.Duration(i)*600*time.Millisecond), fmt.Sprintf("t=0, request %d of 10", i))
	}
	expectAllow(t, a, "user", 1, denied(0, 600*time.Millisecond, p, 10, 6*time.Second), "t=0, the 11th request")
	// 1ns short of a token: 599,999,999ns x 100 = 59,999,999,900 units of
	// 6e10; full is 6e11, so 540,000,000,100 units, 5,400,000,001ns, short.
	clk.Set(600*ms - 1)
	expectAllow(t, a, "user", 1, denied(0, 1, p, 10, 5400000001), "t=600ms-1ns, 100 units short of a token")
	clk.Set(600 * ms)
	expectAllow(t, a, "user", 1, allowed(0, p, 10, 6*time.Second), "t=600ms, exactly one token refilled")

	// Capacity 1 at 100 per minute: one request per 600ms, none between.
	one := policy.Policy{Version: 1, Capacity: 1, Refill: policy.PerMinute(100)}
	b, clk := newSubject(t, f, one)
	expectAllow(t, b, "user", 1, allowed(0, one, 1, 600*time.Millisecond), "capacity 1, t=0")
	clk.Set(300 * ms)
	expectAllow(t, b, "user", 1, denied(0, 300*time.Millisecond, one, 1, 300*time.Millisecond), "capacity 1, t=300ms")
	clk.Set(600 * ms)
	expectAllow(t, b, "user", 1, allowed(0, one, 1, 600*time.Millisecond), "capacity 1, t=600ms")
}

// playDaily plays the second worked example on key up to the denial at
// t=4s: 5 admitted at each of t = 0, 1, 2 and 3 s (20 in all; the primary
// band refills to 5 every second, and binds each of them, with the fewest
// whole tokens, or a tie that goes to the primary), then the next is denied
// by "daily": it earned 4s x 20 = 8e10 units of a token of 8.64e13 units
// (one token per 4,320 s), so it lacks 86,320e9 units, 4,316 s at 20 units
// per ns, and 20 tokens less 4 s of refill, 86,396 s, to be full.
func playDaily(t *testing.T, a engine.Admitter, set func(int64), p policy.Policy, key string) {
	t.Helper()
	for s := range int64(4) {
		set(s * second)
		for j := int64(1); j <= 5; j++ {
			expectAllow(t, a, key, 1, allowed(5-j, p, 5, time.Duration(j)*200*time.Millisecond),
				fmt.Sprintf("t=%ds, request %d of 5", s, j))
		}
	}
	set(4 * second)
	expectAllow(t, a, key, 1, inBand(denied(0, 4316*time.Second, p, 20, 86396*time.Second), "daily"), "t=4s, daily is empty")
}

func testDailyBand(t *testing.T, f Factory) {
	p := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, p)
	requirePolicy(t, p, a.Policy(), "Policy() of a policy with bands")
	playDaily(t, a, clk.Set, p, "user")
	// A denial takes nothing from any band: the primary, full, still holds
	// its 5, and another key is untouched.
	expectAllow(t, a, "user", 1, inBand(denied(0, 4316*time.Second, p, 20, 86396*time.Second), "daily"), "t=4s, denied again")
	expectAllow(t, a, "other", 5, allowed(0, p, 5, time.Second), "t=4s, another key")
	// 4,316 s later daily holds exactly one token.
	clk.Set(4320 * second)
	expectAllow(t, a, "user", 1, inBand(allowed(0, p, 20, 86400*time.Second), "daily"), "t=4320s, one daily token")
}

// testDailyBandAsBatches plays the second example as one batch of 6 per
// second: the sixth request of each second is denied by the primary band,
// taking nothing, until t=4s, whose first request daily refuses.
func testDailyBandAsBatches(t *testing.T, f Factory) {
	p := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, p)
	reqs := make([]engine.Request, 6)
	for i := range reqs {
		reqs[i] = engine.Request{Key: "user", Cost: 1}
	}
	for s := range int64(4) {
		clk.Set(s * second)
		out := garbageOut(len(reqs))
		require.NoError(t, a.AllowBatch(t.Context(), reqs, out), "t=%ds", s)
		want := make([]engine.Result, 6)
		for j := range int64(5) {
			want[j] = engine.Result{Decision: allowed(4-j, p, 5, time.Duration(j+1)*200*time.Millisecond)}
		}
		// the primary lacks a token (200ms); daily holds 15-5s more (0 at 3s, a
		// wait of 4,320 s less the s earned, which is then the longest)
		want[5] = engine.Result{Decision: denied(0, 200*time.Millisecond, p, 5, time.Second)}
		if s == 3 {
			want[5] = engine.Result{Decision: inBand(denied(0, 4317*time.Second, p, 20, 86397*time.Second), "daily")}
		}
		require.Equal(t, want, out, "t=%ds, a batch of 6", s)
	}
	clk.Set(4 * second)
	out := garbageOut(1)
	require.NoError(t, a.AllowBatch(t.Context(), reqs[:1], out), "t=4s")
	require.Equal(t, engine.Result{Decision: inBand(denied(0, 4316*time.Second, p, 20, 86396*time.Second), "daily")}, out[0], "t=4s")
}

// testEvictFullEveryBand: a key is full, and may be evicted, only when
// every band is. One token from "daily" takes 4,320 s to come back, the
// primary's 200ms.
func testEvictFullEveryBand(t *testing.T, f Factory) {
	p := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, p)
	expectAllow(t, a, "user", 1, allowed(4, p, 5, 200*time.Millisecond), "t=0")
	clk.Set(second)
	mustEvict(t, a, 0, "t=1s, the primary is full and daily is not")
	clk.Set(4320*second - 1)
	mustEvict(t, a, 0, "t=4320s-1ns, daily is 20 units short")
	clk.Set(4320 * second)
	mustEvict(t, a, 1, "t=4320s, every band is full")
}

// testCutoverRaisesBand: at t=4s of the second example, "daily" goes to
// capacity 100 at 100 per day. It keeps its 8e10 units (the same period, a
// day, so the same unit) and gets nothing more: 86,320e9 units short of a
// token is 863.2 s at 100 units per ns, and 100 tokens less 8e10 units is
// 86,399.2 s. A key new after the cutover starts full at the new capacity.
func testCutoverRaisesBand(t *testing.T, f Factory) {
	v1 := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, v1)
	playDaily(t, a, clk.Set, v1, "user")
	v2 := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 5,
		Bands: bandSet(t, policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)})}
	mustReplace(t, a, v2, 1, "t=4s")
	expectAllow(t, a, "user", 1, inBand(denied(0, 863200*time.Millisecond, v2, 100, 86399200*time.Millisecond), "daily"),
		"t=4s, after the cutover: no top-up")
	// 20 requests at one instant: the primary is refilled at 5 per second,
	// so spread them over 4s; daily, new and full, gives 20 of its 100.
	for s := int64(4); s < 8; s++ {
		clk.Set(s * second)
		for j := int64(1); j <= 5; j++ {
			expectAllow(t, a, "newcomer", 1, allowed(5-j, v2, 5, time.Duration(j)*200*time.Millisecond), fmt.Sprintf("t=%ds, a new key", s))
		}
	}
}

// testCutoverAddsBand: capacity 5 at 5 per second, emptied at t=0; at 0.5s
// a cutover adds "daily" of capacity 2 at 2 per day (one token per
// 43,200 s). At 1s the primary has refilled to 5 and daily holds all of its
// 2: it starts full.
func testCutoverAddsBand(t *testing.T, f Factory) {
	v1 := pol(1, 5, 5)
	a, clk := newSubject(t, f, v1)
	expectAllow(t, a, "user", 5, allowed(0, v1, 5, time.Second), "t=0")
	clk.Set(500 * ms)
	v2 := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 5,
		Bands: bandSet(t, policy.Band{Name: "daily", Capacity: 2, Refill: policy.PerDay(2)})}
	mustReplace(t, a, v2, 1, "t=0.5s")
	clk.Set(second)
	expectAllow(t, a, "user", 1, inBand(allowed(1, v2, 2, 43200*time.Second), "daily"), "t=1s, the first daily token")
	expectAllow(t, a, "user", 1, inBand(allowed(0, v2, 2, 86400*time.Second), "daily"), "t=1s, the second daily token")
	expectAllow(t, a, "user", 1, inBand(denied(0, 43200*time.Second, v2, 2, 86400*time.Second), "daily"), "t=1s, daily is empty")
}

// testCutoverRemovesBand: at t=4s of the second example, daily (empty) is
// dropped: the primary, full, alone decides.
func testCutoverRemovesBand(t *testing.T, f Factory) {
	v1 := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, v1)
	playDaily(t, a, clk.Set, v1, "user")
	v2 := pol(2, 5, 5)
	mustReplace(t, a, v2, 1, "t=4s")
	expectAllow(t, a, "user", 1, allowed(4, v2, 5, 200*time.Millisecond), "t=4s, daily is gone")
}

// testCutoverPeriodChange: a band whose period changes moves its balance to
// the new unit rounding down, floor(units x Pnew / Pold), never up.
func testCutoverPeriodChange(t *testing.T, f Factory) {
	// The primary: capacity 1 at 1 per 3s, emptied at t=0, holds 2e9 of 3e9
	// units at 2s, when it moves to 1 per 2s: 2e9 x 2e9 / 3e9 =
	// 1,333,333,333.3 units, so 1,333,333,333, and 666,666,667ns to a token
	// (rounding up would say 666,666,666).
	v1 := policy.Policy{Version: 1, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 3 * time.Second}}
	a, clk := newSubject(t, f, v1)
	expectAllow(t, a, "user", 1, allowed(0, v1, 1, 3*time.Second), "t=0")
	clk.Set(2 * second)
	v2 := policy.Policy{Version: 2, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 2 * time.Second}}
	mustReplace(t, a, v2, 1, "t=2s")
	expectAllow(t, a, "user", 1, denied(0, 666666667, v2, 1, 666666667), "t=2s, the primary in its new unit")

	// A named band: at t=4s of the second example daily holds 8e10 units of
	// 8.64e13 and moves to 1 per 7s: 8e10 x 7e9 / 8.64e13 = 6,481,481.48
	// units, so 6,481,481, and 7e9 - 6,481,481 = 6,993,518,519ns to a token,
	// 20 x 7e9 - 6,481,481 to full.
	d1 := dailyPolicy(t, 1)
	b, clk := newSubject(t, f, d1)
	playDaily(t, b, clk.Set, d1, "user")
	d2 := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 5,
		Bands: bandSet(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.Rate{Tokens: 1, Per: 7 * time.Second}})}
	mustReplace(t, b, d2, 1, "t=4s")
	expectAllow(t, b, "user", 1, inBand(denied(0, 6993518519, d2, 20, 139993518519), "daily"), "t=4s, daily in its new unit")
}

// testBindingBand: when allowed, the band with the fewest whole tokens left
// binds; when denied, the one with the longest wait; ties go to the
// primary, then to the bands in order.
func testBindingBand(t *testing.T, f Factory) {
	// Three identical bands: every decision is a tie, won by the primary.
	same := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1, Bands: bandSet(t,
		policy.Band{Name: "x", Capacity: 3, Refill: policy.PerSecond(1)},
		policy.Band{Name: "y", Capacity: 3, Refill: policy.PerSecond(1)})}
	a, _ := newSubject(t, f, same)
	expectAllow(t, a, "k", 1, allowed(2, same, 3, time.Second), "a tie when allowed")
	expectAllow(t, a, "k", 2, allowed(0, same, 3, 3*time.Second), "a tie when allowed, emptied")
	expectAllow(t, a, "k", 1, denied(0, time.Second, same, 3, 3*time.Second), "a tie when denied")

	// x and y tie until y, refilled at half x's rate, waits longer.
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 10, Bands: bandSet(t,
		policy.Band{Name: "x", Capacity: 2, Refill: policy.PerSecond(1)},
		policy.Band{Name: "y", Capacity: 2, Refill: policy.Rate{Tokens: 1, Per: 2 * time.Second}})}
	b, clk := newSubject(t, f, p)
	expectAllow(t, b, "k", 1, inBand(allowed(1, p, 2, time.Second), "x"), "t=0: x and y hold 1, the primary 9")
	expectAllow(t, b, "k", 1, inBand(allowed(0, p, 2, 2*time.Second), "x"), "t=0: x and y hold 0")
	expectAllow(t, b, "k", 1, inBand(denied(0, 2*time.Second, p, 2, 4*time.Second), "y"), "t=0: x waits 1s, y 2s")
	clk.Set(second)
	expectAllow(t, b, "k", 1, inBand(denied(0, time.Second, p, 2, 3*time.Second), "y"), "t=1s: x holds 1, y half a token")
	clk.Set(2 * second)
	// x holds 2 (full), y 1, the primary 10: after the request y holds 0
	// and x 1, the primary 9.
	expectAllow(t, b, "k", 1, inBand(allowed(0, p, 2, 4*time.Second), "y"), "t=2s: y has the fewest tokens left")

	// The fewest whole tokens left binds, not the longest time to full.
	slow := policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 100,
		Bands: bandSet(t, policy.Band{Name: "slow", Capacity: 10, Refill: policy.PerHour(10)})}
	c, _ := newSubject(t, f, slow)
	expectAllow(t, c, "k", 1, allowed(1, slow, 2, 10*time.Millisecond), "the primary holds 1 of 2, slow 9 of 10")
}

// testOverrideNameAndBands: an override's limit is its own primary band,
// named by its Name, and its own bands; the policy's bands do not apply.
func testOverrideNameAndBands(t *testing.T, f Factory) {
	p := withOverrides(t, policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5,
		Bands: bandSet(t, policy.Band{Name: "hourly", Capacity: 6, Refill: policy.PerHour(6)})},
		policy.Override{Match: "gold:*", Name: "gold", Capacity: 10, Refill: policy.PerMinute(100),
			Bands: bandSet(t, policy.Band{Name: "daily", Capacity: 12, Refill: policy.PerDay(12)})})
	a, clk := newSubject(t, f, p)
	requirePolicy(t, p, a.Policy(), "Policy() with an override with bands")

	// The default: hourly (one token per 600 s) runs out at the sixth.
	for j := int64(1); j <= 5; j++ {
		expectAllow(t, a, "free", 1, allowed(5-j, p, 5, time.Duration(j)*200*time.Millisecond), "t=0, the default limit")
	}
	// gold: 10 at t=0 under its primary, hourly never consulted; then its
	// primary waits 600ms.
	for j := int64(1); j <= 10; j++ {
		expectAllow(t, a, "gold:1", 1, inBand(allowed(10-j, p, 10, time.Duration(j)*600*time.Millisecond), "gold"), "t=0, gold")
	}
	expectAllow(t, a, "gold:1", 1, inBand(denied(0, 600*time.Millisecond, p, 10, 6*time.Second), "gold"), "t=0, gold's primary is empty")

	clk.Set(second)
	// free: the primary is full, hourly holds 1 token and 6e9 units (1s x
	// 6): after the request 0 tokens, 3,599 s to full (6 tokens of 3.6e12
	// units less 6e9, at 6 units per ns), and the next waits 599 s.
	expectAllow(t, a, "free", 1, inBand(allowed(0, p, 6, 3599*time.Second), "hourly"), "t=1s, hourly's last token")
	expectAllow(t, a, "free", 1, inBand(denied(0, 599*time.Second, p, 6, 3599*time.Second), "hourly"), "t=1s, hourly is empty")

	clk.Set(6 * second)
	// gold's primary is full again (6s x 100 = 6e11 units = 10 tokens);
	// daily holds 2 tokens and 6s x 12 = 7.2e10 units of 8.64e13 (one token
	// per 7,200 s): a cost of 3 waits 8.64e13 - 7.2e10 units, 7,194 s, and
	// daily is 10 tokens less 6s of refill, 71,994 s, short of full.
	expectAllow(t, a, "gold:1", 3, inBand(denied(2, 7194*time.Second, p, 12, 71994*time.Second), "daily"), "t=6s, gold's daily")
}

// testCostAboveAnyBand: a cost above the capacity of any band of the key
// can never be admitted: ErrCostExceedsCapacity (an ErrInvalidCost), and
// nothing taken.
func testCostAboveAnyBand(t *testing.T, f Factory) {
	p := withOverrides(t, policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1,
		Bands: bandSet(t, policy.Band{Name: "small", Capacity: 3, Refill: policy.PerSecond(1)})},
		policy.Override{Match: "big", Capacity: 100, TokensPerSecond: 1,
			Bands: bandSet(t, policy.Band{Name: "tiny", Capacity: 1, Refill: policy.PerMinute(1)})})
	a, _ := newSubject(t, f, p)
	expectAllowErr(t, t.Context(), a, "k", 4, engine.ErrCostExceedsCapacity, "a cost above the band small's capacity")
	expectAllowErr(t, t.Context(), a, "k", 4, engine.ErrInvalidCost, "ErrCostExceedsCapacity is an ErrInvalidCost")
	expectAllowErr(t, t.Context(), a, "big", 2, engine.ErrCostExceedsCapacity, "a cost above the override's band tiny")
	reqs := []engine.Request{{Key: "k", Cost: 11}, {Key: "k", Cost: 4}, {Key: "k", Cost: 3}, {Key: "big", Cost: 100}, {Key: "big", Cost: 1}}
	out := garbageOut(len(reqs))
	require.NoError(t, a.AllowBatch(t.Context(), reqs, out), "AllowBatch")
	for i := range 2 {
		require.ErrorIs(t, out[i].Err, engine.ErrCostExceedsCapacity, "request %d", i)
		require.Zero(t, out[i].Decision, "request %d", i)
	}
	require.ErrorIs(t, out[3].Err, engine.ErrCostExceedsCapacity, "request 3")
	// nothing was taken by the refusals
	require.Equal(t, engine.Result{Decision: inBand(allowed(0, p, 3, 3*time.Second), "small")}, out[2], "request 2")
	require.Equal(t, engine.Result{Decision: inBand(allowed(0, p, 1, time.Minute), "tiny")}, out[4], "request 4")
}

// inspector is a subject with Peek and Refund (engine.Engine; a store may
// have them too): the Admitter interface does not include them.
type inspector interface {
	Peek(ctx context.Context, key string) (engine.Decision, error)
	Refund(ctx context.Context, key string, tokens int64) (engine.Decision, error)
}

// testPeekAndRefundBands: Peek answers a request of one token over every
// band, taking nothing and creating nothing; Refund credits every band,
// each capped at its capacity, and creates nothing.
func testPeekAndRefundBands(t *testing.T, f Factory) {
	p := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, p)
	in, ok := a.(inspector)
	if !ok {
		t.Skipf("the subject (%T) has no Peek and Refund", a)
	}
	peek := func(key string, want engine.Decision, what string) {
		t.Helper()
		d, err := in.Peek(t.Context(), key)
		require.NoError(t, err, "%s: Peek(%q)", what, key)
		require.Equal(t, want, d, "%s: Peek(%q)", what, key)
	}
	refund := func(key string, tokens int64, want engine.Decision, what string) {
		t.Helper()
		d, err := in.Refund(t.Context(), key, tokens)
		require.NoError(t, err, "%s: Refund(%q, %d)", what, key, tokens)
		require.Equal(t, want, d, "%s: Refund(%q, %d)", what, key, tokens)
	}
	// A key not tracked is full: the primary, 5 of 5, binds (daily has 20).
	fresh := allowed(5, p, 5, 0)
	peek("new", fresh, "t=0, an unknown key")
	refund("never", 3, fresh, "t=0, refunding an unknown key")
	mustEvict(t, a, 0, "t=0, Peek and Refund created no bucket")

	playDaily(t, a, clk.Set, p, "user")
	empty := inBand(denied(0, 4316*time.Second, p, 20, 86396*time.Second), "daily")
	peek("user", empty, "t=4s, daily is empty")
	peek("user", empty, "t=4s, a peek took nothing")
	// 2 back: daily holds 2 tokens and its 8e10 units, so 18 tokens less 8e10
	// units to full: 77,756 s; the primary stays at its capacity.
	refund("user", 2, inBand(allowed(2, p, 20, 77756*time.Second), "daily"), "t=4s, 2 refunded")
	// 100 back: every band is capped at its capacity, so the key is full.
	refund("user", 100, fresh, "t=4s, 100 refunded")
	mustEvict(t, a, 1, "t=4s, the refund filled every band, exactly")

	// Spent again, 20 tokens over 4 s, then refunded 20: daily at 20, not 40.
	for s := int64(5); s < 9; s++ {
		clk.Set(s * second)
		for j := int64(1); j <= 5; j++ {
			expectAllow(t, a, "user2", 1, allowed(5-j, p, 5, time.Duration(j)*200*time.Millisecond), fmt.Sprintf("t=%ds", s))
		}
	}
	clk.Set(9 * second)
	refund("user2", 20, fresh, "t=9s, 20 refunded")
	refund("user2", 20, fresh, "t=9s, 20 more refunded")
	for s := int64(9); s < 13; s++ {
		clk.Set(s * second)
		for j := int64(1); j <= 5; j++ {
			expectAllow(t, a, "user2", 1, allowed(5-j, p, 5, time.Duration(j)*200*time.Millisecond), fmt.Sprintf("t=%ds", s))
		}
	}
	clk.Set(13 * second)
	// daily earned 4s x 20 = 8e10 units since t=9s, when it was full
	expectAllow(t, a, "user2", 1, inBand(denied(0, 4316*time.Second, p, 20, 86396*time.Second), "daily"), "t=13s, daily held 20, not 40")
}

// Random policies with rates of awkward periods and bands, cut over to
// reshape, add, remove and rename bands, against the math/big model.

// bandRates are the refill rates the random band tests draw: awkward
// periods, the extremes of the int64 range, and plain rates per second.
var bandRates = []policy.Rate{
	{Tokens: 7, Per: 3 * time.Second},
	policy.PerDay(1),
	{Tokens: 1, Per: math.MaxInt64},
	{Tokens: math.MaxInt64, Per: 1},
	policy.PerMinute(100),
	policy.PerHour(1000),
	{Tokens: 3, Per: 7},
	{Tokens: 1, Per: 1<<32 + 1},
	{Tokens: 1, Per: 1 << 52},
	{Tokens: 1, Per: 1<<52 + 1},
	{Tokens: math.MaxInt64, Per: math.MaxInt64},
	policy.PerSecond(1),
	policy.PerSecond(5),
	policy.PerSecond(1000),
}

// bandNames are the names random bands get, so that cutovers keep some,
// drop some and add some.
var bandNames = []string{"burst", "daily", "a b", "x,y:z"}

func genRate(r *rand.Rand) policy.Rate {
	if r.IntN(4) == 0 {
		return policy.Rate{Tokens: genMagnitude(r), Per: time.Duration(genMagnitude(r))}
	}
	return bandRates[r.IntN(len(bandRates))]
}

// genBandCapacity draws a capacity, mostly small so bands run dry.
func genBandCapacity(r *rand.Rand) int64 {
	if r.IntN(3) == 0 {
		return genMagnitude(r)
	}
	return 1 + r.Int64N(20)
}

// genBands draws up to 3 bands over bandNames, nil a quarter of the time.
func genBands(t *testing.T, r *rand.Rand) *policy.BandSet {
	t.Helper()
	if r.IntN(4) == 0 {
		return nil
	}
	var bs []policy.Band
	for _, i := range r.Perm(len(bandNames))[:1+r.IntN(3)] {
		bs = append(bs, policy.Band{Name: bandNames[i], Capacity: genBandCapacity(r), Refill: genRate(r)})
	}
	return bandSet(t, bs...)
}

// genBandPolicy draws a valid policy newer than cur with a rate of any
// period (or per second), bands, and overrides with names, rates and bands
// of their own.
func genBandPolicy(t *testing.T, r *rand.Rand, cur policy.Policy) policy.Policy {
	t.Helper()
	p := policy.Policy{Version: cur.Version + 1 + r.Int64N(3), Capacity: genBandCapacity(r), Bands: genBands(t, r)}
	if r.IntN(3) == 0 {
		p.TokensPerSecond = genMagnitude(r)
	} else {
		p.Refill = genRate(r)
	}
	if r.IntN(2) == 0 {
		var os []policy.Override
		for k, i := range r.Perm(len(genMatches)) {
			if r.IntN(3) != 0 {
				continue
			}
			o := policy.Override{Match: genMatches[i], Capacity: genBandCapacity(r), Bands: genBands(t, r)}
			if r.IntN(2) == 0 {
				o.TokensPerSecond = genMagnitude(r)
			} else {
				o.Refill = genRate(r)
			}
			if r.IntN(2) == 0 {
				o.Name = fmt.Sprint("tier", k)
			}
			os = append(os, o)
		}
		p = withOverrides(t, p, os...)
	}
	return p
}

// Band differential runs: seeds, and operations per seed.
const bandOps = 250

var bandSeeds = []uint64{1, 2, 3, 4}

func testBandsDifferential(t *testing.T, f Factory) {
	for _, seed := range bandSeeds {
		name := fmt.Sprintf("seed=%d", seed)
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0xba4d5))
			w := newModelled(t, f, genBandPolicy(t, r, policy.Policy{}), "bands "+name)
			for range bandOps {
				switch p := r.IntN(100); {
				case p < 30:
					w.advance(genStep(r, r.IntN(3) == 0))
				case p < 65:
					key := genKey(r)
					w.allow(key, genCost(r, w.m.Policy(), key))
				case p < 80:
					w.batch(genBatch(r, w.m.Policy()), r.IntN(2))
				case p < 86:
					w.evict()
				default:
					w.cutover(genBandPolicy(t, r, w.m.Policy()))
				}
			}
			for _, key := range genKeys {
				w.allow(key, 1)
			}
		})
	}
}
