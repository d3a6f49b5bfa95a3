package engine_test

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestAllowAllConservesBesideControl: AllowAlls over four keys (one named
// twice) beside Allows on one of them, while snapshots, cutovers and sweeps
// make holds give way, on a clock that never moves: each key ends exactly
// its capacity less what the admitted calls took, so a refused or restarted
// AllowAll took nothing from any key.
func TestAllowAllConservesBesideControl(t *testing.T) {
	for _, sh := range []int{1, 2, 16} {
		const capacity = 3000
		clk := clock.NewManual(0)
		e, _ := newEngine(t, engine.Config{Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1}, Shards: sh, Clock: clk, SweepEvery: -1})
		ctx := context.Background()
		keys := []string{"a", "b", "c", "d"}
		var allOK, aOK, errs atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 400; i++ {
					if g%2 == 0 {
						d, _, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 2}, {Key: "c", Cost: 1}, {Key: "a", Cost: 1}, {Key: "d", Cost: 1}})
						if err != nil {
							errs.Add(1)
						} else if d.Allowed {
							allOK.Add(1)
						}
					} else {
						d, err := e.Allow(ctx, "a", 1)
						if err != nil {
							errs.Add(1)
						} else if d.Allowed {
							aOK.Add(1)
						}
					}
				}
			}()
		}
		var cw sync.WaitGroup
		cw.Add(1)
		go func() {
			defer cw.Done()
			v := int64(1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = e.Snapshot(ctx, io.Discard)
				if err := e.ReplacePolicy(ctx, policy.Policy{Version: v + 1, Capacity: capacity, TokensPerSecond: 1}, v); err == nil {
					v++
				}
				_, _ = e.EvictFull(ctx)
			}
		}()
		wg.Wait()
		close(stop)
		cw.Wait()
		require.Zero(t, errs.Load())
		want := map[string]int64{"a": capacity - 2*allOK.Load() - aOK.Load(), "b": capacity - 2*allOK.Load(), "c": capacity - allOK.Load(), "d": capacity - allOK.Load()}
		for _, k := range keys {
			d, err := e.Peek(ctx, k)
			require.NoError(t, err)
			require.Equal(t, want[k], d.Remaining, "shards %d key %s: all %d, a %d", sh, k, allOK.Load(), aOK.Load())
		}
	}
}
