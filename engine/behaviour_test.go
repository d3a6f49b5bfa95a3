package engine_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// The behaviour suite: worked examples a reader can check by hand against the
// package doc's formulas, run through the public engine with a clock.Manual
// over every shard count. Names here carry a behav prefix because other files
// of this package are written alongside.

// behavStep is one request of a worked example: at clock reading at, spend
// cost on the example's key, and get exactly want.
type behavStep struct {
	name string
	at   int64
	cost int64
	want engine.Decision
}

// behavFirstExample is the first worked example: capacity 10, 2 tokens/s.
// At 2/s one token takes 500ms, so ResetAfter is 500ms per missing token.
var behavFirstExample = []behavStep{
	{
		name: "t=0 cost 10 takes the whole burst",
		at:   0, cost: 10,
		want: engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second},
	},
	{
		name: "t=0 cost 1 is denied for exactly one token's worth",
		at:   0, cost: 1,
		want: engine.Decision{Remaining: 0, RetryAfter: 500_000_000, Version: 1, Limit: 10, ResetAfter: 5 * time.Second},
	},
	{
		name: "t=250ms cost 1 is denied, half a token earned",
		at:   250_000_000, cost: 1,
		want: engine.Decision{Remaining: 0, RetryAfter: 250_000_000, Version: 1, Limit: 10, ResetAfter: 4_750_000_000},
	},
	{
		// Allowed only if the denial at 250ms kept its half token.
		name: "t=500ms cost 1 is allowed",
		at:   500_000_000, cost: 1,
		want: engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second},
	},
}

// behavEachShards runs f as one subtest per entry of shardCounts.
func behavEachShards(t *testing.T, f func(t *testing.T, shards int)) {
	t.Helper()
	for _, n := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", n), func(t *testing.T) { f(t, n) })
	}
}

// behavAllow calls Allow and requires it to succeed.
func behavAllow(t *testing.T, e *engine.Engine, key string, cost int64, msgAndArgs ...any) engine.Decision {
	t.Helper()
	d, err := e.Allow(t.Context(), key, cost)
	require.NoError(t, err, msgAndArgs...)
	return d
}

func TestBehaviourFirstExample(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		t.Run("via=Allow", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			for _, s := range behavFirstExample {
				clk.Set(s.at)
				assert.Equal(t, s.want, behavAllow(t, e, "user", s.cost, s.name), s.name)
			}
		})
		t.Run("via=AllowBatch one request per call", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			for _, s := range behavFirstExample {
				clk.Set(s.at)
				out := make([]engine.Result, 1)
				require.NoError(t, e.AllowBatch(t.Context(), []engine.Request{{Key: "user", Cost: s.cost}}, out), s.name)
				require.NoError(t, out[0].Err, s.name)
				assert.Equal(t, s.want, out[0].Decision, s.name)
			}
		})
	})
}

// TestBehaviourFirstExampleOneBatch decides the first example's costs as one
// batch at t=0 and checks it equals the same Allow calls one by one at t=0.
func TestBehaviourFirstExampleOneBatch(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		reqs := make([]engine.Request, len(behavFirstExample))
		for i, s := range behavFirstExample {
			reqs[i] = engine.Request{Key: "user", Cost: s.cost}
		}
		// At one instant the half token of the 250ms step is never earned.
		denied := engine.Decision{RetryAfter: 500_000_000, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}
		want := []engine.Decision{
			{Allowed: true, Version: 1, Limit: 10, ResetAfter: 5 * time.Second},
			denied, denied, denied,
		}

		batched, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		out := make([]engine.Result, len(reqs))
		require.NoError(t, batched.AllowBatch(t.Context(), reqs, out))

		single, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		for i, r := range reqs {
			d := behavAllow(t, single, r.Key, r.Cost)
			require.NoError(t, out[i].Err, "request %d", i)
			assert.Equal(t, d, out[i].Decision, "request %d: batch and Allow differ", i)
			assert.Equal(t, want[i], out[i].Decision, "request %d", i)
		}
		assert.Equal(t, 1, batched.KeyCount())
	})
}

