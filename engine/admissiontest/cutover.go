package admissiontest

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// ReplacePolicy's errors and guarantees (package engine's doc, section
// Policy cutover), apart from the worked example, which is in examples.go.

var cutoverBehaviours = []behaviour{
	{"InvalidNext", testInvalidNext},
	{"Stale", testStale},
	{"ConcurrentSameExpectedVersion", testConcurrentReplace},
	{"NewPolicyEverywhere", testNewPolicyEverywhere},
	{"RaisingCapacityTopsNobodyUp", testNoTopUp},
	{"LoweringCapacityClamps", testLoweringClamps},
	{"RateChangesAtTheCutover", testRateChange},
	{"MaxVersion", testMaxVersion},
}

// cutCurrent is the policy in force in the error tables: version 3, so that
// both older and newer versions exist.
var cutCurrent = pol(3, 10, 2)

// cutSubject serves cutCurrent with "k" holding 7 tokens at 1s, and leaves
// the clock there.
func cutSubject(t *testing.T, f Factory) engine.Admitter {
	t.Helper()
	a, clk := newSubject(t, f, cutCurrent)
	clk.Set(second)
	expectAllow(t, a, "k", 3, allowed(7, cutCurrent, 10, 1500*time.Millisecond), "setup at 1s")
	return a
}

// requireNoCutover proves that failed ReplacePolicy calls changed nothing:
// the policy is cutCurrent, "k" still holds 7 tokens under it, new keys start
// at its capacity, and a correct cutover from version 3 still goes through.
func requireNoCutover(t *testing.T, a engine.Admitter, what string) {
	t.Helper()
	requirePolicy(t, cutCurrent, a.Policy(), "%s: Policy()", what)
	expectAllow(t, a, "k", 1, allowed(6, cutCurrent, 10, 2*time.Second), what+": \"k\" under the old policy")
	expectAllow(t, a, "fresh", 10, allowed(0, cutCurrent, 10, 5*time.Second), what+": a new key under the old policy")
	next := pol(4, 20, 4)
	mustReplace(t, a, next, cutCurrent.Version, what+": a correct cutover afterwards")
	expectAllow(t, a, "k", 1, allowed(5, next, 20, 3750*time.Millisecond), what+": \"k\" under the new policy")
}

// testInvalidNext: an invalid next is ErrInvalidPolicy, even when it is also
// stale (Version 0 is both).
func testInvalidNext(t *testing.T, f Factory) {
	a := cutSubject(t, f)
	for _, tc := range []struct {
		name     string
		next     policy.Policy
		expected int64
	}{
		{"version 0", pol(0, 20, 4), 3},
		{"version 0 with a wrong expectedVersion", pol(0, 20, 4), 7},
		{"version -1", pol(-1, 20, 4), 3},
		{"version MinInt64", pol(math.MinInt64, 20, 4), 3},
		{"capacity 0", pol(4, 0, 4), 3},
		{"capacity -1", pol(4, -1, 4), 3},
		{"rate 0", pol(4, 20, 0), 3},
		{"rate MinInt64", pol(4, 20, math.MinInt64), 3},
		{"zero policy", policy.Policy{}, 3},
		{"invalid and stale", pol(2, 0, 4), 2},
	} {
		err := a.ReplacePolicy(t.Context(), tc.next, tc.expected)
		require.ErrorIs(t, err, engine.ErrInvalidPolicy, "%s: ReplacePolicy(%+v, %d)", tc.name, tc.next, tc.expected)
		require.ErrorIs(t, err, policy.ErrInvalid, "%s: ErrInvalidPolicy is policy.ErrInvalid", tc.name)
	}
	requireNoCutover(t, a, "after invalid policies")
}

