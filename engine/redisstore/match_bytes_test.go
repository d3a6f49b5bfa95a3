package redisstore_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// Keys are bytes, and so are override Matches: a Match that is not valid
// UTF-8 ("\xff", or "кл\xd1*", a pattern cut inside a rune) must come back
// from Redis as it was given. The store keeps each retained policy in Redis
// and reads it back for the limits a bucket had under an older version (its
// chain) and whenever another store made the cutover; a Match read back
// with U+FFFD in place of its invalid bytes selects other keys.

// TestStoredPolicyKeepsMatchBytes: a second store on the prefix adopts the
// policy the first installed, Matches byte for byte, and resolves the keys
// they select to their overrides.
func TestStoredPolicyKeepsMatchBytes(t *testing.T) {
	ctx := context.Background()
	over, err := policy.NewOverrideSet(
		policy.Override{Match: "\xff", Capacity: 5, TokensPerSecond: 1},
		policy.Override{Match: "кл\xd1*", Capacity: 7, Refill: policy.PerMinute(1), Name: "ru"},
		policy.Override{Match: "\ufffd", Capacity: 9, TokensPerSecond: 1},
	)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1, Overrides: over}
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	pfx := prefix(t)
	newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p}, clk)
	other := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: policy.Policy{Version: 9, Capacity: 1, TokensPerSecond: 1}}, clk)
	require.Equal(t, int64(1), other.Policy().Version)

	got := other.Policy().Overrides.Overrides()
	require.Len(t, got, 3)
	for i, o := range over.Overrides() {
		require.Equal(t, o.Match, got[i].Match, "override %d", i)
	}
	for key, limit := range map[string]int64{"\xff": 5, "ключ": 7, "\ufffd": 9, "\xfe": 3} {
		d, err := other.Allow(ctx, key, 1)
		require.NoError(t, err, "%q", key)
		require.Equal(t, limit, d.Limit, "%q", key)
	}
}

// TestEvictFullAfterCutoverFromMatchBytes: a bucket written under an
// override for "\xff" (a primary of 1 per MaxInt64 ns and a band " "), cut
// over to a default shape whose primary (capacity 2, 1 per day) the bucket
// fills at the cutover and whose band "hourly" is new, so starts full: the
// bucket is full, and EvictFull deletes it. Read back with "\ufffd" for
// "\xff", the old override would not have selected the key, the bucket's
// two bands would not have been the old default shape's one, and the
// bucket would have restarted empty at the cutover and been kept.
func TestEvictFullAfterCutoverFromMatchBytes(t *testing.T) {
	ctx := context.Background()
	bands, err := policy.NewBands(policy.Band{Name: " ", Capacity: 227817, Refill: policy.Rate{Tokens: 3, Per: 7}})
	require.NoError(t, err)
	over, err := policy.NewOverrideSet(policy.Override{Match: "\xff", Capacity: 455634,
		Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}, Bands: bands, Name: "o2"})
	require.NoError(t, err)
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 455633, TokensPerSecond: 3, Overrides: over}}, clk)

	d, err := s.Allow(ctx, "\xff", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 227816, Version: 1, Limit: 227817, ResetAfter: 3, Band: " "}, d)

	clk.Set(1821860970299298)
	hourly, err := policy.NewBands(policy.Band{Name: "hourly", Capacity: 3, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 2, Refill: policy.PerDay(1), Bands: hourly}, 1))

	clk.Set(2800323239804834)
	n, err := s.EvictFull(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	keys, err := s.KeyCount(ctx)
	require.NoError(t, err)
	require.Zero(t, keys)
}

// TestCutoverNearMaxInt64FromMatchBytes: a key under the pattern "кл\xd1*"
// (its primary of capacity MaxInt64 at 10000 per day, down one token, and
// three bands) cut over to a plain default of capacity MaxInt64-1 per
// second: the primary moves to the new unit and is clamped to MaxInt64-1,
// full, so a cost of MaxInt64-1 is admitted a second later. Read back with
// "\ufffd" for "\xd1", the pattern would not have selected "ключ", and the
// bucket would have restarted empty at the cutover, holding one token.
func TestCutoverNearMaxInt64FromMatchBytes(t *testing.T) {
	ctx := context.Background()
	bands, err := policy.NewBands(
		policy.Band{Name: "hourly", Capacity: math.MaxInt64 - 1, Refill: policy.Rate{Tokens: 1, Per: 1}},
		policy.Band{Name: "burst", Capacity: 1, Refill: policy.Rate{Tokens: 10000, Per: 24 * time.Hour}},
		policy.Band{Name: "b", Capacity: 4611686018427387903, Refill: policy.Rate{Tokens: 10000, Per: 24 * time.Hour}},
	)
	require.NoError(t, err)
	over, err := policy.NewOverrideSet(policy.Override{Match: "кл\xd1*", Capacity: math.MaxInt64,
		Refill: policy.Rate{Tokens: 10000, Per: 24 * time.Hour}, Bands: bands})
	require.NoError(t, err)
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: 958524733908, Overrides: over}}, clk)

	out := make([]engine.Result, 1)
	require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "ключ", Cost: 1}}, out))
	require.NoError(t, out[0].Err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 1, ResetAfter: 8640000000, Band: "burst"}, out[0].Decision)

	clk.Set(8640000000)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: math.MaxInt64 - 1, Refill: policy.PerSecond(1)}, 1))

	clk.Set(9640000000)
	d, err := s.Allow(ctx, "ключ", math.MaxInt64-1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 2, Limit: math.MaxInt64 - 1, ResetAfter: math.MaxInt64}, d)
}