func TestBehaviourThirdOfASecond(t *testing.T) {
	const (
		justShort int64 = 333_333_333 // 999,999,999 units earned: one short
		justThere int64 = 333_333_334 // ceil(1e9/3)
	)
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 1, 3), Shards: shards})
		emptied := engine.Decision{Allowed: true, Version: 1, Limit: 1, ResetAfter: time.Duration(justThere)}
		// "denied" is denied at justShort and asked again at justThere; "fresh"
		// is asked only at justThere, so the denial cannot have helped either.
		assert.Equal(t, emptied, behavAllow(t, e, "denied", 1))
		assert.Equal(t, emptied, behavAllow(t, e, "fresh", 1))

		clk.Set(justShort)
		assert.Equal(t,
			engine.Decision{Remaining: 0, RetryAfter: 1, Version: 1, Limit: 1, ResetAfter: 1},
			behavAllow(t, e, "denied", 1), "one unit short at %d ns", justShort)

		clk.Set(justThere)
		assert.Equal(t, emptied, behavAllow(t, e, "denied", 1), "after a denial, at %d ns", justThere)
		assert.Equal(t, emptied, behavAllow(t, e, "fresh", 1), "with no denial, at %d ns", justThere)
	})
}

// behavOutcome carries one concurrent caller's answer back to the test.
type behavOutcome struct {
	key string
	d   engine.Decision
	err error
}

func TestBehaviourTwentyCallersOneInstant(t *testing.T) {
	const callers = 20
	keys := []string{"hot", "hot-1", "hot-2", "hot-3"}
	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		start := make(chan struct{})
		results := make(chan behavOutcome, callers*len(keys))
		var wg sync.WaitGroup
		for _, key := range keys {
			for range callers {
				wg.Go(func() {
					<-start // release them together for the most contention
					d, err := e.Allow(t.Context(), key, 1)
					results <- behavOutcome{key: key, d: d, err: err}
				})
			}
		}
		close(start)
		wg.Wait()
		close(results)

		remaining := make(map[string][]int64)
		for r := range results {
			require.NoError(t, r.err, r.key)
			if !r.d.Allowed {
				// The clock never moved, so every denial sees an empty bucket.
				assert.Equal(t, engine.Decision{RetryAfter: 500_000_000, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, r.d, r.key)
				continue
			}
			assert.Equal(t, engine.Decision{
				Allowed: true, Remaining: r.d.Remaining, Version: 1, Limit: 10,
				ResetAfter: time.Duration(10-r.d.Remaining) * 500 * time.Millisecond,
			}, r.d, r.key)
			remaining[r.key] = append(remaining[r.key], r.d.Remaining)
		}
		for _, key := range keys {
			got := remaining[key]
			sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
			// Exactly 10 allowed, and each saw a distinct balance: the decisions
			// were serialized, none was lost or doubled.
			assert.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, got, "allowed Remaining values for %s", key)
		}
		assert.Equal(t, len(keys), e.KeyCount())
	})
}

