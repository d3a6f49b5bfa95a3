package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestConservation runs the conservation load briefly: once with room for
// every key, once with fewer slots than keys (ErrKeyCapacity on the way).
func TestConservation(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		keys, maxKeys, shards int
	}{
		{"keys=200/maxkeys=1e5/shards=4", 200, 100_000, 4},
		{"keys=300/maxkeys=150/shards=3", 300, 150, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := options{workers: 8, keys: tc.keys, maxKeys: tc.maxKeys, shards: tc.shards,
				cutoverEvery: 5 * time.Millisecond, sweepEvery: 20 * time.Millisecond, seed: uint64(time.Now().UnixNano())}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			c := &counters{}
			require.NoError(t, runConservation(ctx, o, c), "seed %d", o.seed)
			t.Logf("seed %d: %s", o.seed, c.line(2*time.Second, float64(c.decisions.Load())/2))
			assert.Positive(t, c.allowed.Load(), "allowed")
			assert.Positive(t, c.denied.Load(), "denied")
			assert.Positive(t, c.cutovers.Load(), "cutovers")
			assert.Positive(t, c.stale.Load(), "stale attempts refused")
			assert.Positive(t, c.evictions.Load(), "evictions")
			if tc.keys > tc.maxKeys {
				assert.Positive(t, c.errs[kindKeyCapacity].Load(), "ErrKeyCapacity")
			}
			assert.Positive(t, c.overridden.Load(), "decisions under an override")
			assert.Positive(t, c.multiBand.Load(), "decisions under several bands")
			assert.Positive(t, c.bandBound.Load(), "decisions a band beside the primary bound")
			assert.Positive(t, c.otherPeriod.Load(), "decisions under a rate not per second")
			assert.Positive(t, c.allAdmitted.Load(), "AllowAlls admitted, counted in their keys' totals")
			assert.Positive(t, c.allRefused.Load(), "AllowAlls refused")
			t.Logf("AllowAll: %d admitted, %d refused", c.allAdmitted.Load(), c.allRefused.Load())
		})
	}
}

func TestConservationCommand(t *testing.T) {
	var buf bytes.Buffer
	status := run(context.Background(), []string{"-check", "conservation", "-duration", "2s", "-seed", "7"}, &buf, &buf)
	require.Equal(t, 0, status, buf.String())
}

// ledgerStep is one fabricated step: a cutover or boundary, or a finalized
// segment of admissions checked at reading at.
type ledgerStep struct {
	cutover   *policy.Policy // installed over [at, until]
	until     int64
	boundary  bool
	finalize  []consAdmission
	at        int64
	violation bool
}

// TestConservationBound feeds the ledger fabricated histories: admissions
// exactly at the bound pass, one token more is a violation.
func TestConservationBound(t *testing.T) {
	const s = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	fast := policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1_000_000}
	slow := policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 1}
	rate5 := policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 5}
	raise := policy.Policy{Version: 2, Capacity: 30, TokensPerSecond: 1}
	lower := policy.Policy{Version: 2, Capacity: 4, TokensPerSecond: 1}
	fin := func(at int64, tokens int64, violation bool) ledgerStep {
		return ledgerStep{finalize: []consAdmission{{key: 0, tokens: tokens}, {key: 1, tokens: 1}}, at: at, violation: violation}
	}
	bnd := func(at int64) ledgerStep { return ledgerStep{boundary: true, at: at} }
	cut := func(next policy.Policy, at, until int64) ledgerStep {
		return ledgerStep{cutover: &next, at: at, until: until}
	}
	for _, tc := range []struct {
		name  string
		steps []ledgerStep
	}{
		{"burst=capacity", []ledgerStep{fin(0, 10, false)}},
		{"burst>capacity", []ledgerStep{fin(0, 11, true)}},
		{"refill", []ledgerStep{fin(0, 10, false), bnd(s), fin(s, 1, false), bnd(2 * s), fin(2*s, 1, false)}},
		{"refill+1", []ledgerStep{fin(0, 10, false), bnd(s), fin(s, 1, false), bnd(2 * s), fin(2*s, 2, true)}},
		{"half-second-refill", []ledgerStep{fin(0, 10, false), bnd(s / 2), fin(s/2, 1, true)}},
		// Over the window [1s, 2s] the rate is 1 or 5: the bound takes 5.
		{"window-max-rate", []ledgerStep{cut(rate5, s, 2*s), bnd(2 * s), fin(2*s, 16, false)}},
		{"window-max-rate+1", []ledgerStep{cut(rate5, s, 2*s), bnd(2 * s), fin(2*s, 17, true)}},
		// A raise may reach a key through eviction and recreation.
		{"raise", []ledgerStep{cut(raise, s, s), bnd(s), fin(s, 31, false)}},
		{"raise+1", []ledgerStep{cut(raise, s, s), bnd(s), fin(s, 32, true)}},
		// A lowering takes nothing back from what was granted before it.
		{"lower", []ledgerStep{cut(lower, s, s), bnd(s), fin(s, 11, false)}},
		{"lower+1", []ledgerStep{cut(lower, s, s), bnd(s), fin(s, 12, true)}},
		// A generous period (a huge rate, unused) does not hide an excess
		// after it: the window starting at 3s catches it.
		{"after-fast", []ledgerStep{fin(0, 10, false), cut(fast, s, s), cut(slow, 2*s, 3*s), bnd(3 * s), fin(4*s, 11, false)}},
		{"after-fast+1", []ledgerStep{fin(0, 10, false), cut(fast, s, s), cut(slow, 2*s, 3*s), bnd(3 * s), fin(4*s, 12, true)}},
		// Admissions attributed to segment 0 but finalized late count
		// against the credit up to the finalization reading.
		{"late-finalize", []ledgerStep{bnd(s), fin(2*s, 12, false)}},
		{"late-finalize+1", []ledgerStep{bnd(s), fin(2*s, 13, true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newConsLedger(p, []string{"hot", "cold"}, 1)
			seg := 0
			for i, st := range tc.steps {
				switch {
				case st.cutover != nil:
					l.cutover(st.at, st.until, *st.cutover)
				case st.boundary:
					l.boundary(st.at)
				default:
					v := l.finalize(seg, st.finalize, st.at)
					seg++
					if !st.violation {
						require.Nil(t, v, "step %d", i)
						continue
					}
					require.NotNil(t, v, "step %d", i)
					assert.Equal(t, "conservation", v.Check)
					assert.Equal(t, "hot", v.Key)
					t.Log(v.Error())
				}
			}
		})
	}
}

