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

// chainCap draws a capacity: small ones, where cutovers clamp, and the
// largest.
func chainCap(r *rand.Rand) int64 {
	return []int64{1, 2, 3, 5, 10, 1000, math.MaxInt64}[r.IntN(7)]
}

// chainRate draws a refill per second or per period, of compact periods
// and longer ones.
func chainRate(r *rand.Rand) (int64, policy.Rate) {
	if r.IntN(2) == 0 {
		return []int64{1, 2, 7, 1e9}[r.IntN(4)], policy.Rate{}
	}
	return 0, policy.Rate{Tokens: []int64{1, 3, 1e9}[r.IntN(3)], Per: []time.Duration{1, 7, time.Second, 3 * time.Second, time.Minute, 5 * time.Second}[r.IntN(6)]}
}

// chainBands draws a band set of the names a, b and c, or nil.
func chainBands(t testing.TB, r *rand.Rand) *policy.BandSet {
	var bs []policy.Band
	for _, n := range []string{"a", "b", "c"} {
		if r.IntN(3) != 0 {
			continue
		}
		b := policy.Band{Name: n, Capacity: chainCap(r)}
		tps, rt := chainRate(r)
		if tps != 0 {
			rt = policy.Rate{Tokens: tps, Per: time.Second}
		}
		b.Refill = rt
		bs = append(bs, b)
	}
	if len(bs) == 0 {
		return nil
	}
	return bands(t, bs...)
}

// chainPolicy draws a policy of version with up to three overrides among
// exact keys and patterns ("k1", "k*", "*1", ...), in random order so that
// which pattern a key resolves to changes from one cutover to the next.
func chainPolicy(t testing.TB, r *rand.Rand, version int64) policy.Policy {
	p := policy.Policy{Version: version, Capacity: chainCap(r)}
	p.TokensPerSecond, p.Refill = chainRate(r)
	p.Bands = chainBands(t, r)
	var os []policy.Override
	matches := []string{"k1", "k*", "*1", "x", "k2", "*"}
	r.Shuffle(len(matches), func(i, j int) { matches[i], matches[j] = matches[j], matches[i] })
	for _, m := range matches[:r.IntN(4)] {
		o := policy.Override{Match: m, Capacity: chainCap(r)}
		o.TokensPerSecond, o.Refill = chainRate(r)
		if r.IntN(3) == 0 {
			o.Bands = chainBands(t, r)
		}
		os = append(os, o)
	}
	if len(os) > 0 {
		set, err := policy.NewOverrideSet(os...)
		if err != nil {
			t.Fatal(err)
		}
		p.Overrides = set
	}
	require.NoError(t, p.Validate())
	return p
}