func TestBehaviourEvictFull(t *testing.T) {
	const depleted = 12
	deplete := func(t *testing.T, e *engine.Engine) {
		t.Helper()
		for i := range depleted {
			d := behavAllow(t, e, fmt.Sprintf("key-%d", i), 10)
			require.True(t, d.Allowed)
			require.Zero(t, d.Remaining)
		}
		require.Equal(t, depleted, e.KeyCount())
	}
	behavEachShards(t, func(t *testing.T, shards int) {
		t.Run("example", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			deplete(t, e)

			clk.Set(500_000_000)
			n, err := e.EvictFull(t.Context())
			require.NoError(t, err)
			assert.Zero(t, n, "EvictFull at 0.5s removed depleted keys")
			assert.Equal(t, depleted, e.KeyCount())
			// Each survivor holds exactly the 1 token it earned: not dropped,
			// not recreated full.
			for i := range depleted {
				assert.Equal(t,
					engine.Decision{Remaining: 1, RetryAfter: 500_000_000, Version: 1, Limit: 10, ResetAfter: 4_500_000_000},
					behavAllow(t, e, fmt.Sprintf("key-%d", i), 2), "key-%d at 0.5s", i)
			}

			clk.Set(5_500_000_000)
			n, err = e.EvictFull(t.Context())
			require.NoError(t, err)
			assert.Equal(t, depleted, n, "EvictFull at 5.5s")
			assert.Zero(t, e.KeyCount())
		})
		t.Run("boundary is exactly full", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			deplete(t, e)

			clk.Set(4_999_999_999) // one nanosecond, two units, short of full
			n, err := e.EvictFull(t.Context())
			require.NoError(t, err)
			assert.Zero(t, n)
			assert.Equal(t, depleted, e.KeyCount())

			clk.Set(5_000_000_000)
			n, err = e.EvictFull(t.Context())
			require.NoError(t, err)
			assert.Equal(t, depleted, n)
			assert.Zero(t, e.KeyCount())
		})
		t.Run("partly refilled is never evicted however old", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			behavAllow(t, e, "old", 10) // t=0: empty, full again only at 5s
			clk.Set(4_000_000_000)
			for i := range depleted {
				behavAllow(t, e, fmt.Sprintf("young-%d", i), 1) // full again at 4.5s
			}

			clk.Set(4_900_000_000)
			n, err := e.EvictFull(t.Context())
			require.NoError(t, err)
			assert.Equal(t, depleted, n, "the young keys are full, the old one is not")
			assert.Equal(t, 1, e.KeyCount())
			// "old" kept its 9.8 tokens: 9 whole, 0.2 s short of 10.
			assert.Equal(t,
				engine.Decision{Remaining: 9, RetryAfter: 100_000_000, Version: 1, Limit: 10, ResetAfter: 100_000_000},
				behavAllow(t, e, "old", 10))
		})
		t.Run("evicted and recreated starts full", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			deplete(t, e)
			clk.Set(5_500_000_000)
			n, err := e.EvictFull(t.Context())
			require.NoError(t, err)
			require.Equal(t, depleted, n)

			for i := range depleted {
				assert.Equal(t,
					engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second},
					behavAllow(t, e, fmt.Sprintf("key-%d", i), 10), "recreated key-%d", i)
			}
			assert.Equal(t, depleted, e.KeyCount())
		})
	})
}

func TestBehaviourCutover(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		// cutEmpty empties "user" at t=0 under capacity 10, 2/s and cuts over
		// at 0.5s to capacity 20, 4/s.
		cutEmpty := func(t *testing.T) (*engine.Engine, func(int64)) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			require.True(t, behavAllow(t, e, "user", 10).Allowed)
			clk.Set(500_000_000)
			require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 20, 4), 1))
			require.Equal(t, pol(2, 20, 4), e.Policy())
			return e, clk.Set
		}
		t.Run("exactly 1 token at the cutover", func(t *testing.T) {
			e, _ := cutEmpty(t)
			// Cost 2 is denied with exactly one token short at the new rate:
			// the key holds 1 token, not 2 (new rate from 0) nor 20.
			assert.Equal(t,
				engine.Decision{Remaining: 1, RetryAfter: 250_000_000, Version: 2, Limit: 20, ResetAfter: 4_750_000_000},
				behavAllow(t, e, "user", 2))
			assert.Equal(t,
				engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 20, ResetAfter: 5 * time.Second},
				behavAllow(t, e, "user", 1))
		})
		t.Run("exactly 2 tokens at 0.75s", func(t *testing.T) {
			e, set := cutEmpty(t)
			set(750_000_000)
			assert.Equal(t,
				engine.Decision{Remaining: 2, RetryAfter: 250_000_000, Version: 2, Limit: 20, ResetAfter: 4_500_000_000},
				behavAllow(t, e, "user", 3))
			assert.Equal(t,
				engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 20, ResetAfter: 5 * time.Second},
				behavAllow(t, e, "user", 2))
		})
		t.Run("new keys start at the new capacity", func(t *testing.T) {
			e, set := cutEmpty(t)
			assert.Equal(t,
				engine.Decision{Allowed: true, Remaining: 19, Version: 2, Limit: 20, ResetAfter: 250_000_000},
				behavAllow(t, e, "newcomer", 1))
			set(750_000_000)
			assert.Equal(t,
				engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 20, ResetAfter: 5 * time.Second},
				behavAllow(t, e, "latecomer", 20))
		})
		t.Run("raising capacity never tops up", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
			require.Equal(t, int64(9), behavAllow(t, e, "full", 1).Remaining)
			clk.Set(time.Second.Nanoseconds()) // "full" is full again: 10 tokens
			require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 20, 4), 1))
			// 10 tokens, not 20: 9 left, 11 missing at 4/s.
			assert.Equal(t,
				engine.Decision{Allowed: true, Remaining: 9, Version: 2, Limit: 20, ResetAfter: 2_750_000_000},
				behavAllow(t, e, "full", 1))
		})
		t.Run("lowering capacity clamps", func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 20, 4), Shards: shards})
			require.Equal(t, int64(19), behavAllow(t, e, "high", 1).Remaining)
			require.Equal(t, int64(3), behavAllow(t, e, "low", 17).Remaining)
			clk.Set(250_000_000) // "high" is full again: 20; "low" holds 4
			require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 5, 1), 1))
			assert.Equal(t,
				engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 5, ResetAfter: 5 * time.Second},
				behavAllow(t, e, "high", 5), "20 tokens clamp to 5")
			assert.Equal(t,
				engine.Decision{Remaining: 4, RetryAfter: time.Second, Version: 2, Limit: 5, ResetAfter: time.Second},
				behavAllow(t, e, "low", 5), "4 tokens stay 4")
			_, err := e.Allow(t.Context(), "high", 6)
			assert.ErrorIs(t, err, engine.ErrInvalidCost, "cost above the new capacity")
		})
	})
}

