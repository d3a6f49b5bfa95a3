package shard

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

func holdItems(s *State, kv ...any) []msg.Item {
	var items []msg.Item
	for i := 0; i < len(kv); i += 2 {
		k := kv[i].(string)
		items = append(items, msg.Item{Key: k, Hash: s.hasher.Sum(k), Cost: int64(kv[i+1].(int))})
	}
	return items
}

// decideAt decides items at T from the copies holdSnap makes at now, as a
// hold's caller does.
func decideAt(s *State, now, T int64, items []msg.Item, out []msg.Reply) {
	snaps := make([]msg.Snap, len(items))
	s.holdSnap(now, items, snaps)
	for i := range items {
		snaps[i].Decide(T, items[i].Cost, s.policyInForce().Version, &out[i].Decision)
	}
}

// TestStateHold: the copies holdSnap makes decide at a later instant as
// the shard would, taking nothing, and a commit decides exactly that, creating the new keys in room the caller
// reserved; a refusal changes nothing; holdBegin lists the new keys and
// its errors come in rule order.
func TestStateHold(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	budget := NewBudget(3)
	s := newState(NewLimits(p), budget, &testHasher)
	ref := newState(NewLimits(p), NewBudget(3), &testHasher)
	require.NoError(t, s.allow(0, "a", 4).Err)
	require.NoError(t, ref.allow(0, "a", 4).Err)

	items := holdItems(s, "a", 3, "b", 2)
	out := make([]msg.Reply, len(items))
	var fresh []int
	require.True(t, s.holdBegin(1e9, items, out, &fresh))
	assert.Equal(t, []int{1}, fresh, "b is new")
	assert.Equal(t, int64(1), budget.Count(), "the shard reserves nothing")
	decideAt(s, 1e9, 2e9, items, out)
	want := []msg.Reply{ref.allow(2e9, "a", 3), ref.allow(2e9, "b", 2)}
	assert.Equal(t, want, out)
	got, _ := s.bucket("a")
	assert.Equal(t, int64(6), got.Tokens, "the copies take nothing")
	ok, _ := budget.ReserveN(1) // the caller's reservation for b
	require.True(t, ok)
	s.holdCommit(2e9, items, true)
	for _, k := range []string{"a", "b"} {
		var g, w msg.Reply
		s.peek(3e9, k, s.hasher.Sum(k), &g)
		ref.peek(3e9, k, ref.hasher.Sum(k), &w)
		assert.Equal(t, w, g, "key %s after the commit", k)
	}
	assert.Equal(t, int64(2), budget.Count())
	s.checkInvariants(t, "after a commit")

	// A refusal: nothing taken, nothing created.
	items = holdItems(s, "c", 1, "a", 10)
	require.True(t, s.holdBegin(3e9, items, out, &fresh))
	decideAt(s, 3e9, 3e9, items, out)
	assert.False(t, out[1].Decision.Allowed)
	s.holdCommit(3e9, items, false)
	_, tracked := s.bucket("c")
	assert.False(t, tracked)
	assert.Equal(t, int64(2), budget.Count())

	// Errors, in rule order, and nothing changed by any.
	out = make([]msg.Reply, 3)
	require.False(t, s.holdBegin(4e9, holdItems(s, "x", 1, "y", 1, "a", 11), out, &fresh))
	assert.Equal(t, msg.ErrCostExceedsCapacity, out[2].Err)
	require.False(t, s.holdBegin(1, holdItems(s, "a", 1), out[:1], &fresh))
	assert.Equal(t, msg.ErrClockRegression, out[0].Err)
	s.checkInvariants(t, "after the errors")
	ok, room := budget.ReserveN(2)
	assert.False(t, ok)
	assert.Equal(t, int64(1), room)
}

// TestHoldCommitKeepsLatestReading: a hold committed at T, earlier than a
// reading the shard observed for another key while the hold was held, does
// not move the shard's latest reading back: a request read before that
// later reading is still ErrClockRegression.
func TestHoldCommitKeepsLatestReading(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newState(NewLimits(p), NewBudget(10), &testHasher)
	items := holdItems(s, "a", 1)
	out := make([]msg.Reply, 1)
	var fresh []int
	require.True(t, s.holdBegin(1e9, items, out, &fresh))
	require.NoError(t, s.allow(5e9, "other", 1).Err) // served while "a" is held
	s.holdCommit(2e9, items, true)                   // the call's instant T < 5e9
	assert.Equal(t, msg.ErrClockRegression, s.allow(3e9, "other", 1).Err,
		"3e9 is older than 5e9, which the shard has already observed")
}

// TestHoldCommitAfterLaterReadingTakesEveryCost: a hold committed at T,
// earlier than a reading the shard observed for another key while the hold
// was held, still takes every item's cost at T and creates its new keys:
// an admitted call pays on every shard (all or nothing), whatever the
// shard served meanwhile.
func TestHoldCommitAfterLaterReadingTakesEveryCost(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	budget := NewBudget(10)
	s := newState(NewLimits(p), budget, &testHasher)
	ref := newState(NewLimits(p), NewBudget(10), &testHasher)
	require.NoError(t, s.allow(0, "a", 10).Err)
	require.NoError(t, ref.allow(0, "a", 10).Err)

	items := holdItems(s, "a", 1, "b", 3)
	out := make([]msg.Reply, len(items))
	var fresh []int
	require.True(t, s.holdBegin(1e9, items, out, &fresh))
	decideAt(s, 1e9, 2e9, items, out)
	require.True(t, out[0].Decision.Allowed && out[1].Decision.Allowed, "the copies admit both at T")
	require.NoError(t, s.allow(5e9, "other", 1).Err) // served while the keys are held
	ok, _ := budget.ReserveN(1)                      // the caller's room for b
	require.True(t, ok)
	s.holdCommit(2e9, items, true) // the call's instant T < 5e9

	// The reference decides the same requests at T, one by one.
	require.True(t, ref.allow(2e9, "a", 1).Decision.Allowed)
	require.True(t, ref.allow(2e9, "b", 3).Decision.Allowed)
	require.NoError(t, ref.allow(5e9, "other", 1).Err)
	for _, k := range []string{"a", "b", "other"} {
		var g, w msg.Reply
		s.peek(6e9, k, s.hasher.Sum(k), &g)
		ref.peek(6e9, k, ref.hasher.Sum(k), &w)
		assert.Equal(t, w, g, "key %s after the commit", k)
	}
	got, tracked := s.bucket("a")
	require.True(t, tracked)
	assert.Equal(t, policy.Bucket{Tokens: 1, Last: 2e9}, got, "a paid its token at T: 2 refilled by 2e9, 1 taken")
	assert.Equal(t, int64(3), budget.Count(), "a, b and other")
	s.checkInvariants(t, "after a commit behind the shard's latest reading")
}
