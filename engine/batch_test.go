package engine_test

// AllowBatch against its definition (the package doc's Batches section):
// the same Allow calls made one by one, in order, at the same instant, give
// the same results and leave the same state.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// btMaxKeyBytes keeps the key-length edge cases short to write.
const btMaxKeyBytes = 12

// btGarbage is what out holds before a call: every field wrong, and an error
// no engine returns, so a result left unwritten cannot pass for a real one.
var btGarbage = engine.Result{
	Decision: engine.Decision{Allowed: true, Remaining: -77, RetryAfter: 1, Version: -5, Limit: -9, ResetAfter: 3},
	Err:      errors.New("garbage: never written by the engine"),
}

// btGarbageOut returns n results, all btGarbage.
func btGarbageOut(n int) []engine.Result {
	out := make([]engine.Result, n)
	for i := range out {
		out[i] = btGarbage
	}
	return out
}

// btValidKeys are well-formed keys, including one of exactly btMaxKeyBytes
// bytes and one that is not blank despite its spaces.
func btValidKeys(n int) []string {
	keys := make([]string, 0, n+3)
	for i := range n {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	return append(keys, strings.Repeat("x", btMaxKeyBytes), " padded ", "ключ")
}

// btBadKeys are keys every request must reject with ErrInvalidKey: blank by
// strings.TrimSpace (Unicode spaces too) or over btMaxKeyBytes bytes.
var btBadKeys = []string{
	"", " ", "\t\n ", "\u00a0", "\u2003\r",
	strings.Repeat("y", btMaxKeyBytes+1),
	"ééééééé", // 7 runes, 14 bytes
}

// btRandomBatch returns up to maxLen requests mixing repeated valid keys, bad
// keys, and good, bad and over-capacity costs.
func btRandomBatch(rng *rand.Rand, valid []string, capacity int64, maxLen int) []engine.Request {
	reqs := make([]engine.Request, rng.IntN(maxLen+1))
	for i := range reqs {
		key := valid[rng.IntN(len(valid))]
		if rng.IntN(8) == 0 {
			key = btBadKeys[rng.IntN(len(btBadKeys))]
		}
		var cost int64
		switch p := rng.IntN(20); {
		case p < 13:
			cost = 1 + rng.Int64N(3)
		case p < 15:
			cost = capacity
		case p < 17:
			cost = capacity + 1 + rng.Int64N(3) // ErrInvalidCost from the shard
		default:
			cost = []int64{0, -1, math.MinInt64, math.MaxInt64}[p-17+rng.IntN(2)]
		}
		reqs[i] = engine.Request{Key: key, Cost: cost}
	}
	return reqs
}

// TestBatchMatchesOneByOne: random batches (repeated keys, bad keys, bad and
// over-capacity costs, out pre-filled with garbage and sometimes longer than
// the batch) on one engine, and the same requests one by one on a twin engine
// at the same Manual instant: identical results, identical KeyCount after
// every round, identical answers to a final probe of every key. With one
// shard the key bound is small enough to be hit; with several shards which
// new keys hit it is not specified (the package doc's Batches section), so
// the bound is left large.
func TestBatchMatchesOneByOne(t *testing.T) {
	const rounds, maxLen = 40, 48
	seeds := []uint64{11, 22, 33, ccSeed(t)}
	for _, seed := range seeds {
		for _, shards := range shardCounts {
			t.Run(fmt.Sprintf("seed=%d/shards=%d", seed, shards), func(t *testing.T) {
				cfg := engine.Config{Policy: pol(1, 5, 2), Shards: shards, MaxKeyBytes: btMaxKeyBytes}
				if shards == 1 {
					cfg.MaxKeys = 20 // below the 33 valid keys: creations hit the bound
				}
				batched, clkB := newEngine(t, cfg)
				single, clkS := newEngine(t, cfg)
				ctx := context.Background()
				rng := rand.New(rand.NewPCG(seed, uint64(shards)))
				valid := btValidKeys(30)
				capacityHits := 0

				for round := range rounds {
					where := fmt.Sprintf("seed %d, shards %d, round %d", seed, shards, round)
					reqs := btRandomBatch(rng, valid, batched.Policy().Capacity, maxLen)
					extra := rng.IntN(4)
					out := btGarbageOut(len(reqs) + extra)
					require.NoError(t, batched.AllowBatch(ctx, reqs, out), where)
					for i, r := range reqs {
						d, err := single.Allow(ctx, r.Key, r.Cost)
						want := engine.Result{Decision: d, Err: err}
						require.Equal(t, want, out[i], "%s, request %d %+v", where, i, r)
						if errors.Is(err, engine.ErrKeyCapacity) {
							capacityHits++
						}
					}
					for i := len(reqs); i < len(out); i++ {
						require.Equal(t, btGarbage, out[i], "%s: out[%d] beyond len(reqs) was written", where, i)
					}
					require.Equal(t, single.KeyCount(), batched.KeyCount(), where)

					// Move both engines the same way between rounds.
					step := time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
					clkB.Advance(step)
					clkS.Advance(step)
					if rng.IntN(6) == 0 {
						nB, errB := batched.EvictFull(ctx)
						nS, errS := single.EvictFull(ctx)
						require.NoError(t, errB, where)
						require.NoError(t, errS, where)
						require.Equal(t, nS, nB, "%s: EvictFull", where)
					}
					if rng.IntN(10) == 0 {
						cur := batched.Policy()
						next := pol(cur.Version+1, 1+rng.Int64N(8), 1+rng.Int64N(4))
						require.NoError(t, batched.ReplacePolicy(ctx, next, cur.Version), where)
						require.NoError(t, single.ReplacePolicy(ctx, next, cur.Version), where)
					}
				}
				if shards == 1 {
					require.Positive(t, capacityHits, "seed %d: the key bound was never reached", seed)
				}

				// The state after: every key answers the same on both engines.
				for _, k := range append(valid, btBadKeys...) {
					dB, errB := batched.Allow(ctx, k, 1)
					dS, errS := single.Allow(ctx, k, 1)
					require.Equal(t, engine.Result{Decision: dS, Err: errS}, engine.Result{Decision: dB, Err: errB},
						"seed %d, shards %d: probe of key %q", seed, shards, k)
				}
				require.Equal(t, single.KeyCount(), batched.KeyCount(), "seed %d, shards %d", seed, shards)
			})
		}
	}
}

// TestBatchOutLength: out longer than reqs is fine and the tail is left
// untouched; out shorter than reqs is ErrInvalidConfig and nothing is decided.
func TestBatchOutLength(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			ctx := context.Background()
			reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 2}, {Key: "a", Cost: 3}}

			short := btGarbageOut(len(reqs) - 1)
			require.ErrorIs(t, e.AllowBatch(ctx, reqs, short), engine.ErrInvalidConfig)
			for i, r := range short {
				require.Equal(t, btGarbage, r, "out[%d] after ErrInvalidConfig", i)
			}
			require.Zero(t, e.KeyCount(), "nothing is decided")

			long := btGarbageOut(len(reqs) + 5)
			require.NoError(t, e.AllowBatch(ctx, reqs, long))
			fresh := func(remaining int64) engine.Result {
				return engine.Result{Decision: engine.Decision{
					Allowed: true, Remaining: remaining, Version: 1, Limit: 10,
					ResetAfter: time.Duration(10-remaining) * time.Second,
				}}
			}
			require.Equal(t, fresh(9), long[0])
			require.Equal(t, fresh(8), long[1])
			require.Equal(t, fresh(6), long[2], "a's second request sees its first")
			for i := len(reqs); i < len(long); i++ {
				require.Equal(t, btGarbage, long[i], "out[%d] beyond len(reqs)", i)
			}
			require.Equal(t, 2, e.KeyCount())
		})
	}
}

