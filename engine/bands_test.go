package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Rates per any period and bands, through the engine: the worked examples of
// the package doc, cutovers that reshape bands, and the paths (Peek, Refund,
// AllowBatch, EvictFull) that must see every band.

func bands(t testing.TB, bs ...policy.Band) *policy.BandSet {
	t.Helper()
	s, err := policy.NewBands(bs...)
	require.NoError(t, err)
	return s
}

func daily(capacity int64) policy.Band {
	return policy.Band{Name: "daily", Capacity: capacity, Refill: policy.PerDay(capacity)}
}

// dailyPolicy is 5 per second in bursts of 5, and 20 per day.
func dailyPolicy(t testing.TB, version int64) policy.Policy {
	return policy.Policy{Version: version, Capacity: 5, TokensPerSecond: 5, Bands: bands(t, daily(20))}
}

// TestBandsPerMinute: capacity 10 at 100 per minute admits 10 at t=0, and
// the 11th waits exactly 600ms (one token is 60s/100).
func TestBandsPerMinute(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)}
		e, clk := newEngine(t, engine.Config{Policy: p, Shards: shards})
		for i := range 10 {
			d := behavAllow(t, e, "k", 1)
			require.True(t, d.Allowed, "request %d", i)
			assert.Equal(t, int64(9-i), d.Remaining)
		}
		d := behavAllow(t, e, "k", 1)
		assert.Equal(t, engine.Decision{RetryAfter: 600 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 6 * time.Second}, d)
		clk.Set(int64(599 * time.Millisecond))
		require.False(t, behavAllow(t, e, "k", 1).Allowed)
		clk.Set(int64(600 * time.Millisecond))
		require.True(t, behavAllow(t, e, "k", 1).Allowed, "the denial kept its fraction")
		assert.Equal(t, p, e.Policy(), "the policy is returned as given")
	})
}

// TestBandsDailyExample: 5 at each of t = 0..3s pass (20 in all), then the
// daily band binds at t=4s with 4320s less the 4s of refill it earned.
func TestBandsDailyExample(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: dailyPolicy(t, 1), Shards: shards})
		for s := range int64(4) {
			clk.Set(s * int64(time.Second))
			for i := range 5 {
				d := behavAllow(t, e, "k", 1)
				require.True(t, d.Allowed, "t=%ds request %d", s, i)
				// The binding band is the one with fewer tokens left: the
				// primary until the daily band runs lower.
				if d.Band == "daily" {
					assert.Equal(t, int64(20), d.Limit)
				} else {
					assert.Equal(t, "", d.Band)
					assert.Equal(t, int64(5), d.Limit)
				}
			}
		}
		clk.Set(int64(4 * time.Second))
		d := behavAllow(t, e, "k", 1)
		assert.False(t, d.Allowed)
		assert.Equal(t, "daily", d.Band)
		assert.Equal(t, 4316*time.Second, d.RetryAfter)
		assert.Equal(t, int64(20), d.Limit)
		assert.Equal(t, int64(0), d.Remaining)
		// ResetAfter is the daily band's: 20 tokens less 4s of refill.
		assert.Equal(t, 86400*time.Second-4*time.Second, d.ResetAfter)

		// The denial took nothing from the primary: 5 tokens refilled by
		// t=4s and still there once the daily band holds one.
		clk.Set(int64(4320 * time.Second))
		d = behavAllow(t, e, "k", 1)
		require.True(t, d.Allowed)
		assert.Equal(t, "daily", d.Band, "the daily band has 0 left, the primary 4")
		assert.Equal(t, int64(0), d.Remaining)
	})
}

// TestBandsBindingTies: when allowed, the band with the fewest whole tokens
// left binds, ties going to the primary, then to the bands in order.
func TestBandsBindingTies(t *testing.T) {
	set := bands(t,
		policy.Band{Name: "a", Capacity: 10, Refill: policy.PerSecond(1)},
		policy.Band{Name: "b", Capacity: 6, Refill: policy.PerSecond(1)},
		policy.Band{Name: "c", Capacity: 6, Refill: policy.PerSecond(1)})
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Bands: set}
	e, _ := newEngine(t, engine.Config{Policy: p})
	d := behavAllow(t, e, "k", 1)
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 5, Version: 1, Limit: 6, ResetAfter: time.Second, Band: "b"}, d)
	// Equal capacities, equal balances: the primary wins a tie.
	p2 := policy.Policy{Version: 2, Capacity: 6, TokensPerSecond: 1, Bands: set}
	require.NoError(t, e.ReplacePolicy(context.Background(), p2, 1))
	d = behavAllow(t, e, "k2", 1)
	assert.Equal(t, "", d.Band)
	assert.Equal(t, int64(6), d.Limit)
	// A denial names the band with the longest wait.
	_, err := e.Allow(context.Background(), "k2", 7)
	require.ErrorIs(t, err, engine.ErrInvalidCost, "a cost above any band's capacity")
	for range 5 {
		behavAllow(t, e, "k2", 1)
	}
	d = behavAllow(t, e, "k2", 1)
	require.False(t, d.Allowed)
	assert.Equal(t, "", d.Band, "every band waits 1s: the primary first")
	assert.Equal(t, time.Second, d.RetryAfter)
}

