package engine_test

// Cutovers interrupted before publish: by Close, and by a context that ends
// while the shards prepare. Either way the cutover aborts everywhere and
// nothing changes (the package doc's Policy cutover and Close sections).

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// hookClock is a settable clock that runs a hook on the n-th reading after
// it is armed, inside the goroutine that reads it: a shard taking a
// prepare, since an idle shard reads no clock.
type hookClock struct {
	now   atomic.Int64
	left  atomic.Int64 // readings until the hook runs; <= 0: disarmed
	hook  func()
	armed atomic.Bool
}

func (c *hookClock) Now() int64 {
	if c.armed.Load() && c.left.Add(-1) == 0 {
		c.hook()
	}
	return c.now.Load()
}

// arm runs f on the n-th reading from now on.
func (c *hookClock) arm(n int64, f func()) {
	c.hook = f
	c.left.Store(n)
	c.armed.Store(true)
}

// keysOnEveryShard returns one key per shard of e.
func keysOnEveryShard(t *testing.T, e *engine.Engine, shards int) []string {
	t.Helper()
	keys := make([]string, shards)
	found := 0
	for i := 0; found < shards; i++ {
		require.Less(t, i, 1<<20, "no key found for some shard")
		k := fmt.Sprintf("k%d", i)
		if s := e.ShardOf(k); keys[s] == "" {
			keys[s] = k
			found++
		}
	}
	return keys
}

// TestReplacePolicyCloseBeforePublish: Close starts while the cutover is
// still preparing (the first shards prepared and waiting for publish, the
// last one inside its prepare). The coordinator must abort everywhere and
// return ErrClosed, leaving the policy in force as it was: publish had not
// begun.
func TestReplacePolicyCloseBeforePublish(t *testing.T) {
	for _, shards := range []int{1, 2, 16} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				initial := pol(1, 10, 1)
				clk := &hookClock{}
				e, _ := newEngine(t, engine.Config{Policy: initial, Shards: shards, Clock: clk})
				ctx := context.Background()
				for _, k := range keysOnEveryShard(t, e, shards) {
					_, err := e.Allow(ctx, k, 10)
					require.NoError(t, err)
				}

				// The last shard's prepare stalls on its clock reading.
				gate := make(chan struct{})
				clk.arm(int64(shards), func() { <-gate })
				replaced := make(chan error, 1)
				go func() { replaced <- e.ReplacePolicy(ctx, pol(2, 20, 5), 1) }()
				synctest.Wait()
				require.Zero(t, len(replaced), "the last shard is still preparing")

				closed := make(chan error, 1)
				go func() { closed <- e.Close() }()
				synctest.Wait()
				require.Zero(t, len(closed), "Close waits for the shard inside its prepare")

				close(gate)
				synctest.Wait()
				require.NoError(t, <-closed)
				require.ErrorIs(t, <-replaced, engine.ErrClosed,
					"Close came before publish: the cutover aborts and says so")
				require.Equal(t, initial, e.Policy(), "an aborted cutover changes nothing")
			})
		})
	}
}

// TestReplacePolicyContextEndsWhilePreparing: the context ends once the
// first shard has prepared. The cutover aborts on every shard, prepared or
// not: ReplacePolicy returns the context's error, the policy in force and
// every bucket are as they were, and the next cutover goes through.
func TestReplacePolicyContextEndsWhilePreparing(t *testing.T) {
	for _, shards := range []int{2, 16} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			initial := pol(1, 10, 1)
			clk := &hookClock{}
			e, _ := newEngine(t, engine.Config{Policy: initial, Shards: shards, Clock: clk})
			bg := context.Background()
			keys := keysOnEveryShard(t, e, shards)
			for _, k := range keys {
				_, err := e.Allow(bg, k, 10)
				require.NoError(t, err)
			}

			for round := range 20 {
				ctx, cancel := context.WithCancel(bg)
				clk.arm(1, cancel) // the first shard's prepare reading
				err := e.ReplacePolicy(ctx, pol(2, 20, 5), 1)
				require.ErrorIs(t, err, context.Canceled, "round %d", round)
				require.Equal(t, initial, e.Policy(), "round %d", round)
			}

			// One second at the old rate of 1/s: one token, version 1, on
			// every shard. Under the new policy it would be 5.
			clk.now.Add(int64(time.Second))
			for _, k := range keys {
				d, err := e.Peek(bg, k)
				require.NoError(t, err)
				require.Equal(t, engine.Decision{Allowed: true, Remaining: 1, Version: 1, Limit: 10, ResetAfter: 9 * time.Second}, d, "key %s", k)
			}

			require.NoError(t, e.ReplacePolicy(bg, pol(2, 20, 5), 1))
			for _, k := range keys {
				d, err := e.Peek(bg, k)
				require.NoError(t, err)
				require.Equal(t, int64(2), d.Version, "key %s", k)
			}
		})
	}
}