// TestBatchDoneContext: a batch under a context that is already done returns
// the context's error, writes it into every request that passed the
// caller-side checks (a bad key comes before a done context; an
// over-capacity cost is only known inside the shard, after it), and decides
// nothing.
func TestBatchDoneContext(t *testing.T) {
	const repeats = 20
	kinds := doneContexts
	reqs := []engine.Request{
		{Key: "a", Cost: 1},
		{Key: "", Cost: 1},
		{Key: "b", Cost: 0},
		{Key: "a", Cost: 2},
		{Key: strings.Repeat("z", btMaxKeyBytes+1), Cost: 1},
		{Key: "c", Cost: 11}, // over capacity: judged by the shard, so never reached
		{Key: " ", Cost: -1}, // bad key and bad cost: the key is checked first
		{Key: "d", Cost: -1},
		{Key: "e", Cost: 10},
	}
	wantErr := func(ctxErr error) []error {
		return []error{ctxErr, engine.ErrInvalidKey, engine.ErrInvalidCost, ctxErr, engine.ErrInvalidKey,
			ctxErr, engine.ErrInvalidKey, engine.ErrInvalidCost, ctxErr}
	}
	for _, shards := range shardCounts {
		for _, kind := range kinds {
			t.Run(fmt.Sprintf("shards=%d/%s", shards, kind.name), func(t *testing.T) {
				e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards, MaxKeyBytes: btMaxKeyBytes})
				want := wantErr(kind.want)
				for rep := range repeats {
					ctx, cancel := kind.ctx()
					out := btGarbageOut(len(reqs) + 2)
					err := e.AllowBatch(ctx, reqs, out)
					cancel()
					require.ErrorIs(t, err, kind.want, "repeat %d", rep)
					for i := range reqs {
						require.ErrorIs(t, out[i].Err, want[i], "repeat %d, out[%d] for %+v", rep, i, reqs[i])
						require.Zero(t, out[i].Decision, "repeat %d, out[%d]: an error comes with the zero Decision", rep, i)
					}
					require.Equal(t, btGarbage, out[len(reqs)], "repeat %d", rep)
					require.Equal(t, btGarbage, out[len(reqs)+1], "repeat %d", rep)
					require.Zero(t, e.KeyCount(), "repeat %d: nothing is decided", rep)
				}
				// Every key is still new: a real call gets the full-capacity answer.
				for _, k := range []string{"a", "c", "e"} {
					d, err := e.Allow(context.Background(), k, 1)
					require.NoError(t, err)
					require.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: time.Second}, d, "key %s", k)
				}
			})
		}
	}
}

