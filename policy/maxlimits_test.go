package policy_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestOverrideSetMaxLimits: exactly MaxLimits distinct limits fit, the last
// at LimitIndex MaxLimits, the top of the 16-bit index; one more is
// ErrInvalid naming the entry; any number of overrides may share fewer.
func TestOverrideSetMaxLimits(t *testing.T) {
	skipUnderRace(t)
	ovs := make([]policy.Override, policy.MaxLimits+1)
	for i := range ovs {
		ovs[i] = policy.Override{Match: "k" + strconv.Itoa(i), Capacity: int64(i + 1), TokensPerSecond: 1}
	}
	set, err := policy.NewOverrideSet(ovs[:policy.MaxLimits]...)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: set}
	l, idx := p.Resolve(ovs[policy.MaxLimits-1].Match)
	require.Equal(t, policy.LimitIndex(policy.MaxLimits), idx)
	require.Equal(t, int64(policy.MaxLimits), l.Capacity)
	require.Len(t, p.Limits(), policy.MaxLimits+1)

	_, err = policy.NewOverrideSet(ovs...)
	require.ErrorIs(t, err, policy.ErrInvalid)
	require.Contains(t, err.Error(), `override 65534 ("k65534"): more than 65534 distinct limits`)

	for i := range ovs {
		ovs[i].Capacity = int64(i%3 + 1)
	}
	set, err = policy.NewOverrideSet(ovs...)
	require.NoError(t, err)
	require.Len(t, (policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: set}).Limits(), 4)
}
