package engine_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

type evOp struct {
	kind int // 0 allow, 1 charge, 2 refund, 3 allowall, 4 batch
	reqs []engine.Request
	d    engine.Decision
	at   int
	err  error
	out  []engine.Result
}

// evictPolicy draws policy v whose every capacity is at most the previous
// one's, so that no cutover raises a capacity.
func evictPolicy(t *testing.T, r *rand.Rand, v int64) policy.Policy {
	capOf := func(base int64) int64 { return max(1, base-v+1) }
	p := policy.Policy{Version: v, Capacity: capOf(9)}
	if r.IntN(3) == 0 {
		p.Refill = policy.PerMinute(1 + r.Int64N(120))
	} else {
		p.TokensPerSecond = 1 + r.Int64N(3)
	}
	if r.IntN(2) == 0 {
		bs, err := policy.NewBands(policy.Band{Name: "m", Capacity: capOf(12), Refill: policy.PerMinute(1 + r.Int64N(30))})
		require.NoError(t, err)
		p.Bands = bs
	}
	o := policy.Override{Match: "vip:*", Name: "vip", Capacity: capOf(10), TokensPerSecond: 1 + r.Int64N(3)}
	if r.IntN(2) == 0 {
		bs, err := policy.NewBands(policy.Band{Name: "h", Capacity: capOf(11), Refill: policy.PerHour(1 + r.Int64N(100))})
		require.NoError(t, err)
		o.Bands = bs
	}
	os, err := policy.NewOverrideSet(o)
	require.NoError(t, err)
	p.Overrides = os
	return p
}

// TestEvictionNeverChangesAnAnswer: workers call Allow, Charge (into debt),
// Refund, AllowAll and AllowBatch on disjoint keys, over tables of more
// than one sweep slice, under a key bound they meet, while EvictFull runs
// in a loop and background and pressure sweeps run too; between phases the
// clock moves and policies are cut over (bands, overrides, periods), none
// raising a capacity. Each key's answers, in its worker's order, must be
// the math/big model's that never evicts anything: evicting only full
// buckets changes no answer. A key refused for the bound must be one whose
// model bucket is full (the engine may have dropped it) or absent.
func TestEvictionNeverChangesAnAnswer(t *testing.T) {
	for seed := uint64(1); seed <= 2; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { evictSoundRun(t, seed) })
	}
}

