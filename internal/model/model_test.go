package model_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

const ms = int64(time.Millisecond)

// The contract's worked examples hold for the model on its own: it is the
// reference, so it is checked against hand-computed numbers, not the model.
// Capacity 10 at 2/s: a full bucket spent whole, a half token kept across a
// denial; a rate of 3/s earning its token at 333,333,334 ns, not before; a
// cutover at 0.5 s to capacity 20 at 4/s carrying exactly the 1 token earned
// so far; EvictFull removing only buckets that have refilled.
func TestWorkedExamples(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}, 0, 0)
	d, err := m.Allow(0, "k", 10)
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d)
	d, _ = m.Allow(0, "k", 1)
	assert.Equal(t, 500*time.Millisecond, d.RetryAfter)
	assert.False(t, d.Allowed)
	d, _ = m.Allow(250*ms, "k", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, 250*time.Millisecond, d.RetryAfter, "the half token is kept")
	d, _ = m.Allow(500*ms, "k", 1)
	assert.True(t, d.Allowed)
	assert.Zero(t, d.Remaining)

	third := model.New(policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 3}, 0, 0)
	third.Allow(0, "k", 1)
	d, _ = third.Allow(333_333_333, "k", 1)
	assert.False(t, d.Allowed)
	d, _ = third.Allow(333_333_334, "k", 1)
	assert.True(t, d.Allowed)

	cut := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}, 0, 0)
	cut.Allow(0, "k", 10)
	require.NoError(t, cut.ReplacePolicy(500*ms, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4}, 1))
	b, _ := cut.Bucket("k")
	assert.Equal(t, int64(policy.UnitsPerToken), b.Units.Int64(), "exactly 1 token at the cutover")
	d, _ = cut.Allow(750*ms, "k", 2)
	assert.True(t, d.Allowed)
	assert.Zero(t, d.Remaining, "exactly 2 tokens at 0.75 s")

	ev := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}, 0, 0)
	ev.Allow(0, "a", 10)
	ev.Allow(0, "b", 10)
	n, _ := ev.EvictFull(500 * ms)
	assert.Zero(t, n)
	n, _ = ev.EvictFull(5500 * ms)
	assert.Equal(t, 2, n)
	assert.Zero(t, ev.KeyCount())
}

func TestErrorsAndBounds(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}, 1, 3)
	for _, tc := range []struct {
		key  string
		cost int64
		want error
	}{
		{"", 1, model.ErrInvalidKey},
		{" \t", 1, model.ErrInvalidKey},
		{"abcd", 1, model.ErrInvalidKey},
		{"", 0, model.ErrInvalidKey},
		{"abc", 0, model.ErrInvalidCost},
		{"abc", 6, model.ErrCostExceedsCapacity},
	} {
		_, err := m.Allow(0, tc.key, tc.cost)
		assert.ErrorIs(t, err, tc.want, "%q cost %d", tc.key, tc.cost)
	}
	_, below := m.Allow(0, "abc", 0)
	assert.Equal(t, model.ErrInvalidCost, below, "a cost below 1 is ErrInvalidCost itself")
	_, err := m.Allow(10, "abc", 1)
	require.NoError(t, err)
	_, err = m.Allow(10, "xyz", 1)
	assert.ErrorIs(t, err, model.ErrKeyCapacity)
	_, err = m.Allow(9, "abc", 1)
	assert.ErrorIs(t, err, model.ErrClockRegression)
	assert.ErrorIs(t, m.ReplacePolicy(10, policy.Policy{}, 1), policy.ErrInvalid)
	assert.ErrorIs(t, m.ReplacePolicy(10, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 2), model.ErrStalePolicy)
	assert.ErrorIs(t, m.ReplacePolicy(9, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 1), model.ErrClockRegression)
	assert.Equal(t, int64(1), m.Policy().Version, "failed cutovers change nothing")

	// Saturation: MaxInt64 everywhere stays exact.
	big := model.New(policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: 1}, 0, 0)
	d, err := big.Allow(0, "k", math.MaxInt64)
	require.NoError(t, err)
	assert.Equal(t, time.Duration(math.MaxInt64), d.ResetAfter)
	d, _ = big.Allow(math.MaxInt64, "k", math.MaxInt64)
	assert.False(t, d.Allowed)
	assert.Equal(t, time.Duration(math.MaxInt64), d.RetryAfter)

	// Clone is deep.
	c := m.Clone()
	c.Allow(20, "abc", 5)
	mb, _ := m.Bucket("abc")
	cb, _ := c.Bucket("abc")
	assert.NotEqual(t, mb.Units.String(), cb.Units.String())
}
