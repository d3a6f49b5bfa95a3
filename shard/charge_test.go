package shard

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// chargeKey is charge for tests: it hashes key and returns the reply.
func (s *State) chargeKey(now int64, key string, tokens int64) msg.Reply {
	var r msg.Reply
	s.charge(now, key, s.hasher.Sum(key), tokens, &r)
	return r
}

// TestChargeState: a charge creates an unknown key full and takes it into
// debt, in a compact bucket and in the level store; a sweep evicts neither
// until both are repaid and full; a lazy cutover keeps the debts, clamped
// to the new floor; the key bound and the clock are checked in decide's
// order.
func TestChargeState(t *testing.T) {
	const sec = int64(time.Second)
	daily, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	require.NoError(t, err)
	over, err := policy.NewOverrideSet(policy.Override{Match: "banded", Capacity: 5, TokensPerSecond: 5, Bands: daily})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: over}
	s := newState(NewLimits(p), NewBudget(2), &testHasher)
	defer s.abandon()

	r := s.chargeKey(0, "plain", 12)
	require.NoError(t, r.Err)
	assert.Equal(t, int64(-2), r.Decision.Remaining)
	assert.True(t, r.Decision.Allowed)
	assert.Equal(t, 12*time.Second, r.Decision.ResetAfter)
	r = s.chargeKey(0, "banded", 30)
	require.NoError(t, r.Err)
	assert.Equal(t, "daily", r.Decision.Band.String())
	assert.Equal(t, int64(-10), r.Decision.Remaining)
	assert.Equal(t, int64(20), r.Decision.Limit)
	s.checkInvariants(t, "after the charges")

	assert.ErrorIs(t, s.chargeKey(0, "third", 1).Err, msg.ErrKeyCapacity)
	r = s.chargeKey(-1, "third", 1)
	assert.ErrorIs(t, r.Err, msg.ErrClockRegression, "the clock before the key bound")

	d := s.allow(sec, "plain", 1)
	require.NoError(t, d.Err)
	assert.Equal(t, 2*time.Second, d.Decision.RetryAfter, "-1 at 1 s: 2 s to one token")

	sweep := func(now int64) {
		s.beginSweep(false)
		for {
			done, err := s.sweepSlice(now, 64)
			require.NoError(t, err)
			if done {
				return
			}
		}
	}
	sweep(sec)
	assert.Equal(t, 2, s.keyCount(), "keys in debt are not full")

	require.NoError(t, s.chargeKey(2*sec, "plain", 100).Err)
	next := policy.Policy{Version: 2, Capacity: 3, TokensPerSecond: 1}
	require.NoError(t, s.prepare(2*sec, NewLimits(next)))
	s.publish()
	r = s.chargeKey(2*sec, "banded", 1)
	require.NoError(t, r.Err)
	assert.Equal(t, int64(2), r.Decision.Remaining, "the primary, full again at 2 s, clamped to 3; the daily band dropped")
	r = s.chargeKey(2*sec, "plain", 1)
	require.NoError(t, r.Err)
	assert.Equal(t, int64(-3), r.Decision.Remaining, "-10 clamped to the new floor, and kept there")
	s.checkInvariants(t, "after the cutover")
	sweep(100 * sec)
	assert.Zero(t, s.keyCount(), "repaid and full: both evicted")
	for i := range 2 {
		require.NoError(t, s.chargeKey(100*sec, fmt.Sprint("k", i), 1).Err)
	}
}
