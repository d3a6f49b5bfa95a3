package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestWorkedPerMinute: capacity 10 at 100 per minute, one token every
// 600 ms. Ten requests pass at t=0; the 11th is denied with RetryAfter
// exactly 600 ms, and passes then, not a nanosecond before.
func TestWorkedPerMinute(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)}
	require.NoError(t, p.Validate())
	sh := p.Shape()
	require.False(t, sh.Compact(), "a minute's period needs a Level")
	require.Equal(t, int64(6), p.Rate().WindowSeconds(p.Capacity), "w=6")
	ms := int64(time.Millisecond)

	lv := []policy.Level{policy.FullLevel(sh.Primary)}
	for i := range 10 {
		o, band := policy.DecideLevels(sh, lv, 1)
		require.Equal(t, policy.Outcome{Allowed: true, Remaining: int64(9 - i), ResetAfter: int64(i+1) * 600 * ms}, o, "request %d", i+1)
		require.Equal(t, 0, band)
	}
	o, band := policy.DecideLevels(sh, lv, 1)
	assert.Equal(t, policy.Outcome{Remaining: 0, RetryAfter: 600 * ms, ResetAfter: 6000 * ms}, o, "the 11th")
	assert.Equal(t, 0, band)
	assert.Equal(t, "", sh.BandName(band), "the policy's own band is named \"\"")

	// One ns short of 600 ms: still denied, for 1 ns more.
	early := []policy.Level{lv[0]}
	policy.RefillLevels(sh, early, 600*ms-1)
	o, _ = policy.DecideLevels(sh, early, 1)
	assert.Equal(t, policy.Outcome{RetryAfter: 1, ResetAfter: 5400*ms + 1}, o)
	assert.Equal(t, policy.Level{Frac: 59_999_999_900}, early[0], "6e10 units a token, 100 a ns")

	policy.RefillLevels(sh, lv, 600*ms)
	o, _ = policy.DecideLevels(sh, lv, 1)
	assert.Equal(t, policy.Outcome{Allowed: true, Remaining: 0, ResetAfter: 6000 * ms}, o, "at 600 ms")

	// The Limiter over the same limit says the same.
	tb, err := policy.NewTokenBucket(p.Limit(), 0)
	require.NoError(t, err)
	for range 10 {
		require.True(t, tb.TryAcquire(0, 1).Allowed)
	}
	assert.Equal(t, policy.Outcome{RetryAfter: 600 * ms, ResetAfter: 6000 * ms}, tb.TryAcquire(0, 1))
	assert.False(t, tb.TryAcquire(600*ms-1, 1).Allowed)
	assert.True(t, tb.TryAcquire(600*ms, 1).Allowed)
}

// TestWorkedDailyBand: capacity 5 at 5/s with a band "daily" of 20 per
// day. 5 pass at each of t = 0, 1, 2 and 3 s, 20 in all, the daily quota;
// at t = 4 s the primary is full again but "daily" binds: RetryAfter is
// exactly 4316 s, the 4320 s a daily token takes less the 4 s of daily
// refill already earned.
func TestWorkedDailyBand(t *testing.T) {
	daily := mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: daily}
	require.NoError(t, p.Validate())
	sh := p.Shape()
	require.Equal(t, 2, sh.Len())
	require.Equal(t, int64(86_400), sh.Band(1).Rate().WindowSeconds(20), "daily: w=86400")
	require.Equal(t, int64(1), p.Rate().WindowSeconds(5), "primary: w=1")
	sec := int64(time.Second)
	dailyUnitsPerSec := uint64(20 * sec) // 20 units a ns, one token 86400e9 units

	lv := []policy.Level{policy.FullLevel(sh.Band(0)), policy.FullLevel(sh.Band(1))}
	last := int64(0)
	admitted := 0
	for s := range int64(4) {
		now := s * sec
		policy.RefillLevels(sh, lv, now-last)
		last = now
		require.Equal(t, int64(5), lv[0].Tokens, "t=%ds: the primary is full again", s)
		require.Equal(t, policy.Level{Tokens: 20 - 5*s, Frac: uint64(s) * dailyUnitsPerSec}, lv[1], "t=%ds", s)
		for i := range int64(5) {
			o, band := policy.DecideLevels(sh, lv, 1)
			require.True(t, o.Allowed, "t=%ds request %d", s, i+1)
			admitted++
			// The primary binds while it has fewer whole tokens, or
			// ties; "daily" only once it has fewer.
			wantBand := 0
			if 20-5*s-i-1 < 4-i {
				wantBand = 1
			}
			require.Equal(t, wantBand, band, "t=%ds request %d", s, i+1)
			require.Equal(t, min(4-i, 20-5*s-i-1), o.Remaining)
		}
	}
	require.Equal(t, 20, admitted)

	policy.RefillLevels(sh, lv, 4*sec-last)
	before := append([]policy.Level(nil), lv...)
	o, band := policy.DecideLevels(sh, lv, 1)
	assert.False(t, o.Allowed)
	assert.Equal(t, "daily", sh.BandName(band))
	assert.Equal(t, 4316*sec, o.RetryAfter, "exactly 4316 s")
	assert.Equal(t, int64(0), o.Remaining)
	assert.Equal(t, (86_400-4)*sec, o.ResetAfter, "daily full in a day less the 4 s earned")
	assert.Equal(t, before, lv, "the denial took nothing from the primary")
	assert.Equal(t, int64(5), lv[0].Tokens)

	// The model agrees, and so does a peek.
	want, wantBand := ratDecide(sh, ratsOf(sh, before), 1, true)
	assert.Equal(t, want, o)
	assert.Equal(t, wantBand, band)
	peek, peekBand := policy.PeekLevels(sh, lv)
	assert.Equal(t, o, peek)
	assert.Equal(t, band, peekBand)

	// One ns before 4 s + 4316 s still denied; at it, allowed, by "daily"
	// with 0 left.
	early := append([]policy.Level(nil), lv...)
	policy.RefillLevels(sh, early, 4316*sec-1)
	o, band = policy.DecideLevels(sh, early, 1)
	assert.Equal(t, policy.Outcome{Remaining: 0, RetryAfter: 1, ResetAfter: (86_400-4-4316)*sec + 1}, o)
	assert.Equal(t, 1, band)
	policy.RefillLevels(sh, lv, 4316*sec)
	o, band = policy.DecideLevels(sh, lv, 1)
	assert.Equal(t, policy.Outcome{Allowed: true, Remaining: 0, ResetAfter: 86_400 * sec}, o)
	assert.Equal(t, 1, band)
}