// testStale: expectedVersion must be the current version and next.Version
// above it, so two operators racing from the same view cannot both win.
func testStale(t *testing.T, f Factory) {
	a := cutSubject(t, f)
	for _, tc := range []struct {
		name     string
		next     policy.Policy
		expected int64
	}{
		{"expectedVersion below current", pol(4, 20, 4), 2},
		{"expectedVersion above current", pol(5, 20, 4), 4},
		{"expectedVersion 0", pol(4, 20, 4), 0},
		{"expectedVersion -1", pol(4, 20, 4), -1},
		{"next version equals current", pol(3, 20, 4), 3},
		{"next version equals current, same policy", cutCurrent, 3},
		{"next version below current", pol(2, 20, 4), 3},
		{"next version 1", pol(1, 20, 4), 3},
	} {
		err := a.ReplacePolicy(t.Context(), tc.next, tc.expected)
		require.ErrorIs(t, err, engine.ErrStalePolicy, "%s: ReplacePolicy(%+v, %d)", tc.name, tc.next, tc.expected)
	}
	requireNoCutover(t, a, "after stale policies")
}

// testConcurrentReplace races ReplacePolicy calls with the same
// expectedVersion and different next versions: exactly one succeeds, the
// others are ErrStalePolicy, and the winner's policy is in force.
func testConcurrentReplace(t *testing.T, f Factory) {
	const racers, rounds = 8, 3
	a, _ := newSubject(t, f, pol(1, 10, 1))
	for round := range rounds {
		cur := a.Policy()
		nexts := make([]policy.Policy, racers)
		for i := range nexts {
			nexts[i] = pol(cur.Version+1+int64(i), 10+int64(i), 1+int64(i))
		}
		errs := make([]error, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start // released together for the tightest race
				errs[i] = a.ReplacePolicy(t.Context(), nexts[i], cur.Version)
			})
		}
		close(start)
		wg.Wait() // orders every errs[i] write before the reads below

		winner := -1
		for i, err := range errs {
			switch {
			case err == nil:
				require.Equal(t, -1, winner, "round %d: two ReplacePolicy calls with expectedVersion %d succeeded, racers %d and %d",
					round, cur.Version, winner, i)
				winner = i
			case errors.Is(err, engine.ErrStalePolicy):
			default:
				require.FailNow(t, "unexpected error", "round %d racer %d: ReplacePolicy(%+v, %d) = %v, want nil or ErrStalePolicy",
					round, i, nexts[i], cur.Version, err)
			}
		}
		require.NotEqual(t, -1, winner, "round %d: none of the racing ReplacePolicy calls succeeded", round)
		w := nexts[winner]
		requirePolicy(t, w, a.Policy(), "round %d: Policy() after the race", round)
		d := mustAllow(t, a, "probe", 1, "after the race")
		require.Equal(t, []int64{w.Version, w.Capacity}, []int64{d.Version, d.Limit},
			"round %d: Version and Limit of a call after the race, want the winner's", round)
	}
}

// testNewPolicyEverywhere: once ReplacePolicy has returned, every call, on
// old keys and new, single or batched, reports the new version and limit.
func testNewPolicyEverywhere(t *testing.T, f Factory) {
	const keys = 24 // enough to land on every shard of a sharded subject
	a, clk := newSubject(t, f, pol(1, 10, 2))
	name := func(i int) string { return "key-" + string(rune('a'+i)) }
	for i := range keys {
		mustAllow(t, a, name(i), 1+int64(i%10), "before the cutover")
	}
	clk.Set(100 * ms)
	next := pol(7, 30, 5) // versions need not be consecutive
	mustReplace(t, a, next, 1, "t=0.1s")
	for i := range keys {
		d := mustAllow(t, a, name(i), 1, "after the cutover")
		require.Equal(t, []int64{next.Version, next.Capacity}, []int64{d.Version, d.Limit},
			"Version and Limit of an old key after the cutover")
	}
	reqs := make([]engine.Request, 0, 2*keys)
	for i := range keys {
		reqs = append(reqs, engine.Request{Key: name(i), Cost: 1}, engine.Request{Key: "new-" + name(i), Cost: 30})
	}
	out := garbageOut(len(reqs))
	require.NoError(t, a.AllowBatch(t.Context(), reqs, out), "AllowBatch after the cutover")
	for i, r := range out {
		require.NoError(t, r.Err, "AllowBatch after the cutover: out[%d] for %+v", i, reqs[i])
		require.Equal(t, []int64{next.Version, next.Capacity}, []int64{r.Decision.Version, r.Decision.Limit},
			"AllowBatch after the cutover: Version and Limit of out[%d] for %+v", i, reqs[i])
	}
}

