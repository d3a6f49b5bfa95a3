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
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// ccDeadlockGuard bounds every wait for worker goroutines. It is a deadlock
// detector, not a timing assertion: on a healthy engine each wait ends in well
// under a second, and when it fires the test fails with every goroutine's stack.
const ccDeadlockGuard = 2 * time.Minute

// ccAwait waits for done, or fails the test with a goroutine dump if it takes
// longer than ccDeadlockGuard.
func ccAwait(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(ccDeadlockGuard)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		buf := make([]byte, 8<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("deadlock: %s did not finish within %v; goroutines:\n%s", what, ccDeadlockGuard, buf[:n])
	}
}

// ccWait is ccAwait for a WaitGroup.
func ccWait(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	ccAwait(t, done, what)
}

// ccSeed returns a fresh seed and logs it, so a failure can be replayed by
// pinning the seed in the test.
func ccSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return seed
}

// ccIsAny reports whether err is one of targets (errors.Is), nil included
// when nil is among them.
func ccIsAny(err error, targets ...error) bool {
	for _, target := range targets {
		if err == target || (target != nil && errors.Is(err, target)) {
			return true
		}
	}
	return false
}

// ccCheckDecision returns a description of what is wrong with a decision
// returned without error, or "" if it is well formed.
func ccCheckDecision(d engine.Decision) string {
	switch {
	case d.Version < 1 || d.Limit < 1:
		return fmt.Sprintf("version/limit below 1: %+v", d)
	case d.Remaining < 0 || d.Remaining > d.Limit:
		return fmt.Sprintf("remaining outside [0, limit]: %+v", d)
	case d.Allowed && d.RetryAfter != 0:
		return fmt.Sprintf("allowed with a retry estimate: %+v", d)
	case !d.Allowed && d.RetryAfter <= 0:
		return fmt.Sprintf("denied without a retry estimate: %+v", d)
	}
	return ""
}

// TestConcurrentCreationStopsAtMaxKeys: 1,000 goroutines create 1,000
// distinct keys at once under MaxKeys 100, a bound that holds at every
// instant: exactly 100 are created, 900 get ErrKeyCapacity, and the 100 keep
// working at the bound.
func TestConcurrentCreationStopsAtMaxKeys(t *testing.T) {
	const goroutines, maxKeys = 1000, 100
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards, MaxKeys: maxKeys})
			ctx := context.Background()

			type result struct {
				key string
				d   engine.Decision
				err error
			}
			results := make(chan result, goroutines)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("key-%04d", i)
					<-start
					d, err := e.Allow(ctx, key, 1)
					results <- result{key, d, err}
				}()
			}
			close(start)
			ccWait(t, &wg, "1,000 concurrent creations")
			close(results)

			fresh := engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: time.Second}
			var created, rejected []string
			for r := range results {
				switch {
				case r.err == nil:
					assert.Equal(t, fresh, r.d, "key %s", r.key)
					created = append(created, r.key)
				case errors.Is(r.err, engine.ErrKeyCapacity):
					assert.Zero(t, r.d, "key %s: an error comes with the zero Decision", r.key)
					rejected = append(rejected, r.key)
				default:
					t.Errorf("key %s: unexpected error %v", r.key, r.err)
				}
			}
			require.Len(t, created, maxKeys, "creations")
			require.Len(t, rejected, goroutines-maxKeys, "ErrKeyCapacity answers")
			require.Equal(t, maxKeys, e.KeyCount())

			// At the bound, existing keys go on working and new keys are refused.
			for _, k := range created {
				d, err := e.Allow(ctx, k, 1)
				require.NoError(t, err, "key %s", k)
				require.Equal(t, int64(8), d.Remaining, "key %s was created once", k)
			}
			for _, k := range rejected[:10] {
				_, err := e.Allow(ctx, k, 1)
				require.ErrorIs(t, err, engine.ErrKeyCapacity, "key %s", k)
			}
			require.Equal(t, maxKeys, e.KeyCount())
		})
	}
}