func TestBehaviourReplacePolicyVersion(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		keys := make([]string, 64)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%d", i)
			assert.Equal(t, int64(1), behavAllow(t, e, keys[i], 1).Version)
		}
		clk.Set(time.Second.Nanoseconds())
		next := pol(2, 30, 7)
		require.NoError(t, e.ReplacePolicy(t.Context(), next, 1))
		assert.Equal(t, next, e.Policy())
		for _, key := range append(keys, "brand-new-1", "brand-new-2") {
			d := behavAllow(t, e, key, 1)
			assert.Equal(t, int64(2), d.Version, key)
			assert.Equal(t, int64(30), d.Limit, key)
		}
		out := make([]engine.Result, len(keys))
		reqs := make([]engine.Request, len(keys))
		for i, k := range keys {
			reqs[i] = engine.Request{Key: k, Cost: 1}
		}
		require.NoError(t, e.AllowBatch(t.Context(), reqs, out))
		for i, r := range out {
			require.NoError(t, r.Err, keys[i])
			assert.Equal(t, int64(2), r.Decision.Version, keys[i])
		}
	})
}

// TestBehaviourBatchEqualsAllow plays random batches, valid and invalid
// requests mixed over keys on many shards, against one engine and the same
// requests one by one through Allow against another at the same instants:
// results and the state after (seen through the following rounds) agree.
func TestBehaviourBatchEqualsAllow(t *testing.T) {
	for _, seed := range []uint64{7, 8, 9} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			behavEachShards(t, func(t *testing.T, shards int) {
				r := rand.New(rand.NewPCG(seed, 0xba7c4))
				cfg := engine.Config{Policy: pol(1, 5, 3), Shards: shards}
				batched, bclk := newEngine(t, cfg)
				single, sclk := newEngine(t, cfg)
				for round := range 40 {
					d := time.Duration(r.Int64N(700_000_000))
					bclk.Advance(d)
					sclk.Advance(d)
					reqs := make([]engine.Request, 1+r.IntN(24))
					for i := range reqs {
						reqs[i] = engine.Request{Key: fmt.Sprintf("key-%d", r.IntN(12)), Cost: 1 + r.Int64N(5)}
						switch r.IntN(12) {
						case 0:
							reqs[i].Key = " \t"
						case 1:
							reqs[i].Cost = 0
						case 2:
							reqs[i].Cost = 6 // above capacity
						}
					}
					out := make([]engine.Result, len(reqs))
					require.NoError(t, batched.AllowBatch(t.Context(), reqs, out), "seed=%d round %d", seed, round)
					for i, q := range reqs {
						d, err := single.Allow(t.Context(), q.Key, q.Cost)
						require.Equal(t, err, out[i].Err, "seed=%d round %d request %d %+v", seed, round, i, q)
						require.Equal(t, d, out[i].Decision, "seed=%d round %d request %d %+v", seed, round, i, q)
					}
					require.Equal(t, single.KeyCount(), batched.KeyCount(), "seed=%d round %d", seed, round)
				}
			})
		})
	}
}
