package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

func overrides(t *testing.T, os ...policy.Override) *policy.OverrideSet {
	t.Helper()
	set, err := policy.NewOverrideSet(os...)
	require.NoError(t, err)
	return set
}

// twin drives an engine and the math/big model with the same calls at the
// same readings, and requires identical answers: every unit of every
// balance shows in Remaining, RetryAfter and ResetAfter.
type twin struct {
	t   *testing.T
	e   *engine.Engine
	m   *enginemodel.Model
	clk interface{ Set(int64) }
	now int64
}

func newTwin(t *testing.T, shards int, p policy.Policy, maxKeys int) *twin {
	e, clk := newEngine(t, engine.Config{Policy: p, Shards: shards, MaxKeys: maxKeys})
	return &twin{t: t, e: e, m: enginemodel.New(p, maxKeys, 0), clk: clk}
}

func (w *twin) at(now time.Duration) *twin {
	w.now = int64(now)
	w.clk.Set(w.now)
	return w
}

func (w *twin) allow(key string, cost int64) (engine.Decision, error) {
	w.t.Helper()
	got, err := w.e.Allow(context.Background(), key, cost)
	want, wantErr := w.m.Allow(w.now, key, cost)
	require.Equal(w.t, wantErr, err, "Allow(%q, %d) at %v", key, cost, time.Duration(w.now))
	require.Equal(w.t, want, got, "Allow(%q, %d) at %v", key, cost, time.Duration(w.now))
	return got, err
}

func (w *twin) replace(next policy.Policy) {
	w.t.Helper()
	cur := w.e.Policy()
	require.NoError(w.t, w.e.ReplacePolicy(context.Background(), next, cur.Version))
	require.NoError(w.t, w.m.ReplacePolicy(w.now, next, cur.Version))
}

func (w *twin) evict() int {
	w.t.Helper()
	n, err := w.e.EvictFull(context.Background())
	require.NoError(w.t, err)
	want, err := w.m.EvictFull(w.now)
	require.NoError(w.t, err)
	require.Equal(w.t, want, n, "EvictFull at %v", time.Duration(w.now))
	return n
}

// TestOverridesResolve: a new key gets its own limit, which is its cost
// bound and its Decision.Limit; Version stays the policy's.
func TestOverridesResolve(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			set := overrides(t,
				policy.Override{Match: "tenant:acme", Capacity: 100, TokensPerSecond: 10},
				policy.Override{Match: "*:login", Capacity: 3, TokensPerSecond: 1},
			)
			p := policy.Policy{Version: 4, Capacity: 10, TokensPerSecond: 1, Overrides: set}
			w := newTwin(t, shards, p, 100)
			assert.Same(t, set, w.e.Policy().Overrides, "Policy returns the installed set itself")

			d, err := w.allow("tenant:acme", 60) // above the default capacity, within its own
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 40, Version: 4, Limit: 100, ResetAfter: 6 * time.Second}, d)

			_, err = w.allow("bob:login", 4) // below the default capacity, above its own
			assert.ErrorIs(t, err, engine.ErrInvalidCost)
			d, err = w.allow("bob:login", 3)
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 4, Limit: 3, ResetAfter: 3 * time.Second}, d)

			_, err = w.allow("someone", 11)
			assert.ErrorIs(t, err, engine.ErrInvalidCost)
			d, err = w.allow("someone", 10)
			require.NoError(t, err)
			assert.Equal(t, int64(10), d.Limit)
		})
	}
}

// TestOverridesCostBoundAtMaxKeys: at the key bound, a new key whose cost is
// above its own capacity is ErrInvalidCost: it is resolved before the bound
// is consulted.
func TestOverridesCostBoundAtMaxKeys(t *testing.T) {
	set := overrides(t, policy.Override{Match: "small:*", Capacity: 2, TokensPerSecond: 1})
	w := newTwin(t, 1, policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: set}, 1)
	_, err := w.allow("first", 1)
	require.NoError(t, err)
	_, err = w.allow("small:x", 3)
	assert.ErrorIs(t, err, engine.ErrInvalidCost)
	_, err = w.allow("small:x", 2)
	assert.ErrorIs(t, err, engine.ErrKeyCapacity)
	_, err = w.allow("big", 11)
	assert.ErrorIs(t, err, engine.ErrInvalidCost)
	_, err = w.allow("big", 10)
	assert.ErrorIs(t, err, engine.ErrKeyCapacity)
}