// TestConcurrentReplacePolicyOneWinner: 16 ReplacePolicy calls with the same
// expectedVersion and different next versions race (a compare-and-set):
// exactly one returns nil, the rest ErrStalePolicy, and the winner's policy
// is in force.
func TestConcurrentReplacePolicyOneWinner(t *testing.T) {
	const racers, rounds = 16, 5
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			ctx := context.Background()
			for round := range rounds {
				cur := e.Policy()
				nexts := make([]policy.Policy, racers)
				for i := range nexts {
					nexts[i] = pol(cur.Version+1+int64(i), 10+int64(i), 1+int64(i))
				}
				errs := make([]chan error, racers)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range racers {
					errs[i] = make(chan error, 1)
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						errs[i] <- e.ReplacePolicy(ctx, nexts[i], cur.Version)
					}()
				}
				close(start)
				ccWait(t, &wg, "racing ReplacePolicy calls")

				winner := -1
				for i := range racers {
					err := <-errs[i]
					switch {
					case err == nil:
						require.Equal(t, -1, winner, "round %d: two winners, %d and %d", round, winner, i)
						winner = i
					case errors.Is(err, engine.ErrStalePolicy):
					default:
						t.Fatalf("round %d racer %d: unexpected error %v", round, i, err)
					}
				}
				require.NotEqual(t, -1, winner, "round %d: no winner", round)
				require.Equal(t, nexts[winner], e.Policy(), "round %d", round)
				d, err := e.Allow(ctx, fmt.Sprintf("probe-%d", round), 1)
				require.NoError(t, err)
				require.Equal(t, nexts[winner].Version, d.Version, "round %d", round)
				require.Equal(t, nexts[winner].Capacity, d.Limit, "round %d", round)
			}
		})
	}
}

