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
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// TestDoneContextChangesNothing: a context that is already done (canceled,
// or past its deadline), 200 times over, on every call that takes one: each
// returns the context's error and changes nothing (the package doc's
// Errors section: the context is checked before the request is sent).
func TestDoneContextChangesNothing(t *testing.T) {
	const repeats = 200
	kinds := doneContexts
	for _, shards := range shardCounts {
		for _, kind := range kinds {
			t.Run(fmt.Sprintf("shards=%d/%s", shards, kind.name), func(t *testing.T) {
				initial := pol(1, 10, 1)
				e, clk := newEngine(t, engine.Config{Policy: initial, Shards: shards})
				bg := context.Background()
				// "full" is full after the advance, "depleted" holds exactly 1 token.
				_, err := e.Allow(bg, "full", 1)
				require.NoError(t, err)
				_, err = e.Allow(bg, "depleted", 10)
				require.NoError(t, err)
				clk.Advance(time.Second)
				keys := 2

				for i := range repeats {
					ctx, cancel := kind.ctx()
					key := fmt.Sprintf("fresh-%d", i)

					d, err := e.Allow(ctx, key, 1)
					require.ErrorIs(t, err, kind.want, "Allow, repeat %d", i)
					require.Zero(t, d)

					reqs := []engine.Request{
						{Key: key, Cost: 1}, {Key: key + "-b", Cost: 3}, {Key: "depleted", Cost: 1}, {Key: "full", Cost: 10},
					}
					out := make([]engine.Result, len(reqs))
					require.ErrorIs(t, e.AllowBatch(ctx, reqs, out), kind.want, "AllowBatch, repeat %d", i)
					for j, r := range out {
						require.ErrorIs(t, r.Err, kind.want, "AllowBatch out[%d], repeat %d", j, i)
						require.Zero(t, r.Decision)
					}

					n, err := e.EvictFull(ctx)
					require.ErrorIs(t, err, kind.want, "EvictFull, repeat %d", i)
					require.Zero(t, n)

					err = e.ReplacePolicy(ctx, pol(2, 20, 2), 1)
					require.ErrorIs(t, err, kind.want, "ReplacePolicy, repeat %d", i)
					cancel()

					require.Equal(t, keys, e.KeyCount(), "repeat %d", i)
					require.Equal(t, initial, e.Policy(), "repeat %d", i)
					d, err = e.Allow(bg, key, 1)
					require.NoError(t, err)
					require.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: time.Second}, d,
						"repeat %d: key %s must be new and full", i, key)
					keys++
				}

				// "depleted" was never charged, and "full" was never evicted.
				d, err := e.Allow(bg, "depleted", 1)
				require.NoError(t, err)
				require.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 10 * time.Second}, d)
				require.Equal(t, keys, e.KeyCount())
				n, err := e.EvictFull(bg)
				require.NoError(t, err)
				require.Equal(t, 1, n, "only \"full\" is full")
			})
		}
	}
}

// TestCloseRacesCloseUnderLoad: two Close calls race each other while 32
// goroutines call Allow and AllowBatch. Every call returns a decision or
// ErrClosed, both Close calls return nil, and later calls are ErrClosed
// (the package doc's Close section). TestMain's goleak then finds nothing.
func TestCloseRacesCloseUnderLoad(t *testing.T) {
	const (
		workers  = 32
		minCalls = 50
		keySpace = 300
	)
	seed := ccSeed(t)
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 100, 1000), Shards: shards})
			ctx := context.Background()

			progress := make(chan struct{}, workers)
			problems := make(chan string, 64)
			report := func(format string, args ...any) {
				select {
				case problems <- fmt.Sprintf("seed %d: ", seed) + fmt.Sprintf(format, args...):
				default:
				}
			}
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					reqs := make([]engine.Request, 6)
					out := make([]engine.Result, len(reqs))
					for i := 0; ; i++ {
						if i == minCalls {
							progress <- struct{}{}
						}
						if w%2 == 0 {
							d, err := e.Allow(ctx, fmt.Sprintf("k%d", rng.IntN(keySpace)), 1)
							switch {
							case err == nil:
								if msg := ccCheckDecision(d); msg != "" {
									report("Allow: %s", msg)
								}
							case errors.Is(err, engine.ErrClosed):
								return
							default:
								report("Allow: undocumented error %v", err)
								return
							}
							continue
						}
						for j := range reqs {
							reqs[j] = engine.Request{Key: fmt.Sprintf("k%d", rng.IntN(keySpace)), Cost: 1}
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
							return
						}
					}
				}()
			}
			// Keep the clock moving a little so refills happen under load.
			stopClock, clockDone := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(clockDone)
				for {
					select {
					case <-stopClock:
						return
					default:
						clk.Advance(time.Millisecond)
						runtime.Gosched()
					}
				}
			}()

			progressed := make(chan struct{})
			go func() {
				for range workers {
					<-progress
				}
				close(progressed)
			}()
			ccAwait(t, progressed, "workers making progress")

			closeErrs := make(chan error, 2)
			startClose := make(chan struct{})
			for range 2 {
				go func() {
					<-startClose
					closeErrs <- e.Close()
				}()
			}
			close(startClose)
			closed := make(chan struct{})
			go func() {
				for range 2 {
					if err := <-closeErrs; err != nil {
						report("Close: %v", err)
					}
				}
				close(closed)
			}()
			ccAwait(t, closed, "two racing Close calls")
			ccWait(t, &wg, "workers after Close")
			close(stopClock)
			ccAwait(t, clockDone, "clock driver")
			close(problems)
			for p := range problems {
				t.Error(p)
			}

			_, err := e.Allow(ctx, "k1", 1)
			require.ErrorIs(t, err, engine.ErrClosed)
			out := make([]engine.Result, 2)
			err = e.AllowBatch(ctx, []engine.Request{{Key: "k1", Cost: 1}, {Key: "k2", Cost: 1}}, out)
			require.ErrorIs(t, err, engine.ErrClosed)
			require.ErrorIs(t, out[0].Err, engine.ErrClosed)
			require.ErrorIs(t, out[1].Err, engine.ErrClosed)
			require.Equal(t, pol(1, 100, 1000), e.Policy())
			require.LessOrEqual(t, e.KeyCount(), keySpace)
			require.NoError(t, e.Close(), "a third Close")
		})
	}
}