// TestConservationBoundLongRun: over 10,000 segments the ledger keeps a
// bounded number of boundaries per track (a long stress run's memory
// grew with its segments), and a violation whose window starts at the
// first boundary, long dropped, still names it. "hot" takes its capacity
// at 0 and then one token a second, its refill, so every window from
// boundary 1 on holds the same slack and the one from 0 the least; two
// tokens at the end pass the bound by one.
func TestConservationBoundLongRun(t *testing.T) {
	const s = int64(time.Second)
	const n = 10_000
	l := newConsLedger(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, []string{"hot", "cold"}, 1)
	require.Nil(t, l.finalize(0, []consAdmission{{key: 0, tokens: 10}}, 0))
	for g := 1; g < n; g++ {
		l.boundary(int64(g) * s)
		require.Nil(t, l.finalize(g, []consAdmission{{key: 0, tokens: 1}}, int64(g)*s), "segment %d", g)
	}
	tr := l.classes[0].tracks[0]
	assert.Less(t, len(tr.bounds), 200, "boundaries kept after %d segments", n)
	l.boundary(n * s)
	v := l.finalize(n, []consAdmission{{key: 0, tokens: 2}}, n*s)
	require.NotNil(t, v)
	assert.Contains(t, v.Op, "between readings 0s and 2h46m40s")
	assert.Contains(t, v.Want, "at most 10010 tokens")
	assert.Contains(t, v.Got, "10011 tokens admitted")
}

func TestConsCheckDecision(t *testing.T) {
	p := policy.Policy{Version: 4, Capacity: 10, TokensPerSecond: 3}
	for i, c := range []struct {
		d    engine.Decision
		cost int64
	}{
		{engine.Decision{Allowed: true, Remaining: 9, Version: 4, Limit: 10, ResetAfter: 333_333_334}, 1},
		{engine.Decision{Allowed: true, Remaining: 0, Version: 4, Limit: 10, ResetAfter: 3_333_333_334}, 10},
		{engine.Decision{Remaining: 0, RetryAfter: 333_333_334, Version: 4, Limit: 10, ResetAfter: 3_333_333_334}, 1},
		{engine.Decision{Remaining: 0, RetryAfter: 1, Version: 4, Limit: 10, ResetAfter: 3_000_000_001}, 1},
	} {
		assert.Empty(t, consCheckDecision(c.d, c.cost, p.Shape(), p.Version), "case %d", i)
	}
	for i, c := range []struct {
		d    engine.Decision
		cost int64
	}{
		{engine.Decision{Allowed: true, Remaining: 9, Version: 4, Limit: 11, ResetAfter: 333_333_334}, 1},             // Limit
		{engine.Decision{Remaining: 11, RetryAfter: 1, Version: 4, Limit: 10}, 1},                                     // Remaining > Limit
		{engine.Decision{Remaining: 0, RetryAfter: 333_333_335, Version: 4, Limit: 10, ResetAfter: 3_333_333_334}, 1}, // retry too long
		{engine.Decision{Remaining: 0, Version: 4, Limit: 10, ResetAfter: 3_333_333_334}, 1},                          // denied, no retry
		{engine.Decision{Allowed: true, Remaining: 9, RetryAfter: 5, Version: 4, Limit: 10, ResetAfter: 333_333_334}, 1},
		{engine.Decision{Allowed: true, Remaining: 9, Version: 4, Limit: 10, ResetAfter: 333_333_335}, 1},   // reset too long
		{engine.Decision{Allowed: true, Remaining: 8, Version: 4, Limit: 10, ResetAfter: 333_333_333}, 1},   // reset too short
		{engine.Decision{Allowed: true, Remaining: 10, Version: 4, Limit: 10}, 1},                           // full after admitting
		{engine.Decision{Remaining: 1, RetryAfter: 1, Version: 4, Limit: 10, ResetAfter: 3_000_000_001}, 1}, // denied with enough
		{engine.Decision{Remaining: 10, Version: 4, Limit: 10, RetryAfter: 1}, 1},                           // denied while full
		{engine.Decision{Allowed: true, Version: 4, Limit: 10, ResetAfter: 3_333_333_334}, 11},              // cost above capacity
	} {
		assert.NotEmpty(t, consCheckDecision(c.d, c.cost, p.Shape(), p.Version), "case %d: %+v", i, c.d)
	}
}