// TestAllowRacesCutoverSweepAndClose: Allow and AllowBatch race ReplacePolicy,
// EvictFull, a moving clock and Close. No panic, no deadlock, and every call
// gets a decision or one of its documented errors; after Close returns every
// call is ErrClosed, and TestMain's goleak finds nothing left behind.
func TestAllowRacesCutoverSweepAndClose(t *testing.T) {
	const (
		allowers  = 6
		batchers  = 2
		replacers = 2
		minCalls  = 150 // per data worker before Close
		minAdmin  = 3   // per admin worker before Close
		maxKeys   = 200
		keySpace  = 400
		batchLen  = 8
	)
	seed := ccSeed(t)
	for _, shards := range shardCounts {
		for rep := range 2 {
			t.Run(fmt.Sprintf("shards=%d/rep=%d", shards, rep), func(t *testing.T) {
				e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 5), Shards: shards, MaxKeys: maxKeys})
				ctx := context.Background()

				progress := make(chan struct{}, allowers+batchers+replacers+1)
				problems := make(chan string, 64)
				report := func(format string, args ...any) {
					select {
					case problems <- fmt.Sprintf("seed %d: ", seed) + fmt.Sprintf(format, args...):
					default: // enough reported
					}
				}
				var wg sync.WaitGroup

				for w := range allowers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(seed, uint64(w)))
						for i := 0; ; i++ {
							if i == minCalls {
								progress <- struct{}{}
							}
							cost := int64(1)
							if rng.IntN(4) == 0 {
								cost = 1 + rng.Int64N(12) // may exceed a capacity in force
							}
							key := fmt.Sprintf("k%d", rng.IntN(keySpace))
							d, err := e.Allow(ctx, key, cost)
							switch {
							case err == nil:
								if msg := ccCheckDecision(d); msg != "" {
									report("Allow(%s, %d): %s", key, cost, msg)
								}
							case errors.Is(err, engine.ErrClosed):
								if i < minCalls {
									report("Allow ErrClosed before Close was called")
								}
								return
							case ccIsAny(err, engine.ErrKeyCapacity, engine.ErrInvalidCost):
								if d != (engine.Decision{}) {
									report("Allow(%s, %d): error %v with decision %+v", key, cost, err, d)
								}
							default:
								report("Allow(%s, %d): undocumented error %v", key, cost, err)
							}
						}
					}()
				}

				for w := range batchers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(seed, uint64(100+w)))
						reqs := make([]engine.Request, batchLen)
						out := make([]engine.Result, batchLen)
						for i := 0; ; i++ {
							if i == minCalls {
								progress <- struct{}{}
							}
							for j := range reqs {
								reqs[j] = engine.Request{Key: fmt.Sprintf("k%d", rng.IntN(keySpace)), Cost: 1 + rng.Int64N(3)}
							}
							err := e.AllowBatch(ctx, reqs, out)
							if err != nil && !errors.Is(err, engine.ErrClosed) {
								report("AllowBatch: undocumented error %v", err)
								return
							}
							var undecided []int
							for j, r := range out {
								switch {
								case r.Err == nil:
									if msg := ccCheckDecision(r.Decision); msg != "" {
										report("AllowBatch[%d]: %s", j, msg)
									}
								case ccIsAny(r.Err, engine.ErrKeyCapacity, engine.ErrInvalidCost):
								case errors.Is(r.Err, engine.ErrClosed):
									undecided = append(undecided, j)
								default:
									report("AllowBatch[%d]: undocumented error %v", j, r.Err)
								}
							}
							if err == nil && len(undecided) > 0 {
								// Nil only when every part reached its shard; otherwise
								// ErrClosed, written into every undecided result.
								report("AllowBatch returned nil, but out%v are ErrClosed (not decided)", undecided)
							}
							if err != nil {
								if i < minCalls {
									report("AllowBatch ErrClosed before Close was called")
								}
								return
							}
						}
					}()
				}

				for w := range replacers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(seed, uint64(200+w)))
						for i := 0; ; i++ {
							if i == minAdmin {
								progress <- struct{}{}
							}
							cur := e.Policy()
							next := pol(cur.Version+1, 1+rng.Int64N(20), 1+rng.Int64N(10))
							err := e.ReplacePolicy(ctx, next, cur.Version)
							switch {
							case ccIsAny(err, nil, engine.ErrStalePolicy):
							case errors.Is(err, engine.ErrClosed):
								if i < minAdmin {
									report("ReplacePolicy ErrClosed before Close was called")
								}
								return
							default:
								report("ReplacePolicy: undocumented error %v", err)
								return
							}
						}
					}()
				}

				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						if i == minAdmin {
							progress <- struct{}{}
						}
						clk.Advance(100 * time.Millisecond)
						n, err := e.EvictFull(ctx)
						switch {
						case err == nil:
							if n < 0 {
								report("EvictFull: negative count %d", n)
							}
						case errors.Is(err, engine.ErrClosed):
							if i < minAdmin {
								report("EvictFull ErrClosed before Close was called")
							}
							return
						default:
							report("EvictFull: undocumented error %v", err)
							return
						}
					}
				}()

				// Close once every worker has made progress, while all of them run.
				progressed := make(chan struct{})
				go func() {
					for range allowers + batchers + replacers + 1 {
						<-progress
					}
					close(progressed)
				}()
				ccAwait(t, progressed, "workers making progress")
				require.NoError(t, e.Close())
				ccWait(t, &wg, "workers after Close")
				close(problems)
				for p := range problems {
					t.Error(p)
				}

				// After Close returns: every call is ErrClosed; KeyCount and Policy answer.
				_, err := e.Allow(ctx, "k1", 1)
				require.ErrorIs(t, err, engine.ErrClosed)
				out := make([]engine.Result, 1)
				require.ErrorIs(t, e.AllowBatch(ctx, []engine.Request{{Key: "k1", Cost: 1}}, out), engine.ErrClosed)
				require.ErrorIs(t, out[0].Err, engine.ErrClosed)
				_, err = e.EvictFull(ctx)
				require.ErrorIs(t, err, engine.ErrClosed)
				cur := e.Policy()
				require.ErrorIs(t, e.ReplacePolicy(ctx, pol(cur.Version+1, 1, 1), cur.Version), engine.ErrClosed)
				require.Equal(t, cur, e.Policy())
				require.LessOrEqual(t, e.KeyCount(), maxKeys)
				require.NoError(t, e.Close(), "a second Close")
			})
		}
	}
}
