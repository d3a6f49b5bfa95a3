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

// TestPatternCutoverConvertsFirst: a cutover into a policy with patterns
// starts a conversion pass at once, which a sweep or a snapshot waits for,
// so they find every bucket converted: sliced by segments, they would
// otherwise bring thousands of keys over the cutover in one slice, each
// tried against every pattern. A cutover into a policy without patterns
// leaves its buckets to convert lazily, as before.
func TestPatternCutoverConvertsFirst(t *testing.T) {
	const keys = 2000
	set, err := policy.NewOverrideSet(policy.Override{Match: "tenant:*", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	plain := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newState(NewLimits(plain), NewBudget(keys), &testHasher)
	for i := range keys {
		require.NoError(t, s.allow(1, fmt.Sprintf("user:%d", i), 1).Err)
	}
	plain.Version = 2
	require.NoError(t, s.prepare(2, NewLimits(plain)))
	s.publish()
	require.False(t, s.converting(), "a cutover without patterns converts lazily")
	require.Equal(t, keys, s.stale)

	require.NoError(t, s.prepare(3, NewLimits(policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 1, Overrides: set})))
	s.publish()
	require.True(t, s.converting(), "a cutover into a policy with patterns converts at once")
	for s.converting() {
		s.convertSlice(SliceSize)
	}
	require.Zero(t, s.stale)
	require.Len(t, s.gens, 1, "the history is dropped")
}
