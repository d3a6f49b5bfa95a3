package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestConservationBoundBands feeds the ledger fabricated histories with
// bands: each band bounds the key on its own, at its own rate of any
// period, and across cutovers a kept band carries on (raises counted, the
// faster rate over the cutover window), a new band bounds only windows
// that start after it exists, and a dropped one bounds nothing after.
// Admissions exactly at the bound pass, one token more is a violation.
func TestConservationBoundBands(t *testing.T) {
	const s = int64(time.Second)
	day := policy.PerDay
	band := func(name string, capacity int64, r policy.Rate) *policy.BandSet {
		return mustBands(policy.Band{Name: name, Capacity: capacity, Refill: r})
	}
	pol := func(v int64, bands *policy.BandSet) policy.Policy {
		return policy.Policy{Version: v, Capacity: 100, TokensPerSecond: 100, Bands: bands}
	}
	daily2 := pol(1, band("daily", 2, day(2)))
	plain := pol(1, nil)
	fin := func(at int64, tokens int64, violation bool) ledgerStep {
		return ledgerStep{finalize: []consAdmission{{key: 0, tokens: tokens}, {key: 1, tokens: 1}}, at: at, violation: violation}
	}
	bnd := func(at int64) ledgerStep { return ledgerStep{boundary: true, at: at} }
	cut := func(next policy.Policy, at, until int64) ledgerStep {
		return ledgerStep{cutover: &next, at: at, until: until}
	}
	sevenPer3s := pol(1, band("b", 7, policy.Rate{Tokens: 7, Per: 3 * time.Second}))
	hotGold := func(name string) policy.Policy {
		p := pol(2, daily2.Bands)
		p.Overrides = mustOverrides(policy.Override{Match: consHot, Capacity: 100, TokensPerSecond: 100, Name: "gold",
			Bands: band(name, 2, day(2))})
		return p
	}
	for _, tc := range []struct {
		name  string
		start policy.Policy
		steps []ledgerStep
		band  string // the binding band a violation names
	}{
		{"band binds", daily2, []ledgerStep{fin(0, 2, false)}, ""},
		{"band binds+1", daily2, []ledgerStep{fin(0, 3, true)}, `band "daily"`},
		// 7 per 3 s: 7/3 tokens a second, exactly.
		{"7 per 3s", sevenPer3s, []ledgerStep{fin(0, 7, false), bnd(s), fin(s, 2, false), bnd(3 * s), fin(3*s, 5, false)}, ""},
		{"7 per 3s+1", sevenPer3s, []ledgerStep{fin(0, 7, false), bnd(s), fin(s, 3, true)}, `band "b"`},
		// A band added at 1 s starts full: it bounds windows from 1 s on,
		// not the 50 admitted before it.
		{"added band", plain, []ledgerStep{fin(0, 50, false), cut(pol(2, band("daily", 2, day(2))), s, s), bnd(s), fin(s, 2, false)}, ""},
		{"added band+1", plain, []ledgerStep{fin(0, 50, false), cut(pol(2, band("daily", 2, day(2))), s, s), bnd(s), fin(s, 3, true)}, `band "daily"`},
		// A dropped band bounds nothing after the cutover; kept, it does.
		{"dropped band", daily2, []ledgerStep{fin(0, 2, false), cut(pol(2, nil), s, s), bnd(s), fin(s, 50, false)}, ""},
		{"kept band", daily2, []ledgerStep{fin(0, 2, false), cut(pol(2, band("daily", 2, day(2))), s, s), bnd(s), fin(s, 1, true)}, `band "daily"`},
		// A raise of the band's capacity counts: over [0, 1 s] the bound is
		// 2 + 2/86400 of refill + 3 raised.
		{"raised band", daily2, []ledgerStep{fin(0, 2, false), cut(pol(2, band("daily", 5, day(2))), s, s), bnd(s), fin(s, 3, false)}, ""},
		{"raised band+1", daily2, []ledgerStep{fin(0, 2, false), cut(pol(2, band("daily", 5, day(2))), s, s), bnd(s), fin(s, 4, true)}, `band "daily"`},
		// A period change from a day to a second over a cutover window of
		// [1 s, 2 s]: the faster rate over the window, 1 token, and 1/86400
		// before it.
		{"period change", pol(1, band("b", 1, day(1))), []ledgerStep{fin(0, 1, false), cut(pol(2, band("b", 1, policy.PerSecond(1))), s, 2*s), bnd(2 * s), fin(2*s, 1, false)}, ""},
		{"period change+1", pol(1, band("b", 1, day(1))), []ledgerStep{fin(0, 1, false), cut(pol(2, band("b", 1, policy.PerSecond(1))), s, 2*s), bnd(2 * s), fin(2*s, 2, true)}, `band "b"`},
		// A class moving to an override keeps a band of the same name (the
		// primary's name does not matter); a band of another name is new.
		{"to an override, band kept by name", daily2, []ledgerStep{fin(0, 2, false), cut(hotGold("daily"), s, s), bnd(s), fin(s, 1, true)}, `band "daily"`},
		{"to an override, band of another name", daily2, []ledgerStep{fin(0, 2, false), cut(hotGold("other"), s, s), bnd(s), fin(s, 2, false)}, ""},
		{"to an override, band of another name+1", daily2, []ledgerStep{fin(0, 2, false), cut(hotGold("other"), s, s), bnd(s), fin(s, 3, true)}, `band "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newConsLedger(tc.start, []string{"hot", "cold"}, 1)
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
					assert.Equal(t, "hot", v.Key)
					assert.Contains(t, v.Want, "by "+tc.band)
					t.Log(v.Error())
				}
			}
		})
	}
}

// TestConsCheckDecisionBands: the per-decision checks read the binding
// band's capacity and rate, whatever its period.
func TestConsCheckDecisionBands(t *testing.T) {
	p := policy.Policy{Version: 4, Capacity: 5, TokensPerSecond: 5,
		Bands: mustBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})}
	huge := policy.Policy{Version: 1, Capacity: 2, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}}
	ok := []struct {
		p    policy.Policy
		d    engine.Decision
		cost int64
	}{
		// The worked example of 5 at 5/s and 20 a day, at t = 4 s.
		{p, engine.Decision{RetryAfter: 4316 * time.Second, Version: 4, Limit: 20, ResetAfter: 86396 * time.Second, Band: "daily"}, 1},
		{p, engine.Decision{Allowed: true, Remaining: 4, Version: 4, Limit: 5, ResetAfter: 200 * time.Millisecond}, 1},
		{huge, engine.Decision{Remaining: 1, RetryAfter: math.MaxInt64, Version: 1, Limit: 2, ResetAfter: math.MaxInt64}, 2},
	}
	for i, c := range ok {
		assert.Empty(t, consCheckDecision(c.d, c.cost, c.p.Shape(), c.p.Version), "case %d", i)
	}
	bad := []engine.Decision{
		{RetryAfter: 4316 * time.Second, Version: 4, Limit: 20, ResetAfter: 86396 * time.Second, Band: "weekly"}, // no such band
		{RetryAfter: 4316 * time.Second, Version: 4, Limit: 5, ResetAfter: 86396 * time.Second, Band: "daily"},   // the primary's Limit
		{RetryAfter: 4321 * time.Second, Version: 4, Limit: 20, ResetAfter: 86396 * time.Second, Band: "daily"},  // longer than a token takes
		{RetryAfter: 4316 * time.Second, Version: 4, Limit: 20, ResetAfter: 86401 * time.Second, Band: "daily"},  // reset too long
		{RetryAfter: 4316 * time.Second, Version: 4, Limit: 20, ResetAfter: 4316 * time.Second, Band: "daily"},   // reset too short
		{Version: 4, Limit: 5, ResetAfter: time.Second},                                                          // the primary: denied, no retry
	}
	for i, d := range bad {
		assert.NotEmpty(t, consCheckDecision(d, 1, p.Shape(), 4), "case %d: %+v", i, d)
	}
	assert.Contains(t, consCheckDecision(engine.Decision{Allowed: true, Version: 4, Limit: 5, ResetAfter: time.Second}, 6, p.Shape(), 4),
		"ErrInvalidCost", "a cost above the smallest capacity")
}
