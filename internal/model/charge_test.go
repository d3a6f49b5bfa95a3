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

// TestChargeWorkedExamples: the contract's three worked examples of a
// charge, on the model, against numbers computed by hand.
func TestChargeWorkedExamples(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}

	m := model.New(p, 0, 0)
	d, err := m.Allow(0, "k", 4)
	require.NoError(t, err)
	assert.Equal(t, int64(6), d.Remaining)
	d, err = m.Charge(0, "k", 12)
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: -6, Version: 1, Limit: 10, ResetAfter: 16 * time.Second}, d)
	d, _ = m.Allow(0, "k", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, 7*time.Second, d.RetryAfter)
	assert.Equal(t, int64(-6), d.Remaining)
	d, _ = m.Allow(7*sec, "k", 1)
	assert.True(t, d.Allowed)
	assert.Zero(t, d.Remaining)

	m = model.New(p, 0, 0)
	d, err = m.Charge(0, "new", 25)
	require.NoError(t, err)
	assert.Equal(t, int64(-10), d.Remaining, "the floor: 5 forgiven")
	d, _ = m.Allow(0, "new", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, 11*time.Second, d.RetryAfter)

	daily, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	require.NoError(t, err)
	m = model.New(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: daily}, 0, 0)
	d, err = m.Charge(0, "new", 30)
	require.NoError(t, err)
	assert.Equal(t, "daily", d.Band.String())
	assert.Equal(t, int64(-10), d.Remaining)
	assert.Equal(t, int64(20), d.Limit)
	assert.Equal(t, tokens(t, m, "new"), []string{"-5", "-10"})
	d, _ = m.Allow(0, "new", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, "daily", d.Band.String())
	assert.Equal(t, 47_520*time.Second, d.RetryAfter, "11 tokens at one per 4,320 s")
}

// TestChargeErrors: Allow's errors in Allow's order, less the cost bound,
// and an error changes nothing.
func TestChargeErrors(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, 1, 4)
	_, err := m.Charge(0, " ", 1)
	assert.ErrorIs(t, err, model.ErrInvalidKey)
	_, err = m.Charge(0, "toolong", 0)
	assert.ErrorIs(t, err, model.ErrInvalidKey)
	_, err = m.Charge(0, "a", 0)
	assert.ErrorIs(t, err, model.ErrInvalidCost)
	d, err := m.Charge(5, "a", math.MaxInt64)
	require.NoError(t, err, "above the capacity is fine")
	assert.Equal(t, int64(-10), d.Remaining)
	_, err = m.Charge(4, "a", 1)
	assert.ErrorIs(t, err, model.ErrClockRegression)
	_, err = m.Charge(5, "b", 1)
	assert.ErrorIs(t, err, model.ErrKeyCapacity)
	assert.Equal(t, 1, m.KeyCount())
	assert.Equal(t, []string{"-10"}, tokens(t, m, "a"))
}

// TestDebtEverywhere: a key in debt is not evicted, Peek reports the debt,
// Refund repays it, and a cutover keeps it, rounded toward more debt when
// the period changes and clamped to a shallower floor.
func TestDebtEverywhere(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, 0, 0)
	_, err := m.Charge(0, "k", 14)
	require.NoError(t, err)
	n, err := m.EvictFull(0)
	require.NoError(t, err)
	assert.Zero(t, n, "a bucket in debt is not full")
	d, err := m.Peek(sec/2, "k")
	require.NoError(t, err)
	assert.Equal(t, int64(-4), d.Remaining, "-3.5 floors to -4")
	assert.Equal(t, 4500*time.Millisecond, d.RetryAfter)
	d, err = m.Refund(sec/2, "k", 2)
	require.NoError(t, err)
	assert.Equal(t, int64(-2), d.Remaining)
	assert.Equal(t, []string{"-3/2"}, tokens(t, m, "k"))

	// 2 per 3 s: -1.5 + 1 s x 2/3 = -5/6, which at 1 per 7 ns is -35/42
	// = -5.83.../7: floored to -6/7.
	require.NoError(t, m.ReplacePolicy(sec/2, policy.Policy{Version: 2, Capacity: 10, Refill: policy.Rate{Tokens: 2, Per: 3 * time.Second}}, 1))
	require.NoError(t, m.ReplacePolicy(3*sec/2, policy.Policy{Version: 3, Capacity: 10, Refill: policy.Rate{Tokens: 1, Per: 7}}, 2))
	assert.Equal(t, []string{"-6/7"}, tokens(t, m, "k"), "toward more debt")
	_, err = m.Charge(3*sec/2, "k", 20)
	require.NoError(t, err)
	require.NoError(t, m.ReplacePolicy(3*sec/2, policy.Policy{Version: 4, Capacity: 3, TokensPerSecond: 1}, 3))
	assert.Equal(t, []string{"-3"}, tokens(t, m, "k"), "clamped to the new floor")
	require.NoError(t, m.ReplacePolicy(3*sec/2, policy.Policy{Version: 5, Capacity: 30, TokensPerSecond: 1}, 4))
	assert.Equal(t, []string{"-3"}, tokens(t, m, "k"), "a deeper floor keeps the debt")
	b, ok := m.Bucket("k")
	require.True(t, ok)
	assert.Equal(t, int64(-3*policy.UnitsPerToken), b.Units.Int64())
	n, _ = m.EvictFull(3*sec/2 + 33*sec)
	assert.Equal(t, 1, n, "repaid and refilled: full, evicted")
}
