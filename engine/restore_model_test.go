package engine_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// randCap draws a capacity, the int64 edges included.
func randCap(r *rand.Rand) int64 {
	return []int64{1, 2, 3, 5, 10, 1000, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}[r.IntN(9)]
}

// randRate draws a refill: tokens per second, or a rate per period.
func randRate(r *rand.Rand) (int64, policy.Rate) {
	if r.IntN(3) == 0 {
		return []int64{1, 2, 7, 1e9, math.MaxInt64}[r.IntN(5)], policy.Rate{}
	}
	return 0, policy.Rate{Tokens: []int64{1, 3, 1e9, math.MaxInt64}[r.IntN(4)], Per: []time.Duration{1, 7, time.Second, 3 * time.Second, time.Minute, 24 * time.Hour, math.MaxInt64}[r.IntN(7)]}
}

// randPolicy draws a valid policy of version: bands, and an override
// whose name may be a band's, each drawn or not.
func randPolicy(t testing.TB, r *rand.Rand, version int64) policy.Policy {
	p := policy.Policy{Version: version, Capacity: randCap(r)}
	p.TokensPerSecond, p.Refill = randRate(r)
	var bs []policy.Band
	for _, n := range []string{"a", "b", "c"} {
		if r.IntN(3) == 0 {
			b := policy.Band{Name: n, Capacity: randCap(r)}
			tps, rt := randRate(r)
			if tps != 0 {
				rt = policy.Rate{Tokens: tps, Per: time.Second}
			}
			b.Refill = rt
			bs = append(bs, b)
		}
	}
	if len(bs) > 0 {
		p.Bands = bands(t, bs...)
	}
	if r.IntN(2) == 0 {
		o := policy.Override{Match: "k*", Capacity: randCap(r), Name: []string{"", "o", "a"}[r.IntN(3)]}
		o.TokensPerSecond, o.Refill = randRate(r)
		if o.Name == "a" && r.IntN(2) == 0 {
			o.Bands = bands(t, policy.Band{Name: "b", Capacity: randCap(r), Refill: policy.Rate{Tokens: 1, Per: time.Second}})
		}
		set, err := policy.NewOverrideSet(o)
		require.NoError(t, err)
		p.Overrides = set
	}
	require.NoError(t, p.Validate())
	return p
}

// TestRestoreAgreesWithModel: a snapshot taken after random Allows,
// Charges into debt, Refunds and cutovers under random policies (the int64
// edges included), restored after a random downtime under another random
// policy and shard count, answers every key's Peek as the math/big model
// does when it refills through the downtime and then cuts over: no debt
// forgotten, no key topped up. The stress differential restores only at
// the same instant under the same policy.
func TestRestoreAgreesWithModel(t *testing.T) {
	skipUnderRace(t)
	keys := []string{"k1", "k2", "x", "y"}
	for seed := range uint64(1000) {
		r := rand.New(rand.NewPCG(seed, 7))
		p1 := randPolicy(t, r, 1)
		clk := clock.NewManual(r.Int64N(1 << 40))
		e, err := engine.New(engine.Config{Policy: p1, Shards: 1 + r.IntN(3), Clock: clk})
		require.NoError(t, err)
		m := enginemodel.New(p1, 0, 0)
		ver := int64(1)
		for range 30 {
			switch r.IntN(6) {
			case 0:
				clk.Advance(time.Duration([]int64{0, 1, 999, 1e9, 1 << 40}[r.IntN(5)]))
			case 1, 2:
				k := keys[r.IntN(len(keys))]
				n := []int64{1, 2, 10, 1 << 40, math.MaxInt64}[r.IntN(5)]
				d1, e1 := e.Charge(t.Context(), k, n)
				d2, e2 := m.Charge(clk.Now(), k, n)
				require.Equal(t, e2, e1)
				require.Equal(t, d2, d1, "seed %d charge", seed)
			case 3:
				k := keys[r.IntN(len(keys))]
				n := []int64{1, 2, 10}[r.IntN(3)]
				d1, e1 := e.Allow(t.Context(), k, n)
				d2, e2 := m.Allow(clk.Now(), k, n)
				require.Equal(t, e2, e1)
				require.Equal(t, d2, d1, "seed %d allow", seed)
			case 4:
				k := keys[r.IntN(len(keys))]
				n := []int64{1, 2, 10, math.MaxInt64}[r.IntN(4)]
				d1, e1 := e.Refund(t.Context(), k, n)
				d2, e2 := m.Refund(clk.Now(), k, n)
				require.Equal(t, e2, e1)
				require.Equal(t, d2, d1, "seed %d refund", seed)
			case 5:
				ver++
				p := randPolicy(t, r, ver)
				require.NoError(t, e.ReplacePolicy(t.Context(), p, ver-1))
				require.NoError(t, m.ReplacePolicy(clk.Now(), p, ver-1))
			}
		}
		var buf bytes.Buffer
		require.NoError(t, e.Snapshot(t.Context(), &buf))
		require.NoError(t, e.Close())
		down := []int64{0, 1, 1e9, 1 << 40}[r.IntN(4)]
		clk.Advance(time.Duration(down))
		ver++
		p2 := randPolicy(t, r, ver)
		e2, _, err := engine.Restore(engine.Config{Policy: p2, Shards: 1 + r.IntN(3), Clock: clk}, &buf, engine.RestoreOptions{})
		require.NoError(t, err)
		require.NoError(t, m.ReplacePolicy(clk.Now(), p2, ver-1))
		for _, k := range keys {
			d1, e1 := e2.Peek(t.Context(), k)
			d2, er2 := m.Peek(clk.Now(), k)
			require.Equal(t, er2, e1)
			require.Equal(t, d2, d1, fmt.Sprintf("seed %d key %s p1 %+v p2 %+v", seed, k, p1, p2))
		}
		require.NoError(t, e2.Close())
	}
}
