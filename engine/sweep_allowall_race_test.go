package engine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// TestAllowAllUnderSweeps: AllowAlls over keys on two shards, and Allows of
// the same keys, while sweeps of a table large enough to take many slices
// run back to back: every call ends, and each key's balance is its capacity
// less exactly what the admitted calls took (the clock stands still, so
// nothing refills). Calls that meet a shard being swept start over once the
// sweep is done, holding nothing meanwhile.
func TestAllowAllUnderSweeps(t *testing.T) {
	const capacity = 1 << 20
	e, _ := newEngine(t, engine.Config{Policy: pol(1, capacity, 1), Shards: 2})
	ctx := context.Background()
	fill(t, e, longKeys(40*1024), 1) // none full: every sweep walks them all
	var on [2][]string               // keys of each shard
	for i := 0; len(on[0]) < 4 || len(on[1]) < 4; i++ {
		k := string(rune('a'+i%26)) + string(rune('a'+i/26))
		if s := e.ShardOf(k); len(on[s]) < 4 {
			on[s] = append(on[s], k)
		}
	}
	var taken [2][4]atomic.Int64
	stop := make(chan struct{})
	var sweeps sync.WaitGroup
	sweeps.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, err := e.EvictFull(ctx)
			assert.NoError(t, err)
		}
	})
	var callers sync.WaitGroup
	for g := range 8 {
		callers.Go(func() {
			for n := range 300 {
				i, j := (g+n)%4, (g+2*n)%4
				if n%3 == 0 {
					d, err := e.Allow(ctx, on[g%2][i], 1)
					if assert.NoError(t, err) && d.Allowed {
						taken[g%2][i].Add(1)
					}
					continue
				}
				d, _, err := e.AllowAll(ctx, []engine.Request{{Key: on[0][i], Cost: 1}, {Key: on[1][j], Cost: 2}})
				if assert.NoError(t, err) && d.Allowed {
					taken[0][i].Add(1)
					taken[1][j].Add(2)
				}
			}
		})
	}
	callers.Wait()
	close(stop)
	sweeps.Wait()
	for s := range on {
		for i, k := range on[s] {
			d, err := e.Peek(ctx, k)
			require.NoError(t, err)
			assert.Equal(t, capacity-taken[s][i].Load(), d.Remaining, "key %q", k)
		}
	}
}