// TestBatchEmpty: an empty batch is nil and touches nothing.
func TestBatchEmpty(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			ctx := context.Background()
			require.NoError(t, e.AllowBatch(ctx, nil, nil))
			require.NoError(t, e.AllowBatch(ctx, []engine.Request{}, nil))
			out := btGarbageOut(3)
			require.NoError(t, e.AllowBatch(ctx, nil, out))
			for i, r := range out {
				require.Equal(t, btGarbage, r, "out[%d]", i)
			}
			require.Zero(t, e.KeyCount())
		})
	}
}

// TestBatchAfterClose: after Close a batch returns ErrClosed, written into
// every request that passed the caller-side checks; those that failed them
// keep their own error (a bad key or cost comes before ErrClosed).
func TestBatchAfterClose(t *testing.T) {
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			require.NoError(t, e.Close())
			reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "", Cost: 1}, {Key: "b", Cost: 0}, {Key: "c", Cost: 99}}
			out := btGarbageOut(len(reqs))
			require.ErrorIs(t, e.AllowBatch(context.Background(), reqs, out), engine.ErrClosed)
			want := []error{engine.ErrClosed, engine.ErrInvalidKey, engine.ErrInvalidCost, engine.ErrClosed}
			for i, r := range out {
				require.ErrorIs(t, r.Err, want[i], "out[%d]", i)
				require.Zero(t, r.Decision, "out[%d]", i)
			}
		})
	}
}

// btGateClock stalls the shard that reads it until gate is closed.
type btGateClock struct{ gate chan struct{} }

func (c *btGateClock) Now() int64 {
	<-c.gate
	return 0
}