// TestOverridesCutover covers a key's three moves at a cutover, each checked
// against the model to the unit and against the hand computation:
//   - default -> override with a higher capacity: no top-up;
//   - override -> default with a lower capacity: clamped;
//   - an override's rate changes mid-way: the old rate earns up to the
//     cutover, the new rate after it.
func TestOverridesCutover(t *testing.T) {
	const ms = time.Millisecond
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2, Overrides: overrides(t,
				policy.Override{Match: "vip:*", Capacity: 50, TokensPerSecond: 5},
				policy.Override{Match: "metered", Capacity: 20, TokensPerSecond: 4},
			)}
			w := newTwin(t, shards, v1, 100)
			w.at(0)
			_, _ = w.allow("promoted", 10) // default: 0 of 10 left
			_, _ = w.allow("vip:demoted", 50)
			_, _ = w.allow("vip:demoted", 0+1) // denied: the bucket is empty
			_, _ = w.allow("metered", 20)      // 0 of 20 at 4/s
			_, _ = w.allow("vip:full", 1)      // 49 of 50: full again by 0.2 s

			// At 1.5 s: promoted has earned 3 (2/s), vip:demoted 7.5 (5/s),
			// metered 6 (4/s), and vip:full is full at 50. The cutover gives
			// promoted an override of capacity 100 (no top-up: it keeps 3),
			// puts both vip keys back on the default of 10 (vip:full is
			// clamped from 50 to 10; vip:demoted's 7.5 fits), and slows
			// metered to 1/s.
			w.at(1500 * ms)
			v2 := policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 2, Overrides: overrides(t,
				policy.Override{Match: "promoted", Capacity: 100, TokensPerSecond: 50},
				policy.Override{Match: "metered", Capacity: 20, TokensPerSecond: 1},
			)}
			w.replace(v2)

			w.at(1600 * ms) // promoted: 3 + 0.1 s at 50/s = 8
			d, _ := w.allow("promoted", 1)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 7, Version: 2, Limit: 100, ResetAfter: 1860 * ms}, d)
			d, _ = w.allow("vip:demoted", 1) // 7.5 + 0.1 s at 2/s = 7.7, less 1
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 6, Version: 2, Limit: 10, ResetAfter: 1650 * ms}, d)
			d, _ = w.allow("metered", 7) // 6 + 0.1 s at 1/s = 6.1: not enough
			assert.Equal(t, engine.Decision{Allowed: false, Remaining: 6, RetryAfter: 900 * ms, Version: 2, Limit: 20, ResetAfter: 13900 * ms}, d)

			d, _ = w.allow("vip:full", 1) // clamped to 10 at the cutover, less 1
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 2, Limit: 10, ResetAfter: 500 * ms}, d)

			// An override dropped at 2 s: promoted goes back to the default
			// of 10, clamped.
			w.at(2 * time.Second)
			w.replace(policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2})
			d, _ = w.allow("promoted", 1) // 7 + 0.4 s at 50/s = 27, clamped to 10, less 1
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 3, Limit: 10, ResetAfter: 500 * ms}, d)
		})
	}
}

// TestOverridesEvictAndReturn: EvictFull judges each key by its own
// capacity, and an evicted key that returns resolves afresh under the policy
// then in force.
func TestOverridesEvictAndReturn(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 10, Overrides: overrides(t,
				policy.Override{Match: "slow", Capacity: 10, TokensPerSecond: 1},
				policy.Override{Match: "big:*", Capacity: 1000, TokensPerSecond: 10},
			)}
			w := newTwin(t, shards, v1, 100)
			w.at(0)
			for _, k := range []string{"slow", "big:a", "plain"} {
				_, _ = w.allow(k, 5)
			}
			// At 1 s: plain is full (10/s), slow is at 6 of 10 (1/s), and
			// big:a has reached its own capacity of 1000 (995 + 10/s).
			w.at(time.Second)
			assert.Equal(t, 2, w.evict())
			assert.Equal(t, 1, w.e.KeyCount())

			// big:a returns under a policy that no longer overrides it.
			w.replace(policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 10})
			d, _ := w.allow("big:a", 10)
			assert.Equal(t, int64(10), d.Limit)
			_, err := w.allow("big:a", 11)
			assert.ErrorIs(t, err, engine.ErrInvalidCost)
		})
	}
}

// TestOverridesTrace runs a longer mixed trace over overrides, cutovers and
// sweeps against the model, on several shard counts.
func TestOverridesTrace(t *testing.T) {
	sets := []*policy.OverrideSet{
		nil,
		overrides(t, policy.Override{Match: "k1", Capacity: 30, TokensPerSecond: 7}, policy.Override{Match: "k*", Capacity: 4, TokensPerSecond: 3}),
		overrides(t, policy.Override{Match: "*2", Capacity: 9, TokensPerSecond: 1}, policy.Override{Match: "k3", Capacity: 50, TokensPerSecond: 11}),
		overrides(t, policy.Override{Match: "*", Capacity: 6, TokensPerSecond: 2}),
	}
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			w := newTwin(t, shards, policy.Policy{Version: 1, Capacity: 12, TokensPerSecond: 5, Overrides: sets[1]}, 6)
			now := time.Duration(0)
			for step := range 600 {
				now += time.Duration(step%7) * 37 * time.Millisecond
				w.at(now)
				switch {
				case step%97 == 96:
					w.evict()
				case step%41 == 40:
					cur := w.e.Policy()
					w.replace(policy.Policy{Version: cur.Version + 1, Capacity: 5 + int64(step%13), TokensPerSecond: 1 + int64(step%4), Overrides: sets[step%len(sets)]})
				default:
					_, _ = w.allow(fmt.Sprintf("k%d", step%9), 1+int64(step%5))
				}
			}
		})
	}
}