// TestDifferentialOverrideChains: seeded runs of every operation, as in
// TestDifferentialEveryOperation, under policies of exact and pattern
// overrides together (a key moving between its exact override, a pattern
// and the default), with and without bands and periods of every kind, and
// in half of the runs mostly cutovers, so that untouched buckets convert
// across long chains of generations; AllowBatch too. Every answer and the
// key count must be the math/big model's.
func TestDifferentialOverrideChains(t *testing.T) {
	keys := []string{"k1", "k2", "k3", "x", "y", "z1"}
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 77))
		p := chainPolicy(t, r, 1)
		clk := clock.NewManual(r.Int64N(1 << 30))
		maxKeys := 2 + r.IntN(6)
		shards := []int{1, 2, 3}[r.IntN(3)]
		cfg := engine.Config{Policy: p, Shards: shards, Clock: clk, MaxKeys: maxKeys, SweepEvery: -1}
		e, err := engine.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() }) // e as it ends, after restores
		m := enginemodel.New(p, maxKeys, 0)
		ver := int64(1)
		var log []string
		fail := func(what string) string {
			return fmt.Sprintf("seed %d: %s\n%s", seed, what, joinLines(log))
		}
		heavy := r.IntN(2) == 0
		for op := range 300 {
			k := keys[r.IntN(len(keys))]
			c := r.IntN(12)
			if heavy && r.IntN(3) != 0 {
				c = 9
			}
			switch c {
			case 0:
				d := time.Duration([]int64{0, 1, 7, 999, 1e8, 1e9, 61e9}[r.IntN(7)])
				clk.Advance(d)
				log = append(log, fmt.Sprintf("%d advance %d", op, d))
			case 1:
				n := []int64{1, 2, 10, 1 << 40}[r.IntN(4)]
				d1, e1 := e.Charge(t.Context(), k, n)
				d2, e2 := m.Charge(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d charge %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("charge"))
				require.Equal(t, d2, d1, fail("charge"))
			case 2, 3:
				n := []int64{1, 2, 3, 10}[r.IntN(4)]
				d1, e1 := e.Allow(t.Context(), k, n)
				d2, e2 := m.Allow(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d allow %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("allow"))
				require.Equal(t, d2, d1, fail("allow"))
			case 4:
				n := []int64{1, 2, 10}[r.IntN(3)]
				d1, e1 := e.Refund(t.Context(), k, n)
				d2, e2 := m.Refund(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d refund %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("refund"))
				require.Equal(t, d2, d1, fail("refund"))
			case 5:
				d1, e1 := e.Peek(t.Context(), k)
				d2, e2 := m.Peek(clk.Now(), k)
				log = append(log, fmt.Sprintf("%d peek %s: %+v %v", op, k, d2, e2))
				require.Equal(t, e2, e1, fail("peek"))
				require.Equal(t, d2, d1, fail("peek"))
			case 6:
				var reqs []engine.Request
				for range 1 + r.IntN(4) {
					reqs = append(reqs, engine.Request{Key: keys[r.IntN(len(keys))], Cost: []int64{1, 2, 3}[r.IntN(3)]})
				}
				d1, at1, e1 := e.AllowAll(t.Context(), reqs)
				d2, at2, e2 := m.AllowAll(clk.Now(), reqs)
				log = append(log, fmt.Sprintf("%d allowall %v: %+v %d %v", op, reqs, d2, at2, e2))
				require.Equal(t, e2, errOf(e1), fail("allowall"))
				require.Equal(t, at2, at1, fail("allowall"))
				require.Equal(t, d2, d1, fail("allowall"))
			case 7:
				if shards > 1 && maxKeys < len(keys) {
					continue // which new keys of several shards meet the bound first is not specified
				}
				var reqs []engine.Request
				for range 1 + r.IntN(5) {
					reqs = append(reqs, engine.Request{Key: keys[r.IntN(len(keys))], Cost: []int64{1, 2, 3}[r.IntN(3)]})
				}
				out := make([]engine.Result, len(reqs))
				require.NoError(t, e.AllowBatch(t.Context(), reqs, out))
				want := m.AllowBatch(clk.Now(), reqs)
				log = append(log, fmt.Sprintf("%d batch %v: %+v", op, reqs, want))
				for i := range out {
					out[i].Err = errOf(out[i].Err)
				}
				require.Equal(t, want, out, fail("batch"))
			case 8:
				n1, e1 := e.EvictFull(t.Context())
				n2, e2 := m.EvictFull(clk.Now())
				log = append(log, fmt.Sprintf("%d evict: %d %v", op, n2, e2))
				require.Equal(t, e2, e1, fail("evict"))
				require.Equal(t, n2, n1, fail("evict"))
			case 9, 10:
				ver++
				np := chainPolicy(t, r, ver)
				log = append(log, fmt.Sprintf("%d replace %+v %v", op, np, np.Overrides.Overrides()))
				require.NoError(t, e.ReplacePolicy(t.Context(), np, ver-1), fail("replace"))
				require.NoError(t, m.ReplacePolicy(clk.Now(), np, ver-1))
			case 11:
				if r.IntN(4) != 0 {
					continue // a restore now and then
				}
				var buf bytes.Buffer
				require.NoError(t, e.Snapshot(t.Context(), &buf))
				require.NoError(t, e.Close())
				cfg.Policy = m.Policy()
				cfg.Shards = []int{1, 2, 3}[r.IntN(3)]
				shards = cfg.Shards
				e2, rep, err := engine.Restore(cfg, &buf, engine.RestoreOptions{})
				require.NoError(t, err, fail("restore"))
				log = append(log, fmt.Sprintf("%d restore %+v", op, rep))
				e = e2
			}
			require.Equal(t, m.KeyCount(), e.KeyCount(), fail("key count"))
		}
		require.NoError(t, e.Close())
	}
}