// TestBandsOverride: an override's limit is its own, bands included; its
// primary band carries its Name.
func TestBandsOverride(t *testing.T) {
	set, err := policy.NewOverrideSet(policy.Override{Match: "gold:*", Name: "gold", Capacity: 100, Refill: policy.PerMinute(600),
		Bands: bands(t, policy.Band{Name: "hourly", Capacity: 150, Refill: policy.PerHour(150)})})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: bands(t, daily(20)), Overrides: set}
	e, _ := newEngine(t, engine.Config{Policy: p, Shards: 2})
	d := behavAllow(t, e, "gold:1", 100)
	assert.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 100, ResetAfter: 10 * time.Second, Band: "gold"}, d)
	d = behavAllow(t, e, "gold:1", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, "gold", d.Band)
	assert.Equal(t, 100*time.Millisecond, d.RetryAfter)
	_, err = e.Allow(context.Background(), "gold:2", 101)
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	_, err = e.Allow(context.Background(), "plain", 6)
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	d = behavAllow(t, e, "plain", 5)
	assert.Equal(t, "", d.Band)
}

// TestBandsCutover: bands match by name. Raising the daily band tops nobody
// up; a band new in the next policy starts full; a removed band is dropped;
// a change of period converts the balance rounding down.
func TestBandsCutover(t *testing.T) {
	ctx := context.Background()
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: dailyPolicy(t, 1), Shards: shards})
		for s := range int64(4) {
			clk.Set(s * int64(time.Second))
			for range 5 {
				require.True(t, behavAllow(t, e, "k", 1).Allowed)
			}
		}
		clk.Set(int64(4 * time.Second))
		raised := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 5, Bands: bands(t, daily(100))}
		require.NoError(t, e.ReplacePolicy(ctx, raised, 1))
		d := behavAllow(t, e, "k", 1)
		require.False(t, d.Allowed, "a raised band tops nobody up")
		assert.Equal(t, "daily", d.Band)
		assert.Equal(t, int64(100), d.Limit)
		// 80/86400 of a token earned under 20/day; at 100/day one token
		// is 864s, of which 80/86400*864s = 0.8s is earned.
		assert.Equal(t, 864*time.Second-800*time.Millisecond, d.RetryAfter)

		// Adding a band starts it full; the daily band keeps its balance.
		added := policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 5, Bands: bands(t, daily(100),
			policy.Band{Name: "hourly", Capacity: 50, Refill: policy.PerHour(50)})}
		require.NoError(t, e.ReplacePolicy(ctx, added, 2))
		clk.Set(int64(4*time.Second + 864*time.Second - 800*time.Millisecond))
		d = behavAllow(t, e, "k", 1)
		require.True(t, d.Allowed)
		assert.Equal(t, "daily", d.Band)
		d = behavAllow(t, e, "fresh", 1)
		assert.Equal(t, "", d.Band, "a fresh key: the primary has fewest left (4)")

		// Removing the daily band frees the key of it: the primary's 4
		// tokens pass, though the daily band held none.
		removed := policy.Policy{Version: 4, Capacity: 5, TokensPerSecond: 5}
		require.NoError(t, e.ReplacePolicy(ctx, removed, 3))
		for i := range 4 {
			require.True(t, behavAllow(t, e, "k", 1).Allowed, "request %d", i)
		}
		d = behavAllow(t, e, "k", 1)
		assert.Equal(t, engine.Decision{RetryAfter: 200 * time.Millisecond, Version: 4, Limit: 5, ResetAfter: time.Second}, d)
		assert.Equal(t, removed, e.Policy())
	})
}

// TestBandsPeriodChangeRoundsDown: 1 token per 3s becomes 1 token per 2s
// at t=1s: the third of a token earned, 1e9 units of 3e9, becomes
// floor(1e9*2e9/3e9) = 666666666 units of 2e9, rounded down, never up.
func TestBandsPeriodChangeRoundsDown(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 3 * time.Second}}
	e, clk := newEngine(t, engine.Config{Policy: p})
	require.True(t, behavAllow(t, e, "k", 1).Allowed)
	clk.Set(int64(time.Second))
	next := policy.Policy{Version: 2, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 2 * time.Second}}
	require.NoError(t, e.ReplacePolicy(context.Background(), next, 1))
	d := behavAllow(t, e, "k", 1)
	require.False(t, d.Allowed)
	// 2e9 - 666666666 units at 1 unit per ns.
	assert.Equal(t, time.Duration(2_000_000_000-666_666_666), d.RetryAfter)
}

// TestBandsPeekRefundBatchEvict: Peek, Refund, AllowBatch and EvictFull
// see every band.
func TestBandsPeekRefundBatchEvict(t *testing.T) {
	ctx := context.Background()
	e, clk := newEngine(t, engine.Config{Policy: dailyPolicy(t, 1), Shards: 2})
	reqs := make([]engine.Request, 6)
	for i := range reqs {
		reqs[i] = engine.Request{Key: "k", Cost: 1}
	}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, e.AllowBatch(ctx, reqs, out))
	for i := range 5 {
		require.True(t, out[i].Decision.Allowed)
	}
	assert.False(t, out[5].Decision.Allowed)
	assert.Equal(t, "", out[5].Decision.Band)
	clk.Set(int64(time.Second))
	for range 5 {
		require.True(t, behavAllow(t, e, "k", 1).Allowed)
	}
	d, err := e.Peek(ctx, "k")
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, "", d.Band, "primary empty, daily has 10")
	// A refund credits every band, each capped.
	d, err = e.Refund(ctx, "k", 8)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(5), d.Remaining, "the primary is capped at 5")
	assert.Equal(t, "", d.Band)
	d = behavAllow(t, e, "k", 5)
	assert.True(t, d.Allowed)
	assert.Equal(t, "", d.Band, "the primary 0, daily 13")
	// Full only when every band is: after 10s the primary is full, the
	// daily band is not.
	clk.Set(int64(11 * time.Second))
	n, err := e.EvictFull(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, 1, e.KeyCount())
	clk.Set(int64(11*time.Second + 86400*time.Second))
	n, err = e.EvictFull(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Zero(t, e.KeyCount())
}