// ccGateClock stalls its reader until gate is closed. The shard reads its
// clock inside its own goroutine, so a closed-over gate holds the shard still
// with a request taken, which lets the test fill its mailbox exactly.
type ccGateClock struct{ gate chan struct{} }

func (c *ccGateClock) Now() int64 {
	<-c.gate
	return 0
}

// TestFullMailboxReleasedByCloseAndContext: a caller blocked on a full
// mailbox is released by its context and by Close, with the matching error
// (the package doc's Errors section). Inside a synctest bubble, synctest.Wait
// tells exactly when every goroutine is blocked, so the mailbox is filled
// deterministically: one request held by the stalled shard, which counts
// against the mailbox until it is served, MailboxSize-1 queued, the rest
// blocked.
func TestFullMailboxReleasedByCloseAndContext(t *testing.T) {
	const (
		blockedForClose = 16
		blockedForCtx   = 16
	)
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1<<40, 1), Shards: 1, Clock: &ccGateClock{gate: gate}})
		// Registered after newEngine, so it runs before its Close: a failing
		// test must not leave the shard stalled under that Close.
		t.Cleanup(func() {
			select {
			case <-gate:
			default:
				close(gate)
			}
		})

		type result struct {
			group string
			d     engine.Decision
			err   error
		}
		total := engine.MailboxSize + blockedForClose + blockedForCtx
		results := make(chan result, total)
		call := func(ctx context.Context, group string, i int) {
			d, err := e.Allow(ctx, fmt.Sprintf("%s-%d", group, i), 1)
			results <- result{group, d, err}
		}
		// A cancelable context keeps every blocked select on bubble channels.
		liveCtx, cancelLive := context.WithCancel(context.Background())
		defer cancelLive()

		// 1. One request, taken by the shard, which stalls reading the clock.
		go call(liveCtx, "held", 0)
		synctest.Wait()
		require.Zero(t, len(results), "the held request cannot be answered yet")

		// 2. MailboxSize-1 requests fill the mailbox; blockedForClose more
		// block.
		for i := range engine.MailboxSize - 1 + blockedForClose {
			go call(liveCtx, "queued", i)
		}
		synctest.Wait()
		require.Zero(t, len(results), "nothing is answered while the shard is stalled")

		// 3. More callers block; cancelling their context releases them.
		ctx, cancel := context.WithCancel(context.Background())
		for i := range blockedForCtx {
			go call(ctx, "canceled", i)
		}
		synctest.Wait()
		require.Zero(t, len(results))
		cancel()
		synctest.Wait()
		require.Equal(t, blockedForCtx, len(results), "every caller with a canceled context returns")
		for range blockedForCtx {
			r := <-results
			require.Equal(t, "canceled", r.group)
			require.ErrorIs(t, r.err, context.Canceled)
			require.Zero(t, r.d)
		}

		// 4. Close releases the callers still blocked on the full mailbox with
		// ErrClosed, and itself waits for the stalled shard.
		closeErr := make(chan error, 1)
		go func() { closeErr <- e.Close() }()
		synctest.Wait()
		require.Equal(t, blockedForClose, len(results), "Close releases exactly the callers blocked on the full mailbox")
		for range blockedForClose {
			r := <-results
			require.Equal(t, "queued", r.group)
			require.ErrorIs(t, r.err, engine.ErrClosed)
			require.Zero(t, r.d)
		}
		require.Zero(t, len(closeErr), "Close must not return while a shard goroutine is still running")
		_, err := e.Allow(context.Background(), "late", 1)
		require.ErrorIs(t, err, engine.ErrClosed, "a call after Close started")

		// 5. Release the shard: the held request gets its decision, the
		// queued ones a decision or ErrClosed, and Close returns nil.
		close(gate)
		synctest.Wait()
		require.Equal(t, 1, len(closeErr))
		require.NoError(t, <-closeErr)
		require.Equal(t, engine.MailboxSize, len(results))
		decided := 0
		for range engine.MailboxSize {
			r := <-results
			switch {
			case r.group == "held":
				require.NoError(t, r.err, "a request the shard has taken gets the shard's answer")
				require.True(t, r.d.Allowed)
				decided++
			case r.err == nil:
				require.True(t, r.d.Allowed, "%+v", r)
				decided++
			default:
				require.ErrorIs(t, r.err, engine.ErrClosed)
				require.Zero(t, r.d)
			}
		}
		t.Logf("%d decided, %d ErrClosed after Close", decided, engine.MailboxSize-decided)
		require.Equal(t, decided, e.KeyCount(), "every decided request created its key")
	})
}
