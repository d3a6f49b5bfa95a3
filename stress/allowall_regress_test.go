package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// Regression tests for three AllowAll bugs the linearizability and
// differential checks found (fixed in the engine by 3d39918). Each builds
// the smallest case that showed its bug, and fails if the engine answers
// anything the contract does not allow.

// TestAllowAllSumPastMaxInt64: a key's costs are summed exactly, not
// saturating at math.MaxInt64. On a key of capacity math.MaxInt64, costs
// that add up past it (math.MaxInt64 and 1) are ErrCostExceedsCapacity at
// the key's first request, creating nothing; costs that add up to it
// exactly are admitted, as the model admits them.
func TestAllowAllSumPastMaxInt64(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: 1}
	for _, tc := range []struct {
		name string
		reqs []engine.Request
	}{
		{"past MaxInt64", []engine.Request{{Key: "k", Cost: math.MaxInt64}, {Key: "k", Cost: 1}}},
		{"past MaxInt64, another key first", []engine.Request{{Key: "j", Cost: 1}, {Key: "k", Cost: 2}, {Key: "k", Cost: math.MaxInt64 - 1}}},
		{"exactly MaxInt64", []engine.Request{{Key: "k", Cost: math.MaxInt64 - 1}, {Key: "k", Cost: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := enginemodel.New(p, 0, 0)
			want, wantAt, wantErr := m.AllowAll(0, tc.reqs)

			e, err := engine.New(engine.Config{Policy: p, Shards: 1, Clock: clock.NewManual(0)})
			require.NoError(t, err)
			defer e.Close()
			d, at, err := e.AllowAll(context.Background(), tc.reqs)
			require.Equal(t, wantErr, err, "AllowAll(%v) under %s", tc.reqs, policyText(p))
			assert.Equal(t, wantAt, at)
			assert.Equal(t, want, d)
			assert.Equal(t, m.KeyCount(), e.KeyCount(), "keys created")
		})
	}
	// The model's answers themselves, so that the cases above test what
	// they say.
	_, at, err := enginemodel.New(p, 0, 0).AllowAll(0, []engine.Request{{Key: "k", Cost: math.MaxInt64}, {Key: "k", Cost: 1}})
	require.Equal(t, engine.ErrCostExceedsCapacity, err)
	require.Zero(t, at)
	d, _, err := enginemodel.New(p, 0, 0).AllowAll(0, []engine.Request{{Key: "k", Cost: math.MaxInt64 - 1}, {Key: "k", Cost: 1}})
	require.NoError(t, err)
	require.True(t, d.Allowed)
}

// raceTries is how many times a test below races its calls: n, or a fifth
// of n under the race detector, whose scheduling meets each bug's window
// far more often. With the bug put back, a plain build met the version mix
// within 240 to 2,240 tries, the race build within 1 to 505 (32 runs on a
// loaded machine, most under 80); a reservation held by a refused call
// over three yields, within 0 to 47 in either. A fifth keeps the race
// build's margin over the slowest catch about the plain build's, and the
// whole counts ran these two tests for 24 of the stress package's 104 s
// under -race.
func raceTries(n int) int {
	if raceEnabled {
		return n / 5
	}
	return n
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

// TestAllowAllCostErrorUnderOneVersion: an AllowAll's
// ErrCostExceedsCapacity is decided under one policy version, as an
// admission or a refusal is. AllowAll([{x 2} {y 2}]), y on a lower shard
// than x, racing a cutover from capacity 1 to capacity 5, is
// ErrCostExceedsCapacity at 0 (v1) or admitted (v2), never
// ErrCostExceedsCapacity at 1, which no single version gives (y checked
// under v1 and x under v2, as the engine once could).
func TestAllowAllCostErrorUnderOneVersion(t *testing.T) {
	ctx := context.Background()
	v1 := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	v2 := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}
	seen := map[string]int{}
	for try := range raceTries(20_000) {
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
		default:
			t.Fatalf("try %d (v1 %d, v2 %d so far): 2 shards, AllowAll(%v) racing ReplacePolicy(%s, 1) from %s answered %+v at %d, %v; want ErrCostExceedsCapacity at 0 (v1) or admitted under v2",
				try, seen["v1"], seen["v2"], reqs, policyText(v2), policyText(v1), d, at, err)
		}
	}
	t.Logf("answers: %v", seen)
}

// TestAllowAllRefusedReservesNoKeyRoom: an AllowAll takes room in the key
// bound only for the keys it creates, when it is admitted; a refused one
// holds none, even while it is being decided. With MaxKeys 2 and key a
// tracked and empty, AllowAll([{n 1} {a 1}]) is refused and creates nothing
// (or, once a concurrent Allow of a new key z has taken the last room, is
// ErrKeyCapacity at 0), so that Allow, z on another shard than n, is
// admitted; and, with no z, every KeyCount made while it runs reads 1.
func TestAllowAllRefusedReservesNoKeyRoom(t *testing.T) {
	ctx := context.Background()
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	for try := range raceTries(5_000) {
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
		withZ := try%2 == 0 // else KeyCounts alone, which then must read 1
		reqs := []engine.Request{{Key: n, Cost: 1}, {Key: a, Cost: 1}}
		var d, zd engine.Decision
		var at int
		var zerr error
		count := 1 // the first KeyCount that read otherwise
		var done atomic.Bool
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; d, at, err = e.AllowAll(ctx, reqs); done.Store(true) })
		wg.Go(func() {
			<-start
			if withZ {
				zd, zerr = e.Allow(ctx, z, 1)
				return
			}
			for { // KeyCounts over the whole AllowAll, so its window is seen
				if c := e.KeyCount(); c != 1 && count == 1 {
					count = c
				}
				if done.Load() {
					return
				}
			}
		})
		close(start)
		wg.Wait()
		after := e.KeyCount()
		require.NoError(t, e.Close())
		what := "try %d: 2 shards, MaxKeys 2, %q tracked and empty; AllowAll(%v) answered %+v at %d, %v, "
		if withZ {
			what += "and concurrently Allow(%q, 1) on another shard than %q answered %+v, %v (KeyCount %d after)"
			what = fmt.Sprintf(what, try, a, reqs, d, at, err, z, n, zd, zerr, after)
			require.NoError(t, zerr, what)
			require.True(t, zd.Allowed, what)
			require.Equal(t, 2, after, "a and z: "+what)
			if err == engine.ErrKeyCapacity { // z took the last room first
				require.Zero(t, at, "n's request: "+what)
				continue
			}
			require.NoError(t, err, what)
			require.False(t, d.Allowed, "a is empty: "+what)
		} else {
			what += "and a concurrent KeyCount read %d (%d after)"
			what = fmt.Sprintf(what, try, a, reqs, d, at, err, count, after)
			require.NoError(t, err, what)
			require.False(t, d.Allowed, "a is empty: "+what)
			require.Equal(t, 1, count, "a alone: "+what)
			require.Equal(t, 1, after, "a alone: "+what)
		}
	}
}