// TestConservationBoundPerKey: with overrides the bound is each key's own.
// "A1A" and "A2A" share the class A* selects; "hot" and "cold" keep the
// default.
func TestConservationBoundPerKey(t *testing.T) {
	const s = int64(time.Second)
	names := []string{"hot", "A1A", "A2A", "cold"}
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1,
		Overrides: mustOverrides(policy.Override{Match: "A*", Capacity: 3, TokensPerSecond: 2})}
	dropped := policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1} // A* back to the default: a raise of 7
	swapped := policy.Policy{Version: 2, Capacity: 3, TokensPerSecond: 2,  // the default and A* trade places
		Overrides: mustOverrides(policy.Override{Match: "A*", Capacity: 10, TokensPerSecond: 1})}
	for _, tc := range []struct {
		name       string
		cut        *policy.Policy // at 1s
		at         int64          // the one finalization
		a, hot     int64          // admitted to A1A, hot
		violation  bool
		violatorIs string
	}{
		{"own capacity", nil, 0, 3, 10, false, ""},
		{"own capacity+1", nil, 0, 4, 10, true, "A1A"},
		{"default capacity+1", nil, 0, 3, 11, true, "hot"},
		{"own rate", nil, 2 * s, 3 + 4, 10 + 2, false, ""},
		{"own rate+1", nil, 2 * s, 3 + 4 + 1, 10 + 2, true, "A1A"},
		{"override dropped: raise", &dropped, 2 * s, 3 + 2 + 7 + 1, 10 + 2, false, ""},
		{"override dropped: raise+1", &dropped, 2 * s, 3 + 2 + 7 + 1 + 1, 10 + 2, true, "A1A"},
		{"swapped", &swapped, 2 * s, 3 + 2 + 7 + 1, 10 + 1 + 2, false, ""},
		{"swapped+1", &swapped, 2 * s, 3 + 2 + 7 + 1, 10 + 1 + 2 + 1, true, "hot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newConsLedger(p, names, 1)
			require.Len(t, l.classes, 3, "hot, A, cold")
			if tc.cut != nil {
				l.cutover(s, s, *tc.cut)
			}
			v := l.finalize(0, []consAdmission{{key: 1, tokens: tc.a}, {key: 0, tokens: tc.hot}, {key: 2, tokens: 1}}, tc.at)
			if !tc.violation {
				require.Nil(t, v)
				return
			}
			require.NotNil(t, v)
			assert.Equal(t, tc.violatorIs, v.Key)
			t.Log(v.Error())
		})
	}
}

// TestConsClasses: every policy the check draws gives all keys of a class
// one limit, which the per-class bound relies on; and the draws do give
// some classes limits of their own.
func TestConsClasses(t *testing.T) {
	names := make([]string, 60)
	for i := range names {
		names[i] = consName(i)
	}
	assert.Equal(t, []string{"hot", "A1A", "B2B", "C3C", "D4D", "E5E", "A6A"}, names[:7])
	r := rand.New(rand.NewPCG(1, 2))
	overridden := map[string]int{}
	for i := range 500 {
		p := consInitial
		if i > 0 {
			p = consRandomPolicy(r, int64(i+1))
		}
		class := map[string]policy.Shape{}
		for _, k := range names {
			sh := shapeOf(p, k)
			c := consClassOf(k)
			if want, ok := class[c]; ok {
				require.Equal(t, want, sh, "policy %s: %s and the rest of class %s", policyText(p), k, c)
			}
			class[c] = sh
			if sh != p.Shape() {
				overridden[c]++
			}
		}
	}
	for _, c := range []string{"hot", "A", "B", "C", "D", "E"} {
		assert.Positive(t, overridden[c], "class %s never had a limit of its own", c)
	}
}
