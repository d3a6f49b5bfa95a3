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

// TestAllowAllBesideChargeAndRefund: AllowAlls over two keys beside
// Charges that take one of them into debt and Refunds on the other, while
// snapshots, cutovers and sweeps make holds give way, on a clock that never
// moves. AllowAll's all or nothing holds beside them (a refused or
// restarted call took nothing), no call is lost or applied twice while it
// waits behind a hold, and once the charged key is in debt no AllowAll is
// admitted (a debt is repaid before anything is admitted): each key ends at
// exactly its capacity less what was admitted and charged, plus what was
// refunded.
func TestAllowAllBesideChargeAndRefund(t *testing.T) {
	for _, sh := range []int{1, 2, 16} {
		const capacity = 3000
		clk := clock.NewManual(0)
		e, _ := newEngine(t, engine.Config{Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1}, Shards: sh, Clock: clk, SweepEvery: -1})
		ctx := context.Background()
		_, err := e.Charge(ctx, "b", 1000) // room for every refund below the capacity
		require.NoError(t, err)
		var allOK, charged, refunded, errs atomic.Int64
		var inDebtAdmitted atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 400 {
					switch g % 3 {
					case 0:
						d, _, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
						switch {
						case err != nil:
							errs.Add(1)
						case d.Allowed:
							allOK.Add(1)
							if d.Remaining < 0 {
								inDebtAdmitted.Add(1)
							}
						}
					case 1:
						d, err := e.Charge(ctx, "a", 4) // 3200 in all: a debt, never at the floor
						if err != nil || !d.Allowed {
							errs.Add(1)
						} else {
							charged.Add(4)
						}
					default:
						if _, err := e.Refund(ctx, "b", 1); err != nil { // 800 in all
							errs.Add(1)
						} else {
							refunded.Add(1)
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
		require.Zero(t, inDebtAdmitted.Load())
		want := map[string]int64{
			"a": capacity - allOK.Load() - charged.Load(),
			"b": capacity - 1000 - allOK.Load() + refunded.Load(),
		}
		require.Less(t, want["a"], int64(0), "shards %d: the charges took a into debt", sh)
		for k, w := range want {
			d, err := e.Peek(ctx, k)
			require.NoError(t, err)
			require.Equal(t, w, d.Remaining, "shards %d key %s: all %d, charged %d, refunded %d", sh, k, allOK.Load(), charged.Load(), refunded.Load())
		}
	}
}