// testNoTopUp: a full bucket under capacity 10 holds 10 tokens, not 20,
// after a cutover to capacity 20.
func testNoTopUp(t *testing.T, f Factory) {
	a, clk := newSubject(t, f, pol(1, 10, 2))
	expectAllow(t, a, "full", 1, allowed(9, pol(1, 10, 2), 10, 500*time.Millisecond), "t=0")
	clk.Set(second) // "full" is full again
	next := pol(2, 20, 4)
	mustReplace(t, a, next, 1, "t=1s")
	// 10 tokens, not 20: 9 left, 11 missing at 4/s.
	expectAllow(t, a, "full", 1, allowed(9, next, 20, 2750*time.Millisecond), "t=1s after raising the capacity")
	expectAllow(t, a, "untouched", 20, allowed(0, next, 20, 5*time.Second), "a new key gets the new capacity")
}

// testLoweringClamps: a balance above the new capacity is cut to it at the
// cutover, and refills from there at the new rate.
func testLoweringClamps(t *testing.T, f Factory) {
	a, clk := newSubject(t, f, pol(1, 20, 4))
	expectAllow(t, a, "high", 1, allowed(19, pol(1, 20, 4), 20, 250*time.Millisecond), "t=0")
	expectAllow(t, a, "low", 18, allowed(2, pol(1, 20, 4), 20, 4500*time.Millisecond), "t=0")
	clk.Set(250 * ms) // high: 19.25 -> full at 20 by 0.25s; low: 3
	next := pol(2, 5, 1)
	mustReplace(t, a, next, 1, "t=0.25s")
	expectAllow(t, a, "high", 5, allowed(0, next, 5, 5*time.Second), "t=0.25s, clamped to 5")
	expectAllow(t, a, "low", 4, denied(3, time.Second, next, 5, 2*time.Second), "t=0.25s, 3 tokens kept")
	clk.Set(1250 * ms)
	expectAllow(t, a, "low", 4, allowed(0, next, 5, 5*time.Second), "t=1.25s, one more token at 1/s")
}

// testRateChange: the old rate earns up to the cutover instant, the new rate
// after it, to the nanosecond.
func testRateChange(t *testing.T, f Factory) {
	a, clk := newSubject(t, f, pol(1, 100, 3))
	expectAllow(t, a, "k", 100, allowed(0, pol(1, 100, 3), 100, 33_333_333_334), "t=0")
	clk.Set(second + 1) // 3 tokens and 3 units under 3/s
	next := pol(2, 100, 7)
	mustReplace(t, a, next, 1, "t=1s+1ns")
	clk.Set(2 * second) // plus 999,999,999ns at 7/s: 7e9 - 7 units
	// Balance 3e9 + 3 + 7e9 - 7 = 10e9 - 4 units: 9 whole tokens, 4 units
	// short of 10, which take ceil(4/7) = 1ns; full after
	// ceil((90e9+4)/7) ns.
	expectAllow(t, a, "k", 10, denied(9, 1, next, 100, 12_857_142_858), "t=2s, old rate then new rate")
	clk.Set(2*second + 1)
	expectAllow(t, a, "k", 10, allowed(0, next, 100, 14_285_714_286), "t=2s+1ns, 3 units to spare")
}

// testMaxVersion: math.MaxInt64 is a legal version, after which nothing is
// newer.
func testMaxVersion(t *testing.T, f Factory) {
	a, _ := newSubject(t, f, pol(1, 10, 2))
	top := pol(math.MaxInt64, 10, 2)
	mustReplace(t, a, top, 1, "to version MaxInt64")
	expectAllow(t, a, "k", 1, allowed(9, top, 10, 500*time.Millisecond), "under version MaxInt64")
	err := a.ReplacePolicy(t.Context(), pol(math.MaxInt64, 20, 4), math.MaxInt64)
	require.ErrorIs(t, err, engine.ErrStalePolicy, "a second policy of version MaxInt64")
	requirePolicy(t, top, a.Policy(), "after the refused cutover")
}