func evictSoundRun(t *testing.T, seed uint64) {
	const nkeys, workers = 2600, 4
	r := rand.New(rand.NewPCG(seed, 3))
	p := evictPolicy(t, r, 1)
	clk := clock.NewManual(0)
	maxKeys := 1500 + r.IntN(1000)
	e, _ := newEngine(t, engine.Config{Policy: p, MaxKeys: maxKeys, Shards: 2, Clock: clk, SweepEvery: time.Millisecond})
	m := enginemodel.New(p, 1<<30, 0)
	keys := make([]string, nkeys)
	for i := range keys {
		if i%7 == 0 {
			keys[i] = fmt.Sprintf("vip:%d", i)
		} else {
			keys[i] = fmt.Sprintf("k%d", i)
		}
	}
	ctx := t.Context()
	for phase := range 6 {
		now := clk.Now()
		logs := make([][]evOp, workers)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var evictWG sync.WaitGroup
		evictWG.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := e.EvictFull(ctx)
				if err != nil {
					t.Errorf("EvictFull: %v", err)
					return
				}
			}
		})
		for w := range workers {
			wr := rand.New(rand.NewPCG(seed, uint64(phase*workers+w+100)))
			wg.Go(func() {
				key := func() string { return keys[w+workers*wr.IntN(nkeys/workers)] }
				for range 300 {
					var op evOp
					switch x := wr.IntN(100); {
					case x < 55:
						op.kind, op.reqs = 0, []engine.Request{{Key: key(), Cost: 1 + wr.Int64N(2)}}
						op.d, op.err = e.Allow(ctx, op.reqs[0].Key, op.reqs[0].Cost)
					case x < 70:
						op.kind, op.reqs = 1, []engine.Request{{Key: key(), Cost: 1 + wr.Int64N(6)}}
						op.d, op.err = e.Charge(ctx, op.reqs[0].Key, op.reqs[0].Cost)
					case x < 80:
						op.kind, op.reqs = 2, []engine.Request{{Key: key(), Cost: 1 + wr.Int64N(3)}}
						op.d, op.err = e.Refund(ctx, op.reqs[0].Key, op.reqs[0].Cost)
					case x < 90:
						op.kind = 3
						seen := map[string]bool{}
						for range 1 + wr.IntN(3) {
							k := key()
							if !seen[k] {
								seen[k] = true
								op.reqs = append(op.reqs, engine.Request{Key: k, Cost: 1})
							}
						}
						op.d, op.at, op.err = e.AllowAll(ctx, op.reqs)
					default:
						op.kind = 4
						for range 1 + wr.IntN(5) {
							op.reqs = append(op.reqs, engine.Request{Key: key(), Cost: 1})
						}
						op.out = make([]engine.Result, len(op.reqs))
						op.err = e.AllowBatch(ctx, op.reqs, op.out)
					}
					logs[w] = append(logs[w], op)
				}
			})
		}
		wg.Wait()
		close(stop)
		evictWG.Wait()
		require.LessOrEqual(t, e.KeyCount(), maxKeys)
		// check one key's answer: a refusal for the bound is only sound if
		// the model's bucket is full (so the engine may have dropped it).
		one := func(k string, d engine.Decision, err error, apply func() (engine.Decision, error)) {
			t.Helper()
			if errors.Is(err, engine.ErrKeyCapacity) {
				if b, ok := m.Bucket(k); ok {
					full, _ := m.EvictIfFull(now, k)
					require.True(t, full, "phase %d: key %q refused for the bound but its bucket %+v is not full", phase, k, b)
				}
				return
			}
			d2, err2 := apply()
			require.Equal(t, keyBoundErr(err2), keyBoundErr(err), "phase %d key %q", phase, k)
			require.Equal(t, d2, d, "phase %d key %q", phase, k)
		}
		for w := range workers {
			for _, op := range logs[w] {
				k := op.reqs[0].Key
				switch op.kind {
				case 0:
					one(k, op.d, op.err, func() (engine.Decision, error) { return m.Allow(now, k, op.reqs[0].Cost) })
				case 1:
					one(k, op.d, op.err, func() (engine.Decision, error) { return m.Charge(now, k, op.reqs[0].Cost) })
				case 2:
					if _, ok := m.Bucket(k); ok {
						// the engine may have dropped it only if full: then a
						// refund answers as for an unknown key, the same.
						one(k, op.d, op.err, func() (engine.Decision, error) { return m.Refund(now, k, op.reqs[0].Cost) })
					}
				case 3:
					if errors.Is(op.err, engine.ErrKeyCapacity) {
						continue // nothing taken; which new key met the bound is the engine's to choose
					}
					d2, at2, err2 := m.AllowAll(now, op.reqs)
					require.Equal(t, keyBoundErr(err2), keyBoundErr(op.err), "phase %d AllowAll %v", phase, op.reqs)
					require.Equal(t, d2, op.d, "phase %d AllowAll %v", phase, op.reqs)
					require.Equal(t, at2, op.at, "phase %d AllowAll %v", phase, op.reqs)
				case 4:
					require.NoError(t, op.err)
					for i, rq := range op.reqs {
						one(rq.Key, op.out[i].Decision, op.out[i].Err, func() (engine.Decision, error) { return m.Allow(now, rq.Key, rq.Cost) })
					}
				}
			}
		}
		clk.Advance(time.Duration(r.Int64N(int64(4 * time.Second))))
		if r.IntN(3) == 0 {
			v := e.Policy().Version
			next := evictPolicy(t, r, v+1)
			require.NoError(t, e.ReplacePolicy(ctx, next, v))
			require.NoError(t, m.ReplacePolicy(clk.Now(), next, v))
		}
	}
}

// TestEvictedBeforeCapacityRaise pins where eviction and a capacity raise
// part, as the package doc says: a bucket kept full through a cutover that
// raises its capacity keeps its tokens (raising a capacity tops nobody up),
// while a key dropped full before it comes back as any new key does, with
// the new capacity.
func TestEvictedBeforeCapacityRaise(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 1})
	ctx := t.Context()
	allow(t, e, "a", 1) // t=0: 9 left, full at 1 s
	clk.Set(int64(500 * time.Millisecond))
	allow(t, e, "b", 1) // 9 left, full at 1.5 s
	clk.Set(int64(time.Second))
	n, err := e.EvictFull(ctx) // a is full, b is not
	require.NoError(t, err)
	require.Equal(t, 1, n)
	clk.Set(int64(1500 * time.Millisecond)) // both full now, b still tracked
	require.NoError(t, e.ReplacePolicy(ctx, pol(2, 20, 1), 1))
	require.Equal(t, engine.Decision{Allowed: true, Version: 2, Limit: 20, ResetAfter: 20 * time.Second}, allow(t, e, "a", 20), "a: dropped full, new at 20")
	d := allow(t, e, "b", 20)
	require.False(t, d.Allowed, "b: kept full at 10, not topped up: %+v", d)
	require.Equal(t, int64(10), d.Remaining)
}
