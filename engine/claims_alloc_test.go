//go:build !race

// The race detector makes sync.Pool drop items on purpose, so these run only
// without it, as alloc_test.go's do.

package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/engine"
)

// TestPeekAndRefundDoNotAllocate: Peek does not allocate, and neither
// does Refund, which answers like it, for keys tracked or not.
func TestPeekAndRefundDoNotAllocate(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			ctx := context.Background()
			_, err := e.Allow(ctx, "a", 5)
			if err != nil {
				t.Fatal(err)
			}
			requireNoAllocs(t, map[string]func() error{
				"Peek":               func() error { _, err := e.Peek(ctx, "a"); return err },
				"Peek not tracked":   func() error { _, err := e.Peek(ctx, "b"); return err },
				"Refund":             func() error { _, err := e.Refund(ctx, "a", 1); return err },
				"Refund not tracked": func() error { _, err := e.Refund(ctx, "b", 1); return err },
			})
		})
	}
}

// TestRejectionsDoNotAllocate: the errors are these very values, so a
// rejected request allocates nothing: a done context, the key bound, a
// clock that stepped back, and every call after Close, besides the misuses
// TestMisuseDoesNotAllocate covers.
func TestRejectionsDoNotAllocate(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			clk := newErrsClock(int64(time.Hour))
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards, MaxKeys: 2, Clock: clk})
			ctx := context.Background()
			canceled, cancel := context.WithCancel(ctx)
			cancel()
			for _, k := range []string{"a", "b"} {
				if _, err := e.Allow(ctx, k, 1); err != nil {
					t.Fatal(err)
				}
			}
			reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}}
			newKey := []engine.Request{{Key: "a", Cost: 1}, {Key: "new", Cost: 1}}
			var out [2]engine.Result
			batch := func(ctx context.Context, reqs []engine.Request) error {
				if err := e.AllowBatch(ctx, reqs, out[:]); err != nil {
					return err
				}
				return cmpOr(out[0].Err, out[1].Err)
			}
			all := func(ctx context.Context, reqs []engine.Request) error { _, _, err := e.AllowAll(ctx, reqs); return err }
			calls := map[string]func() error{
				"Allow done context":      func() error { _, err := e.Allow(canceled, "a", 1); return err },
				"Peek done context":       func() error { _, err := e.Peek(canceled, "a"); return err },
				"Refund done context":     func() error { _, err := e.Refund(canceled, "a", 1); return err },
				"Charge done context":     func() error { _, err := e.Charge(canceled, "a", 1); return err },
				"AllowBatch done context": func() error { return batch(canceled, reqs) },
				"AllowAll done context":   func() error { return all(canceled, reqs) },
				"Allow key bound":         func() error { _, err := e.Allow(ctx, "new", 1); return err },
				"Charge key bound":        func() error { _, err := e.Charge(ctx, "new", 1); return err },
				"AllowBatch key bound":    func() error { return batch(ctx, newKey) },
				"AllowAll key bound":      func() error { return all(ctx, newKey) },
				"Refund cost 0":           func() error { _, err := e.Refund(ctx, "a", 0); return err },
			}
			requireAllocsFree(t, calls)
			clk.Set(0) // before every shard's last reading
			requireAllocsFree(t, map[string]func() error{
				"Allow clock regression":      func() error { _, err := e.Allow(ctx, "a", 1); return err },
				"Peek clock regression":       func() error { _, err := e.Peek(ctx, "a"); return err },
				"AllowBatch clock regression": func() error { return batch(ctx, reqs) },
			})
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			requireAllocsFree(t, map[string]func() error{
				"Allow closed":      func() error { _, err := e.Allow(ctx, "a", 1); return err },
				"Peek closed":       func() error { _, err := e.Peek(ctx, "a"); return err },
				"Refund closed":     func() error { _, err := e.Refund(ctx, "a", 1); return err },
				"Charge closed":     func() error { _, err := e.Charge(ctx, "a", 1); return err },
				"Wait closed":       func() error { _, err := e.Wait(ctx, "a", 1); return err },
				"AllowBatch closed": func() error { return batch(ctx, reqs) },
				"AllowAll closed":   func() error { return all(ctx, reqs) },
				"EvictFull closed":  func() error { _, err := e.EvictFull(ctx); return err },
			})
		})
	}
}

// requireNoAllocs requires that every call succeeds without allocating,
// once warm.
func requireNoAllocs(t *testing.T, calls map[string]func() error) {
	t.Helper()
	allocsPer(t, calls, false)
}

// requireAllocsFree requires that every call fails without allocating,
// once warm.
func requireAllocsFree(t *testing.T, calls map[string]func() error) {
	t.Helper()
	allocsPer(t, calls, true)
}

func allocsPer(t *testing.T, calls map[string]func() error, fails bool) {
	t.Helper()
	for name, call := range calls {
		check := func() {
			if err := call(); (err != nil) != fails {
				t.Fatalf("%s: error %v", name, err)
			}
		}
		for range 3 {
			check() // warm the pools
		}
		if n := testing.AllocsPerRun(100, check); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
}
