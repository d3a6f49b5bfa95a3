package engine_test

import (
	"bytes"
	"errors"
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

// TestDifferentialEveryOperation: seeded runs of Allow, Charge, Refund,
// Peek, AllowAll, AllowBatch, EvictFull, cutovers and a snapshot restored
// in place (into another shard count), on a key bound of 1 to 7 keys,
// against the math/big model: every Decision, error, AllowAll index and
// KeyCount, and Stats adding up to the calls made. Costs reach
// math.MaxInt64, and clock steps a quarter of it. The admissiontest differential leaves out Charge,
// Refund, Peek, AllowAll and restores.
func TestDifferentialEveryOperation(t *testing.T) {
	skipUnderRace(t)
	differential(t, diffRun{seeds: 100, stream: 101, ops: 60, policy: randPolicy, huge: true})
}

// TestDifferentialOverrideChains: the same under policies of exact and
// pattern overrides together (a key moving between its exact override, a
// pattern and the default), with and without bands and periods of every
// kind, small costs, and in half of the runs mostly cutovers, so that
// untouched buckets convert across long chains of generations.
func TestDifferentialOverrideChains(t *testing.T) {
	skipUnderRace(t)
	differential(t, diffRun{seeds: 40, stream: 77, ops: 300, policy: chainPolicy, chains: true})
}

// diffRun is one differential: its seeds, the random stream, operations a
// seed, the policies drawn at start and at every cutover, whether costs
// and clock steps reach math.MaxInt64 (huge), and whether half the seeds
// are mostly cutovers and restores rare (chains).
type diffRun struct {
	seeds, stream uint64
	ops           int
	policy        func(testing.TB, *rand.Rand, int64) policy.Policy
	huge, chains  bool
}

func differential(t *testing.T, run diffRun) {
	keys := []string{"k1", "k2", "k3", "x", "y", "z1"}
	pick := func(r *rand.Rand, small, huge []int64) int64 {
		if run.huge {
			small = append(small[:len(small):len(small)], huge...)
		}
		return small[r.IntN(len(small))]
	}
	for seed := range run.seeds {
		r := rand.New(rand.NewPCG(seed, run.stream))
		p := run.policy(t, r, 1)
		clk := clock.NewManual(r.Int64N(1 << 40))
		maxKeys := 1 + r.IntN(len(keys)+1) // up to one more than the keys: a bound some runs never reach
		shards := []int{1, 2, 3, 16}[r.IntN(4)]
		cfg := engine.Config{Policy: p, Shards: shards, Clock: clk, MaxKeys: maxKeys, SweepEvery: -1}
		e, err := engine.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() }) // e as it ends, after restores: a failure must not leak its shards
		m := enginemodel.New(p, maxKeys, 0)
		ver := int64(1)
		var log []string
		calls, allCalls := uint64(0), uint64(0)
		checkStats := func() {
			st := e.Stats()
			tot := st.Total
			got := tot.Allowed + tot.Denied + tot.Peeks + tot.Refunds + tot.Errors.Sum()
			require.Equal(t, calls, got, "seed %d: stats %+v", seed, st)
			a := st.AllowAll
			require.Equal(t, allCalls, a.Admitted+a.Refused+a.Errors.Sum(), "seed %d: allowall stats %+v", seed, a)
		}
		fail := func(what string, args ...any) string {
			return fmt.Sprintf("seed %d shards %d maxKeys %d: %s\nlog:\n%s", seed, shards, maxKeys, fmt.Sprintf(what, args...), joinLines(log))
		}
		cutovers := run.chains && r.IntN(2) == 0
		for op := range run.ops {
			k := keys[r.IntN(len(keys))]
			c := r.IntN(12)
			if cutovers && r.IntN(3) != 0 {
				c = 9
			}
			switch c {
			case 0:
				d := time.Duration(pick(r, []int64{0, 1, 7, 999, 1e8, 1e9, 61e9}, []int64{1 << 40, math.MaxInt64 / 4}))
				clk.Advance(d)
				log = append(log, fmt.Sprintf("%d advance %d -> %d", op, d, clk.Now()))
			case 1:
				n := pick(r, []int64{1, 2, 10, 1 << 40}, []int64{math.MaxInt64})
				calls++
				d1, e1 := e.Charge(t.Context(), k, n)
				d2, e2 := m.Charge(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d charge %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("charge"))
				require.Equal(t, d2, d1, fail("charge"))
			case 2, 3:
				n := pick(r, []int64{1, 2, 3, 10}, []int64{math.MaxInt64})
				calls++
				d1, e1 := e.Allow(t.Context(), k, n)
				d2, e2 := m.Allow(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d allow %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("allow"))
				require.Equal(t, d2, d1, fail("allow"))
			case 4:
				n := pick(r, []int64{1, 2, 10}, []int64{math.MaxInt64})
				calls++
				d1, e1 := e.Refund(t.Context(), k, n)
				d2, e2 := m.Refund(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d refund %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("refund"))
				require.Equal(t, d2, d1, fail("refund"))
			case 5:
				calls++
				d1, e1 := e.Peek(t.Context(), k)
				d2, e2 := m.Peek(clk.Now(), k)
				log = append(log, fmt.Sprintf("%d peek %s: %+v %v", op, k, d2, e2))
				require.Equal(t, e2, e1, fail("peek"))
				require.Equal(t, d2, d1, fail("peek"))
			case 6:
				var reqs []engine.Request
				for range 1 + r.IntN(4) {
					reqs = append(reqs, engine.Request{Key: keys[r.IntN(len(keys))], Cost: pick(r, []int64{1, 2, 3}, []int64{10})})
				}
				d1, at1, e1 := e.AllowAll(t.Context(), reqs)
				allCalls++
				if e1 == nil {
					calls += uint64(len(reqs))
				}
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
					reqs = append(reqs, engine.Request{Key: keys[r.IntN(len(keys))], Cost: pick(r, []int64{1, 2, 3}, []int64{math.MaxInt64})})
				}
				out := make([]engine.Result, len(reqs))
				require.NoError(t, e.AllowBatch(t.Context(), reqs, out))
				calls += uint64(len(reqs))
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
				np := run.policy(t, r, ver)
				log = append(log, fmt.Sprintf("%d replace %+v %v", op, np, np.Overrides.Overrides()))
				require.NoError(t, e.ReplacePolicy(t.Context(), np, ver-1), fail("replace"))
				require.NoError(t, m.ReplacePolicy(clk.Now(), np, ver-1))
			case 11:
				if run.chains && r.IntN(4) != 0 {
					continue // a restore converts every bucket: rare where chains are the point
				}
				var buf bytes.Buffer
				require.NoError(t, e.Snapshot(t.Context(), &buf))
				require.NoError(t, e.Close())
				cfg.Policy = m.Policy()
				cfg.Shards = []int{1, 2, 3, 16}[r.IntN(4)]
				shards = cfg.Shards
				e2, rep, err := engine.Restore(cfg, &buf, engine.RestoreOptions{})
				require.NoError(t, err, fail("restore"))
				log = append(log, fmt.Sprintf("%d snapshot+restore into %d shards: %+v", op, cfg.Shards, rep))
				require.Equal(t, m.KeyCount(), rep.Restored, fail("restore count"))
				checkStats()
				calls, allCalls = 0, 0
				e = e2
			}
			require.Equal(t, m.KeyCount(), e.KeyCount(), fail("key count"))
		}
		checkStats()
		for _, k := range keys {
			d1, e1 := e.Peek(t.Context(), k)
			d2, e2 := m.Peek(clk.Now(), k)
			require.Equal(t, e2, e1, fail("final peek"))
			require.Equal(t, d2, d1, fail("final peek %s", k))
		}
		require.NoError(t, e.Close())
	}
}

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

func errOf(err error) error {
	for _, x := range []error{engine.ErrCostExceedsCapacity, engine.ErrInvalidCost, engine.ErrKeyCapacity, engine.ErrClockRegression, engine.ErrAllowAllSize, engine.ErrInvalidKey} {
		if errors.Is(err, x) {
			return x
		}
	}
	return err
}

func joinLines(s []string) string {
	var b bytes.Buffer
	for _, l := range s {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
