package main

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// The reproducers of known_bugs.go. Each skips, saying so, while its bug
// reproduces, and otherwise checks that every answer is one the contract
// allows.

// TestAllWithinInt64: only the requests that would pass math.MaxInt64 go.
func TestAllWithinInt64(t *testing.T) {
	reqs := []engine.Request{{Key: "a", Cost: math.MaxInt64 - 1}, {Key: "b", Cost: math.MaxInt64}, {Key: "a", Cost: 2},
		{Key: "a", Cost: 0}, {Key: "a", Cost: 1}, {Key: "b", Cost: 1}}
	assert.Equal(t, []engine.Request{{Key: "a", Cost: math.MaxInt64 - 1}, {Key: "b", Cost: math.MaxInt64}, {Key: "a", Cost: 0}, {Key: "a", Cost: 1}},
		allWithinInt64(reqs))
	assert.Len(t, reqs, 6, "the input is left alone")
}

// TestKnownBugSumPastMaxInt64 is known bug 1: costs of one key that add up
// past math.MaxInt64, on a key of capacity math.MaxInt64, are
// ErrCostExceedsCapacity at the key's first request.
func TestKnownBugSumPastMaxInt64(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: 1}
	reqs := []engine.Request{{Key: "k", Cost: math.MaxInt64}, {Key: "k", Cost: 1}}
	_, at, err := enginemodel.New(p, 0, 0).AllowAll(0, reqs)
	require.Equal(t, engine.ErrCostExceedsCapacity, err, "the model")
	require.Zero(t, at)

	e, err := engine.New(engine.Config{Policy: p, Shards: 1, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	defer e.Close()
	d, at, err := e.AllowAll(context.Background(), reqs)
	if err == nil {
		t.Skipf("known engine bug 1 (stress/known_bugs.go): AllowAll(%v) under %s answered %+v at %d, want ErrCostExceedsCapacity at 0",
			reqs, policyText(p), d, at)
	}
	assert.Equal(t, engine.ErrCostExceedsCapacity, err)
	assert.Zero(t, at)
	assert.Zero(t, e.KeyCount(), "nothing created")
}

// linShardPair returns two keys of e, x and y, with y on a lower shard
// than x, if it finds any (all its keys may land on one shard).
func linShardPair(e *engine.Engine) (x, y string, ok bool) {
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}
	sh := linShards(e, keys)
	for _, i := range keys {
		for _, j := range keys {
			si, iok := sh[i]
			sj, jok := sh[j]
			if iok && jok && sj < si {
				return i, j, true
			}
		}
	}
	return "", "", false
}

// TestKnownBugMixedVersions is known bug 2: AllowAll([{x 2} {y 2}]), y on a
// lower shard than x, racing a cutover from capacity 1 to capacity 5, is
// ErrCostExceedsCapacity at 0 (v1) or admitted (v2), never
// ErrCostExceedsCapacity at 1, which no version gives.
func TestKnownBugMixedVersions(t *testing.T) {
	ctx := context.Background()
	v1 := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	v2 := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}
	seen := map[string]int{}
	for try := range 20_000 {
		e, err := engine.New(engine.Config{Policy: v1, Shards: 2, Clock: clock.NewManual(0)})
		require.NoError(t, err)
		x, y, ok := linShardPair(e)
		if !ok {
			require.NoError(t, e.Close())
			continue
		}
		reqs := []engine.Request{{Key: x, Cost: 2}, {Key: y, Cost: 2}}
		var d engine.Decision
		var at int
		var cutErr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; d, at, err = e.AllowAll(ctx, reqs) })
		wg.Go(func() { <-start; cutErr = e.ReplacePolicy(ctx, v2, 1) })
		close(start)
		wg.Wait()
		require.NoError(t, e.Close())
		require.NoError(t, cutErr)
		switch {
		case err == engine.ErrCostExceedsCapacity && at == 0:
			seen["v1"]++
		case err == nil && d.Allowed && d.Version == 2:
			seen["v2"]++
		case err == engine.ErrCostExceedsCapacity && at == 1:
			t.Skipf("known engine bug 2 (stress/known_bugs.go), try %d of 20000 (v1 %d, v2 %d): 2 shards, AllowAll(%v) racing ReplacePolicy(%s, 1) from %s answered ErrCostExceedsCapacity at 1, which no single version gives",
				try, seen["v1"], seen["v2"], reqs, policyText(v2), policyText(v1))
		default:
			t.Fatalf("try %d: AllowAll(%v) racing the cutover answered %+v at %d, %v", try, reqs, d, at, err)
		}
	}
	t.Logf("answers: %v", seen)
}

// TestKnownBugPhantomKeys is known bug 3: with MaxKeys 2 and key a tracked
// and empty, AllowAll([{n 1} {a 1}]) is refused and creates nothing (or,
// once a concurrent Allow of a new key z has taken the last room, is
// ErrKeyCapacity at 0), so that Allow, z on another shard than n, is
// admitted; and a concurrent KeyCount, with no z, reads 1.
func TestKnownBugPhantomKeys(t *testing.T) {
	ctx := context.Background()
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	for try := range 5_000 {
		e, err := engine.New(engine.Config{Policy: p, Shards: 2, MaxKeys: 2, Clock: clock.NewManual(0)})
		require.NoError(t, err)
		n, z, ok := linShardPair(e)
		if !ok {
			require.NoError(t, e.Close())
			continue
		}
		a := "a0" // on whichever shard: it is tracked
		_, err = e.Allow(ctx, a, 1)
		require.NoError(t, err)
		withZ := try%2 == 0 // else a KeyCount alone, which then must read 1
		var d, zd engine.Decision
		var at int
		var zerr error
		var count int
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; d, at, err = e.AllowAll(ctx, []engine.Request{{Key: n, Cost: 1}, {Key: a, Cost: 1}}) })
		wg.Go(func() {
			<-start
			if withZ {
				zd, zerr = e.Allow(ctx, z, 1)
			} else {
				count = e.KeyCount()
			}
		})
		close(start)
		wg.Wait()
		after := e.KeyCount()
		require.NoError(t, e.Close())
		if withZ && err == engine.ErrKeyCapacity {
			// Legal after z took the last room: then z must be admitted.
			require.Zero(t, at, "n's request")
			require.NoError(t, zerr)
			require.True(t, zd.Allowed)
			continue
		}
		require.NoError(t, err)
		require.False(t, d.Allowed, "a is empty")
		bug := "known engine bug 3 (stress/known_bugs.go), try %d: 2 shards, MaxKeys 2, %q tracked and empty; AllowAll([{%s 1} {%s 1}]) refused, yet concurrently "
		switch {
		case withZ && zerr == engine.ErrKeyCapacity:
			t.Skipf(bug+"Allow(%q, 1) on another shard -> ErrKeyCapacity (KeyCount %d after)", try, a, n, a, z, after)
		case !withZ && count != 1:
			t.Skipf(bug+"KeyCount -> %d (%d after)", try, a, n, a, count, after)
		}
		if withZ {
			require.NoError(t, zerr)
			require.True(t, zd.Allowed)
			require.Equal(t, 2, after, "a and z")
		} else {
			require.Equal(t, 1, after)
		}
	}
}
