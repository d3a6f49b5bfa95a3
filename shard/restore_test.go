package shard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// TestStateRestoreFromEarlierUpdate: a key restored with levels last brought
// up to date before the restore's reading is refilled under its old limit
// up to that reading exactly once, carried over to the policy in force, and
// then served from there, as if the old policy had served it until a cutover
// at the restore's reading (the eager reference). Refilled twice, the gap
// would mint tokens; not at all, it would lose them. The restore's reading
// is one the shard has seen: an earlier one after it is a regression.
func TestStateRestoreFromEarlierUpdate(t *testing.T) {
	const sec = int64(time.Second)
	old := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	next := policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4}
	last, now := sec/4, sec // the key was emptied at 0.25 s; restored at 1 s

	m := &eager{pol: old, buckets: map[string]policy.Bucket{}, max: 10}
	require.True(t, m.allow(last, "k", 10).Decision.Allowed)
	require.NoError(t, m.cutover(now, next))

	s := newState(NewLimits(next), NewBudget(10), &testHasher)
	defer s.abandon()
	lv := []policy.Level{{}} // empty at last
	require.NoError(t, s.Restore(now, "k", s.hasher.Sum("k"), last, old.Shape(), lv))
	got, ok := s.bucket("k")
	require.True(t, ok)
	want := m.buckets["k"]
	require.Equal(t, want, got, "1.5 tokens, up to date at the restore's reading")

	require.Equal(t, msg.ErrClockRegression, s.allow(now-1, "k", 1).Err, "a reading before the restore's")
	require.Equal(t, msg.ErrClockRegression, s.allow(now-1, "other", 1).Err, "for a new key too")

	for i := range 3 { // 1.5 tokens: one allowed, then denied at the new rate
		require.Equal(t, m.allow(now, "k", 1), s.allow(now, "k", 1), "request %d at the restore's reading", i)
	}
	require.Equal(t, m.allow(now+sec/8, "k", 1), s.allow(now+sec/8, "k", 1), "0.5 token + 0.125 s at 4/s")
}
