package engine_test

// Concurrency tests: the key bound under concurrent creation and eviction,
// one winner among racing cutovers, real-time version order, done contexts,
// Close racing everything, and callers blocked on a full mailbox. Workers
// report through channels; only the test goroutine calls require/assert.
// Nothing sleeps: Manual clocks are driven by hand, and goroutines are
// synchronised with channels, WaitGroups and synctest.Wait.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// ccOp is one step of a sequential workload.
type ccOp struct {
	kind    int // 0 Allow, 1 advance, 2 EvictFull, 3 ReplacePolicy
	key     string
	cost    int64
	advance time.Duration
	next    policy.Policy
	expect  int64 // expectedVersion for ReplacePolicy; may be stale
}

// ccWorkload returns n seeded sequential steps over a small key space, with
// bad keys, bad and over-capacity costs, stale cutovers and evictions.
func ccWorkload(seed uint64, n int) []ccOp {
	rng := rand.New(rand.NewPCG(seed, 0))
	badKeys := []string{"", "   ", "\t\n", "this-key-is-far-too-long-for-the-limit"}
	version := int64(1)
	ops := make([]ccOp, 0, n)
	for range n {
		switch p := rng.IntN(100); {
		case p < 75:
			key := fmt.Sprintf("k%d", rng.IntN(40))
			if rng.IntN(20) == 0 {
				key = badKeys[rng.IntN(len(badKeys))]
			}
			cost := 1 + rng.Int64N(4)
			if rng.IntN(15) == 0 {
				cost = []int64{0, -1, 25}[rng.IntN(3)]
			}
			ops = append(ops, ccOp{kind: 0, key: key, cost: cost})
		case p < 88:
			ops = append(ops, ccOp{kind: 1, advance: time.Duration(rng.Int64N(int64(2 * time.Second)))})
		case p < 95:
			ops = append(ops, ccOp{kind: 2})
		default:
			expect := version
			if rng.IntN(4) == 0 {
				expect = version - 1 // stale on purpose
			}
			next := pol(version+1, 1+rng.Int64N(20), 1+rng.Int64N(5))
			if expect == version {
				version++
			}
			ops = append(ops, ccOp{kind: 3, next: next, expect: expect})
		}
	}
	return ops
}

// ccRun plays ops on a fresh engine and returns a transcript of every answer.
func ccRun(t *testing.T, shards int, ops []ccOp) []string {
	t.Helper()
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 8, 2), Shards: shards, MaxKeys: 25, MaxKeyBytes: 16})
	ctx := context.Background()
	out := make([]string, 0, len(ops)+1)
	for _, op := range ops {
		switch op.kind {
		case 0:
			d, err := e.Allow(ctx, op.key, op.cost)
			out = append(out, fmt.Sprintf("Allow(%q, %d) = %+v, %v; keys %d", op.key, op.cost, d, err, e.KeyCount()))
		case 1:
			clk.Advance(op.advance)
			out = append(out, fmt.Sprintf("advance %v", op.advance))
		case 2:
			n, err := e.EvictFull(ctx)
			out = append(out, fmt.Sprintf("EvictFull = %d, %v; keys %d", n, err, e.KeyCount()))
		case 3:
			err := e.ReplacePolicy(ctx, op.next, op.expect)
			out = append(out, fmt.Sprintf("ReplacePolicy(%+v, %d) = %v; policy %+v", op.next, op.expect, err, e.Policy()))
		}
	}
	return append(out, fmt.Sprintf("final keys %d", e.KeyCount()))
}

// TestShardCountsAgreeOnSequentialWorkload: sharding is invisible to a
// sequential caller. The same seeded workload of Allow, clock steps,
// EvictFull and ReplacePolicy (some stale), under a key bound it reaches,
// gives the same transcript with every shard count as with one shard.
func TestShardCountsAgreeOnSequentialWorkload(t *testing.T) {
	seeds := []uint64{1, 2, 3, ccSeed(t)}
	for _, seed := range seeds {
		ops := ccWorkload(seed, 1500)
		want := ccRun(t, 1, ops)
		for _, shards := range shardCounts[1:] {
			t.Run(fmt.Sprintf("seed=%d/shards=%d", seed, shards), func(t *testing.T) {
				got := ccRun(t, shards, ops)
				for i := range want {
					require.Equal(t, want[i], got[i], "seed %d, step %d: shards=1 vs shards=%d", seed, i, shards)
				}
			})
		}
	}
}
