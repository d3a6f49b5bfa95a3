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
)

// TestDifferentialEveryOperation: seeded runs of Allow, Charge, Refund,
// Peek, AllowAll, EvictFull, cutovers and a snapshot restored in place
// (into another shard count), on a key bound of 1 to 5 keys, against the
// math/big model: every Decision, error, AllowAll index and KeyCount, and
// Stats adding up to the calls made. The admissiontest differential leaves
// out Charge, Refund, Peek, AllowAll and restores.
func TestDifferentialEveryOperation(t *testing.T) {
	keys := []string{"k1", "k2", "k3", "x", "y", "z"}
	for seed := range uint64(100) {
		r := rand.New(rand.NewPCG(seed, 101))
		p := randPolicy(t, r, 1)
		clk := clock.NewManual(r.Int64N(1 << 40))
		maxKeys := 1 + r.IntN(5)
		shards := []int{1, 2, 16}[r.IntN(3)]
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
		for op := range 60 {
			k := keys[r.IntN(len(keys))]
			switch r.IntN(11) {
			case 0:
				d := time.Duration([]int64{0, 1, 999, 1e9, 1 << 40, math.MaxInt64 / 4}[r.IntN(6)])
				clk.Advance(d)
				log = append(log, fmt.Sprintf("%d advance %d -> %d", op, d, clk.Now()))
			case 1:
				n := []int64{1, 2, 10, 1 << 40, math.MaxInt64}[r.IntN(5)]
				calls++
				d1, e1 := e.Charge(t.Context(), k, n)
				d2, e2 := m.Charge(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d charge %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("charge"))
				require.Equal(t, d2, d1, fail("charge"))
			case 2, 3:
				n := []int64{1, 2, 10, math.MaxInt64}[r.IntN(4)]
				calls++
				d1, e1 := e.Allow(t.Context(), k, n)
				d2, e2 := m.Allow(clk.Now(), k, n)
				log = append(log, fmt.Sprintf("%d allow %s %d: %+v %v", op, k, n, d2, e2))
				require.Equal(t, e2, e1, fail("allow"))
				require.Equal(t, d2, d1, fail("allow"))
			case 4:
				n := []int64{1, 2, 10, math.MaxInt64}[r.IntN(4)]
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
			case 6, 7:
				var reqs []engine.Request
				for range 1 + r.IntN(4) {
					reqs = append(reqs, engine.Request{Key: keys[r.IntN(len(keys))], Cost: []int64{1, 2, 3, 10}[r.IntN(4)]})
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
			case 8:
				n1, e1 := e.EvictFull(t.Context())
				n2, e2 := m.EvictFull(clk.Now())
				log = append(log, fmt.Sprintf("%d evict: %d %v", op, n2, e2))
				require.Equal(t, e2, e1, fail("evict"))
				require.Equal(t, n2, n1, fail("evict"))
			case 9:
				ver++
				np := randPolicy(t, r, ver)
				log = append(log, fmt.Sprintf("%d replace %+v", op, np))
				require.NoError(t, e.ReplacePolicy(t.Context(), np, ver-1), fail("replace"))
				require.NoError(t, m.ReplacePolicy(clk.Now(), np, ver-1))
			case 10:
				var buf bytes.Buffer
				require.NoError(t, e.Snapshot(t.Context(), &buf))
				require.NoError(t, e.Close())
				cfg.Policy = m.Policy()
				cfg.Shards = []int{1, 2, 16}[r.IntN(3)]
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
