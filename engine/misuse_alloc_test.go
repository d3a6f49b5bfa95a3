//go:build !race

// The race detector makes sync.Pool drop items on purpose, so these run only
// without -race, as alloc_test.go's do.

package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
)

// TestMisuseDoesNotAllocate: the answers to misuse are preallocated errors,
// like every other rejection: a cost above capacity (decided by the shard),
// a cost below 1, a nil context and a zero Engine allocate nothing, single
// or batched.
func TestMisuseDoesNotAllocate(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			ctx := context.Background()
			reqs := []engine.Request{{Key: "a", Cost: 11}, {Key: "b", Cost: 12}, {Key: "a", Cost: 0}, {Key: "c", Cost: 1 << 40}}
			out := make([]engine.Result, len(reqs))
			var zero engine.Engine
			calls := []struct {
				name string
				call func() error
			}{
				{"Allow above capacity", func() error { _, err := e.Allow(ctx, "a", 11); return err }},
				{"AllowBatch above capacity", func() error {
					if err := e.AllowBatch(ctx, reqs, out); err != nil {
						return err
					}
					return out[0].Err
				}},
				{"Allow cost 0", func() error { _, err := e.Allow(ctx, "a", 0); return err }},
				{"Allow nil context", func() error { _, err := e.Allow(nilCtx, "a", 1); return err }},
				{"AllowBatch nil context", func() error { return e.AllowBatch(nilCtx, reqs, out) }},
				{"Allow zero Engine", func() error { _, err := zero.Allow(ctx, "a", 1); return err }},
				{"AllowBatch zero Engine", func() error { return zero.AllowBatch(ctx, reqs, out) }},
			}
			for _, c := range calls {
				for range 3 { // warm up: fill the pools
					if c.call() == nil {
						t.Fatalf("%s: no error", c.name)
					}
				}
				if n := testing.AllocsPerRun(200, func() {
					if c.call() == nil {
						t.Fatalf("%s: no error", c.name)
					}
				}); n != 0 {
					t.Errorf("%s: %v allocations per call, want 0", c.name, n)
				}
			}
		})
	}
}
