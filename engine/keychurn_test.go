package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestKeyChurnNeverResetsADebt: four keys charged to their floor share a
// bound of 8 with a flood of new keys, pressure sweeps and EvictFull, while
// the clock moves in steps shorter than a refill: each step, every charged
// key's balance is what the math/big refill of its debt says, never the
// full bucket an eviction and re-creation would give it.
func TestKeyChurnNeverResetsADebt(t *testing.T) {
	for _, sh := range []int{1, 2, 16} {
		clk := clock.NewManual(1)
		p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.Rate{Tokens: 3, Per: 7 * time.Second}}
		e, _ := newEngine(t, engine.Config{Policy: p, Clock: clk, Shards: sh, MaxKeys: 8, SweepEvery: time.Hour})
		ctx := context.Background()
		victims := []string{"v0", "v1", "v2", "v3"}
		for _, v := range victims {
			_, err := e.Charge(ctx, v, 1000) // to the floor, -10
			require.NoError(t, err)
		}
		start := clk.Now()
		n := 0
		for step := range 200 {
			clk.Advance(time.Second / 3)
			for range 30 {
				n++
				_, err := e.Allow(ctx, fmt.Sprintf("adv%d", n), 10)
				if err != nil && !errors.Is(err, engine.ErrKeyCapacity) {
					require.NoError(t, err)
				}
			}
			_, _ = e.EvictFull(ctx)
			// units = -10*P + elapsed*N, capped at 10*P; Remaining = floor(units/P)
			el := big.NewInt(clk.Now() - start)
			P := big.NewInt(int64(7 * time.Second))
			units := new(big.Int).Mul(big.NewInt(-10), P)
			units.Add(units, el.Mul(el, big.NewInt(3)))
			capU := new(big.Int).Mul(big.NewInt(10), P)
			if units.Cmp(capU) > 0 {
				units = capU
			}
			want := new(big.Int).Div(units, P) // Euclidean: floor for positive P
			for _, v := range victims {
				d, err := e.Peek(ctx, v)
				require.NoError(t, err)
				require.Equal(t, want.Int64(), d.Remaining, "shards %d step %d victim %s", sh, step, v)
			}
			require.LessOrEqual(t, e.KeyCount(), 8)
		}
	}
}
