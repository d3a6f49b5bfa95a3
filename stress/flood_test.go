package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestFlood floods a 10,000-key engine with a few hundred thousand distinct
// keys; runFlood checks every answer, count and sweep itself. Each run lasts
// two seconds, and at least three whole rounds however long they take (a
// loaded machine under -race once fitted two in the two seconds).
func TestFlood(t *testing.T) {
	for _, shards := range []int{1, 4} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c := &counters{}
		o := options{workers: 4, shards: shards, seed: 1}
		err := floodFor(ctx, 3, o, c)
		cancel()
		require.NoError(t, err, "shards %d", shards)
		t.Logf("shards %d: %d keys offered, %d ErrKeyCapacity, %d evicted, peak heap %d KiB",
			shards, c.floodKeys.Load(), c.errs[kindKeyCapacity].Load(), c.evictions.Load(), c.peakHeap.Load()>>10)
		assert.GreaterOrEqual(t, c.floodKeys.Load(), int64(3*floodPerRound), "keys offered")
		assert.Positive(t, c.errs[kindKeyCapacity].Load(), "ErrKeyCapacity")
		assert.Positive(t, c.evictions.Load(), "evictions")
		assert.Positive(t, c.peakHeap.Load(), "heap sampled")
	}
}

// TestFloodBucket checks the flood's exact model against the contract's
// first two worked examples: capacity 10 at 2/s spent whole and refilled by
// half a second, and capacity 1 at 3/s, whose token takes 333,333,334 ns.
func TestFloodBucket(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	b := floodBucket{units: 10 * consUnits}
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, b.decide(p, 0, 10))
	assert.Equal(t, engine.Decision{RetryAfter: 500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, b.decide(p, 0, 1))
	assert.False(t, b.decide(p, 250_000_000, 1).Allowed)
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, b.decide(p, 500_000_000, 1))

	q := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 3}
	b = floodBucket{}
	assert.False(t, b.decide(q, 333_333_333, 1).Allowed)
	assert.True(t, b.decide(q, 333_333_334, 1).Allowed)
	b = floodBucket{}
	assert.Equal(t, time.Duration(333_333_334), b.decide(q, 0, 1).RetryAfter)
}

// TestFloodEdge checks floodEdge against the flood's model for both shapes:
// the bucket it describes is one unit short of full after the wait, and
// full a nanosecond later, so the edge sweeps have exact answers.
func TestFloodEdge(t *testing.T) {
	for _, l := range floodShapes {
		p := policy.Policy{Version: 1, Capacity: l.Capacity, TokensPerSecond: l.TokensPerSecond}
		cost, wait, ok := floodEdge(p)
		require.True(t, ok, "%+v", l)
		b := floodBucket{units: p.Capacity * consUnits}
		require.True(t, b.decide(p, 0, cost).Allowed, "%+v", l)
		b.refill(p, wait)
		assert.Equal(t, p.Capacity*consUnits-1, b.units, "%+v: units after the wait", l)
		b.refill(p, wait+1)
		assert.Equal(t, p.Capacity*consUnits, b.units, "%+v: units a nanosecond later", l)
		// The residents stay far from full through the edge: drained to
		// under a token, they gain under capacity-1 tokens in the wait.
		assert.Less(t, (wait+1)*p.TokensPerSecond, (p.Capacity-1)*consUnits, "%+v", l)
	}
}
