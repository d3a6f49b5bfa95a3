package shard

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/msg"
)

// TestRunHoldIsPerKey: while a part holds key a, a request for key b is
// served, and one for a waits until the hold ends, then is decided after
// the commit.
func TestRunHoldIsPerKey(t *testing.T) {
	clk := make(gateClock, 64)
	for range 64 {
		clk <- 0 // every reading the shard takes: the test needs no gate here
	}
	budget := NewBudget(10)
	l := startLoop(p1, clk, budget)
	defer l.close()

	part := func(key string, cost int64) *msg.Batch {
		return &msg.Batch{Items: []msg.Item{{Key: key, Hash: testHasher.Sum(key), Cost: cost}},
			Out: make([]msg.Reply, 1), Done: make(chan int, 1), Hold: &msg.Hold{Snaps: make([]msg.Snap, 1)}}
	}
	b := part("a", 4)
	require.NoError(t, l.mb.SendBatch(context.Background(), b))
	<-b.Done
	require.NoError(t, b.Out[0].Err)
	require.Equal(t, []int{0}, b.Hold.Fresh, "a is new")

	got := <-allowAsync(t, l.mb, "b", 1)
	require.NoError(t, got.Err)
	assert.True(t, got.Decision.Allowed, "another key is served while a is held")

	// The request for a is queued before two batch parts for other keys:
	// once both are answered, the shard has taken it, and kept it aside.
	a := &msg.Single{Key: "a", Hash: testHasher.Sum("a"), Cost: 10, Done: make(chan struct{}, 1)}
	require.NoError(t, l.mb.SendSingle(context.Background(), a))
	waiting := make(chan msg.Reply, 1)
	go func() { a.Wait(msg.WaitYields(1)); waiting <- a.Reply }()
	for _, k := range []string{"c", "d"} {
		p := &msg.Batch{Items: []msg.Item{{Key: k, Hash: testHasher.Sum(k), Cost: 1}}, Out: make([]msg.Reply, 1), Done: make(chan int, 1)}
		require.NoError(t, l.mb.SendBatch(context.Background(), p))
		<-p.Done
		require.True(t, p.Out[0].Decision.Allowed)
	}
	select {
	case r := <-waiting:
		t.Fatalf("a request for the held key was answered during the hold: %+v", r)
	default:
	}

	require.True(t, b.Hold.Claim(), "nothing made the shard give the hold up")
	var d decision.Decision
	b.Hold.Snaps[0].Decide(0, 4, b.Hold.Version, &d)
	require.True(t, d.Allowed)
	assert.Equal(t, int64(6), d.Remaining)
	ok, _ := budget.ReserveN(1) // the caller's reservation for the new key a
	require.True(t, ok)
	require.True(t, b.Hold.End(msg.HoldCommit, 0, true))
	l.mb.SignalHold()
	r := <-waiting
	require.NoError(t, r.Err)
	assert.False(t, r.Decision.Allowed, "decided after the commit took 4 of a's 10")
	assert.Equal(t, int64(6), r.Decision.Remaining)
}