// TestBatchQueuedAtClose: a batch part still queued when Close comes is
// either decided or answered ErrClosed; in the second case it did not reach
// its shard, so AllowBatch must return ErrClosed, not nil (nil only when
// every part reached its shard, otherwise ErrClosed written into every result
// not decided; requests no shard took get ErrClosed). The shard is held on a
// stalled clock while the part queues; after release it picks between its
// stop signal and the queue at random, so the test repeats until both
// outcomes have had their chance.
func TestBatchQueuedAtClose(t *testing.T) {
	const repeats = 32
	drained := 0
	for rep := range repeats {
		synctest.Test(t, func(t *testing.T) {
			gate := make(chan struct{})
			e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), Shards: 1, Clock: &btGateClock{gate: gate}})
			require.NoError(t, err)
			t.Cleanup(func() {
				select {
				case <-gate:
				default:
					close(gate)
				}
				_ = e.Close()
			})
			ctx := context.Background()

			// The first batch is taken by the shard, which stalls on the clock.
			held := make(chan error, 1)
			heldOut := make([]engine.Result, 1)
			go func() { held <- e.AllowBatch(ctx, []engine.Request{{Key: "held", Cost: 1}}, heldOut) }()
			synctest.Wait()

			// The second waits in the mailbox.
			queued := make(chan error, 1)
			queuedOut := btGarbageOut(2)
			go func() {
				queued <- e.AllowBatch(ctx, []engine.Request{{Key: "q1", Cost: 1}, {Key: "q2", Cost: 2}}, queuedOut)
			}()
			synctest.Wait()

			closed := make(chan error, 1)
			go func() { closed <- e.Close() }()
			synctest.Wait()
			close(gate)
			synctest.Wait()
			require.NoError(t, <-closed)

			require.NoError(t, <-held, "repeat %d: the held part was taken by its shard", rep)
			require.NoError(t, heldOut[0].Err)
			require.True(t, heldOut[0].Decision.Allowed)

			qErr := <-queued
			switch {
			case queuedOut[0].Err == nil && queuedOut[1].Err == nil:
				require.NoError(t, qErr, "repeat %d: the queued part was decided", rep)
			default:
				drained++
				for i, r := range queuedOut {
					require.ErrorIs(t, r.Err, engine.ErrClosed, "repeat %d, out[%d]", rep, i)
				}
				require.ErrorIs(t, qErr, engine.ErrClosed,
					"repeat %d: AllowBatch returned %v though its only part was answered ErrClosed, not decided", rep, qErr)
			}
		})
	}
	t.Logf("queued part drained with ErrClosed in %d of %d repeats", drained, repeats)
}

// btStallClock stalls the first stalls readings until gate is closed, and
// answers the rest at once.
type btStallClock struct {
	gate   chan struct{}
	stalls atomic.Int32
}

func (c *btStallClock) Now() int64 {
	if c.stalls.Add(-1) >= 0 {
		<-c.gate
	}
	return 0
}

// TestBatchPartlySent: a batch whose first part reaches its shard and whose
// second cannot (that shard's mailbox is full, and the context ends while
// the caller waits for room) returns the context's error, written into the
// second part's requests, and the first part's decisions, whether the first
// part was answered before the caller gave up on the second (stalls=1) or
// only after (stalls=2).
func TestBatchPartlySent(t *testing.T) {
	for _, stalls := range []int32{1, 2} {
		t.Run(fmt.Sprintf("stalls=%d", stalls), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := &btStallClock{gate: make(chan struct{})}
				clk.stalls.Store(stalls)
				e, err := engine.New(engine.Config{Policy: pol(1, 1<<40, 1), Shards: 2, Clock: clk})
				require.NoError(t, err)
				t.Cleanup(func() {
					select {
					case <-clk.gate:
					default:
						close(clk.gate)
					}
					_ = e.Close()
				})
				keyOn := func(shard int) string {
					for i := 0; ; i++ {
						if k := fmt.Sprintf("k%d", i); e.ShardOf(k) == shard {
							return k
						}
					}
				}
				k0, k1 := keyOn(0), keyOn(1)
				bg := context.Background()
				var fill sync.WaitGroup
				batch := func(k string) {
					out := make([]engine.Result, 1)
					assert.NoError(t, e.AllowBatch(bg, []engine.Request{{Key: k, Cost: 1}}, out))
					assert.True(t, out[0].Decision.Allowed)
				}
				// Shard 1 takes a part and stalls reading the clock; its
				// mailbox then fills.
				fill.Go(func() { batch(k1) })
				synctest.Wait()
				for range engine.MailboxSize {
					fill.Go(func() { batch(k1) })
				}
				synctest.Wait()

				ctx, cancel := context.WithCancel(bg)
				out := btGarbageOut(2)
				done := make(chan error, 1)
				go func() { done <- e.AllowBatch(ctx, []engine.Request{{Key: k0, Cost: 1}, {Key: k1, Cost: 1}}, out) }()
				synctest.Wait()
				require.Zero(t, len(done), "the second part waits for room")
				cancel()
				synctest.Wait()
				if stalls == 2 {
					require.Zero(t, len(done), "the first part's shard has not answered yet")
					close(clk.gate)
					synctest.Wait()
				}
				require.ErrorIs(t, <-done, context.Canceled)
				require.NoError(t, out[0].Err)
				require.True(t, out[0].Decision.Allowed)
				require.ErrorIs(t, out[1].Err, context.Canceled)
				require.Zero(t, out[1].Decision)

				if stalls == 1 {
					close(clk.gate)
				}
				fill.Wait()
			})
		})
	}
}
