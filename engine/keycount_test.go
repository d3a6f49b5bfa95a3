package engine_test

// Concurrency tests: the key bound under concurrent creation and eviction,
// one winner among racing cutovers, real-time version order, done contexts,
// Close racing everything, and callers blocked on a full mailbox. Workers
// report through channels; only the test goroutine calls require/assert.
// Nothing sleeps: Manual clocks are driven by hand, and goroutines are
// synchronised with channels, WaitGroups and synctest.Wait.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// TestKeyCountBoundedUnderCreationAndEviction: workers create unique keys
// (never reused, so every non-error answer is exactly one creation) while a
// driver advances the clock and runs EvictFull, and a sampler polls KeyCount.
// Cost-1 keys are full one second after creation; keys created with cost =
// capacity stay depleted for the whole test because the rate is 1 token/s
// against a capacity of 1e9 tokens. KeyCount never exceeds MaxKeys,
// created - evicted == KeyCount, and no depleted key is ever dropped.
func TestKeyCountBoundedUnderCreationAndEviction(t *testing.T) {
	const (
		workers    = 8
		perWorker  = 400
		maxKeys    = 256
		capacity   = 1_000_000_000
		depleteOne = 16 // one key in 16 is created depleted
	)
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, capacity, 1), Shards: shards, MaxKeys: maxKeys})
			ctx := context.Background()

			type tally struct {
				created, capacityErrs int
				depleted              []string // created depleted keys
				problems              []string
			}
			tallies := make(chan tally, workers)
			var workersWG sync.WaitGroup
			for w := range workers {
				workersWG.Add(1)
				go func() {
					defer workersWG.Done()
					var tl tally
					for i := range perWorker {
						key := fmt.Sprintf("w%d-k%d", w, i)
						cost := int64(1)
						if i%depleteOne == 0 {
							cost = capacity
						}
						d, err := e.Allow(ctx, key, cost)
						switch {
						case err == nil:
							if !d.Allowed {
								tl.problems = append(tl.problems, fmt.Sprintf("fresh key %s denied: %+v", key, d))
							}
							tl.created++
							if cost == capacity {
								tl.depleted = append(tl.depleted, key)
							}
						case errors.Is(err, engine.ErrKeyCapacity):
							tl.capacityErrs++
						default:
							tl.problems = append(tl.problems, fmt.Sprintf("Allow(%s): %v", key, err))
						}
					}
					tallies <- tl
				}()
			}
			workersDone := make(chan struct{})
			go func() {
				workersWG.Wait()
				close(workersDone)
			}()

			// The sampler owns maxSeen until samplerDone is closed.
			maxSeen, samples := 0, 0
			stopSampler, samplerDone := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(samplerDone)
				for {
					select {
					case <-stopSampler:
						return
					default:
					}
					maxSeen = max(maxSeen, e.KeyCount())
					samples++
					runtime.Gosched()
				}
			}()

			// The driver: advance a second (cost-1 keys become full), evict.
			type driven struct {
				evicted, rounds int
				err             error
			}
			driverOut := make(chan driven, 1)
			go func() {
				var dr driven
				for {
					select {
					case <-workersDone:
						driverOut <- dr
						return
					default:
					}
					clk.Advance(time.Second)
					n, err := e.EvictFull(ctx)
					dr.evicted += n
					dr.rounds++
					if err != nil {
						dr.err = err
						driverOut <- dr
						return
					}
				}
			}()

			ccAwait(t, workersDone, "creating workers")
			var dr driven
			select {
			case dr = <-driverOut:
			case <-time.After(ccDeadlockGuard):
				t.Fatal("deadlock: eviction driver did not stop")
			}
			require.NoError(t, dr.err, "EvictFull")
			close(stopSampler)
			ccAwait(t, samplerDone, "KeyCount sampler")

			created, capacityErrs := 0, 0
			var depleted []string
			for range workers {
				tl := <-tallies
				for _, p := range tl.problems {
					t.Error(p)
				}
				created += tl.created
				capacityErrs += tl.capacityErrs
				depleted = append(depleted, tl.depleted...)
			}
			t.Logf("created %d, ErrKeyCapacity %d, evicted %d in %d rounds, depleted %d, max KeyCount %d over %d samples",
				created, capacityErrs, dr.evicted, dr.rounds, len(depleted), maxSeen, samples)
			require.Equal(t, workers*perWorker, created+capacityErrs)
			require.LessOrEqual(t, maxSeen, maxKeys, "KeyCount above MaxKeys")
			require.Equal(t, created-dr.evicted, e.KeyCount(), "created - evicted")

			// A last pass: every cost-1 key is full a second later, no depleted key is.
			clk.Advance(time.Second)
			n, err := e.EvictFull(ctx)
			require.NoError(t, err)
			require.Equal(t, created-dr.evicted-n, e.KeyCount())
			require.Equal(t, len(depleted), e.KeyCount(), "only the depleted keys remain")

			// Each depleted key still holds what it earned, not a fresh burst.
			for _, k := range depleted {
				d, err := e.Allow(ctx, k, 1)
				require.NoError(t, err, "depleted key %s must still be tracked", k)
				require.Less(t, d.Remaining, int64(capacity-1), "depleted key %s came back full", k)
			}
			require.Equal(t, len(depleted), e.KeyCount())
		})
	}
}

// TestMaxKeys: MaxKeys is the configured bound, or DefaultMaxKeys for 0.
func TestMaxKeys(t *testing.T) {
	for _, tc := range []struct{ cfg, want int }{{0, engine.DefaultMaxKeys}, {1, 1}, {3, 3}} {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), MaxKeys: tc.cfg})
		require.Equal(t, tc.want, e.MaxKeys(), "Config.MaxKeys %d", tc.cfg)
	}
}
