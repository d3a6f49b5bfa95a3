package shard

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestConvertSliceCountsPatterns holds a conversion slice to about
// SliceSize units of work under policies with pattern overrides: bringing
// a bucket over a cutover resolves its key again under the next policy,
// trying it against each pattern, and each pattern tried is a unit of the
// slice's work, as a slot looked at is. Requests on the shard wait for at
// most a slice.
func TestConvertSliceCountsPatterns(t *testing.T) {
	const keys, cutovers = 2000, convertAfter + 4
	pol := func(v int64) policy.Policy {
		ovs := make([]policy.Override, policy.MaxPatterns)
		for i := range ovs {
			ovs[i] = policy.Override{Match: fmt.Sprintf("tenant%d:*", i), Capacity: 5, TokensPerSecond: 1}
		}
		set, err := policy.NewOverrideSet(ovs...)
		require.NoError(t, err)
		return policy.Policy{Version: v, Capacity: 10, TokensPerSecond: 1, Overrides: set}
	}
	s := newState(NewLimits(pol(1)), NewBudget(keys), &testHasher)
	for i := range keys {
		require.NoError(t, s.allow(1, fmt.Sprintf("user:%d", i), 1).Err)
	}
	for v := int64(2); v <= cutovers+1; v++ {
		require.NoError(t, s.prepare(v, NewLimits(pol(v))))
		s.publish()
	}
	require.True(t, s.converting())
	// Each bucket missed every cutover: bringing one up tries its key
	// against every pattern at each of them.
	perBucket := cutovers * (1 + policy.MaxPatterns)
	for slices := 0; s.converting(); slices++ {
		before := s.stale
		s.convertSlice(SliceSize)
		if converted := before - s.stale; converted > 1+SliceSize/perBucket {
			t.Fatalf("slice %d converted %d buckets, %d units of work each: more than %d units", slices, converted, perBucket, SliceSize)
		}
	}
	require.Zero(t, s.stale)
}
