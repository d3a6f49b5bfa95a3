package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// TestKeyBoundEveryCreatingCall: workers create unique keys through every
// call that can create one (Allow, Charge, AllowBatch, AllowAll) and ask
// about others through the calls that never do (Peek, Refund), while a
// driver advances the clock, cuts over, snapshots and evicts, and a sampler
// polls KeyCount. KeyCount never passes MaxKeys, equals the creations less
// the evictions at the end (background sweeps off), and equals the keys the
// shards really hold: a snapshot of the engine restores exactly that many.
// With background sweeps on, only the last two hold (they evict too).
func TestKeyBoundEveryCreatingCall(t *testing.T) {
	const maxKeys, workers, perWorker = 97, 8, 300
	for _, shards := range []int{1, 3, 16} {
		for _, every := range []time.Duration{0, time.Millisecond} {
			t.Run(fmt.Sprintf("shards=%d/SweepEvery=%v", shards, every), func(t *testing.T) {
				clk := clock.NewManual(0)
				cfg := engine.Config{Policy: pol(1, 4, 1), Shards: shards, MaxKeys: maxKeys, Clock: clk, SweepEvery: every}
				e, _ := newEngine(t, cfg)
				ctx := context.Background()
				var created, evicted, over atomic.Int64
				problems := make(chan string, 64)
				report := func(f string, a ...any) {
					select {
					case problems <- fmt.Sprintf(f, a...):
					default:
					}
				}
				created1 := func(err error, what string) {
					switch {
					case err == nil:
						created.Add(1)
					case !errors.Is(err, engine.ErrKeyCapacity):
						report("%s: %v", what, err)
					}
				}
				stop := make(chan struct{})
				var bg sync.WaitGroup
				bg.Go(func() { // the sampler
					for {
						select {
						case <-stop:
							return
						default:
						}
						if n := e.KeyCount(); n > maxKeys {
							over.Store(int64(n))
						}
						runtime.Gosched()
					}
				})
				bg.Go(func() { // the driver
					for round := 0; ; round++ {
						select {
						case <-stop:
							return
						default:
						}
						clk.Advance(time.Second)
						if round%3 == 0 {
							var buf bytes.Buffer
							if err := e.Snapshot(ctx, &buf); err != nil {
								report("Snapshot: %v", err)
							}
							r, rep, err := engine.Restore(engine.Config{Policy: pol(1, 4, 1), Shards: shards, MaxKeys: maxKeys, Clock: clock.NewManual(0)}, &buf, engine.RestoreOptions{})
							if err != nil {
								report("Restore: %v", err)
							} else {
								if rep.Restored > maxKeys || r.KeyCount() != rep.Restored {
									report("restored %+v with KeyCount %d", rep, r.KeyCount())
								}
								_ = r.Close()
							}
						}
						v := e.Policy().Version
						if err := e.ReplacePolicy(ctx, pol(v+1, 4, 1), v); err != nil {
							report("ReplacePolicy: %v", err)
						}
						n, err := e.EvictFull(ctx)
						if err != nil {
							report("EvictFull: %v", err)
						}
						evicted.Add(int64(n))
					}
				})
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for i := range perWorker {
							k := fmt.Sprintf("w%d-%d", w, i)
							switch (w + i) % 6 {
							case 0:
								_, err := e.Allow(ctx, k, 4)
								created1(err, "Allow "+k)
							case 1:
								_, err := e.Charge(ctx, k, 9)
								created1(err, "Charge "+k)
							case 2:
								reqs := []engine.Request{{Key: k, Cost: 4}, {Key: k + "b", Cost: 4}, {Key: k + "c", Cost: 1}}
								out := make([]engine.Result, len(reqs))
								if err := e.AllowBatch(ctx, reqs, out); err != nil {
									report("AllowBatch %s: %v", k, err)
								}
								for _, r := range out {
									created1(r.Err, "AllowBatch "+k)
								}
							case 3:
								reqs := []engine.Request{{Key: k, Cost: 4}, {Key: k + "b", Cost: 4}, {Key: k + "c", Cost: 2}}
								d, _, err := e.AllowAll(ctx, reqs)
								switch {
								case err == nil && !d.Allowed:
									report("AllowAll %s refused new keys: %+v", k, d)
								case err == nil:
									created.Add(int64(len(reqs)))
								case !errors.Is(err, engine.ErrKeyCapacity):
									report("AllowAll %s: %v", k, err)
								}
							case 4:
								if _, err := e.Refund(ctx, k, 1); err != nil {
									report("Refund %s: %v", k, err)
								}
							case 5:
								if _, err := e.Peek(ctx, k); err != nil {
									report("Peek %s: %v", k, err)
								}
							}
						}
					})
				}
				wg.Wait()
				close(stop)
				bg.Wait()
				close(problems)
				for p := range problems {
					t.Error(p)
				}
				require.Zero(t, over.Load(), "KeyCount above MaxKeys")
				if every == 0 {
					require.Equal(t, int(created.Load()-evicted.Load()), e.KeyCount(), "created - evicted")
				}
				var buf bytes.Buffer
				require.NoError(t, e.Snapshot(ctx, &buf))
				_, rep := restored(t, engine.Config{Policy: pol(1, 4, 1), Shards: shards, MaxKeys: maxKeys, Clock: clock.NewManual(0)}, buf.Bytes(), engine.RestoreOptions{})
				require.Equal(t, e.KeyCount(), rep.Restored, "KeyCount against the keys the shards hold")
			})
		}
	}
}

// keyBoundKeys are the keys of TestKeyBoundAgreesWithModel: more than any
// bound it draws, some of them matched by an override.
var keyBoundKeys = []string{"a", "b", "c", "d", "e", "vip:1", "vip:2", "t:x"}

// keyBoundPolicy draws a small policy of version v: per second or per
// minute, with a per-minute band or not, with a "vip:*" override (with a
// per-hour band or not) or not.
func keyBoundPolicy(t *testing.T, r *rand.Rand, v int64) policy.Policy {
	t.Helper()
	p := policy.Policy{Version: v, Capacity: 1 + r.Int64N(8)}
	if r.IntN(3) == 0 {
		p.Refill = policy.PerMinute(1 + r.Int64N(60))
	} else {
		p.TokensPerSecond = 1 + r.Int64N(4)
	}
	if r.IntN(3) == 0 {
		bs, err := policy.NewBands(policy.Band{Name: "m", Capacity: 1 + r.Int64N(12), Refill: policy.PerMinute(1 + r.Int64N(30))})
		require.NoError(t, err)
		p.Bands = bs
	}
	if r.IntN(2) == 0 {
		o := policy.Override{Match: "vip:*", Name: "vip", Capacity: 1 + r.Int64N(8), TokensPerSecond: 1 + r.Int64N(3)}
		if r.IntN(2) == 0 {
			bs, err := policy.NewBands(policy.Band{Name: "h", Capacity: 1 + r.Int64N(12), Refill: policy.PerHour(1 + r.Int64N(100))})
			require.NoError(t, err)
			o.Bands = bs
		}
		os, err := policy.NewOverrideSet(o)
		require.NoError(t, err)
		p.Overrides = os
	}
	return p
}

// keyBoundErr names err's kind, so the engine's wrapped errors compare with
// the model's.
func keyBoundErr(err error) string {
	if err == nil {
		return ""
	}
	for _, k := range []error{engine.ErrCostExceedsCapacity, engine.ErrInvalidCost, engine.ErrKeyCapacity, engine.ErrInvalidKey,
		engine.ErrStalePolicy, engine.ErrClockRegression, engine.ErrInvalidPolicy, engine.ErrAllowAllSize} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return "other: " + err.Error()
}

// TestKeyBoundAgreesWithModel runs seeded sequences of every call that
// creates, removes or restores keys against the math/big model, under a key
// bound of 1 to 5 that they meet all the time: Allow, Charge into debt,
// Refund, Peek, AllowAll, AllowBatch (one shard only: across shards, which
// new keys of one batch meet the bound first is not specified), EvictFull,
// cutovers, and a Snapshot restored into a new engine, under the same
// policy or (as a cutover at the restore) a new one. Every answer and
// KeyCount after every step must be the model's.
func TestKeyBoundAgreesWithModel(t *testing.T) {
	skipUnderRace(t)
	for seed := uint64(1); seed <= 40; seed++ {
		for _, shards := range []int{1, 3} {
			t.Run(fmt.Sprintf("seed=%d/shards=%d", seed, shards), func(t *testing.T) { keyBoundRun(t, seed, shards) })
		}
	}
}

func keyBoundRun(t *testing.T, seed uint64, shards int) {
	r := rand.New(rand.NewPCG(seed, 7))
	maxKeys := 1 + r.IntN(5)
	p := keyBoundPolicy(t, r, 1)
	clk := clock.NewManual(0)
	cfg := engine.Config{Policy: p, MaxKeys: maxKeys, Shards: shards, Clock: clk}
	e, err := engine.New(cfg)
	require.NoError(t, err)
	defer func() { _ = e.Close() }() // e changes at each restore
	m := enginemodel.New(p, maxKeys, 0)
	var log []string
	check := func(ok bool, f string, a ...any) {
		if !ok {
			t.Fatalf("maxKeys %d: %s\nthe steps before:\n%s", maxKeys, fmt.Sprintf(f, a...), strings.Join(log, "\n"))
		}
	}
	ctx := t.Context()
	key := func() string { return keyBoundKeys[r.IntN(len(keyBoundKeys))] }
	for range 200 {
		now := clk.Now()
		switch x := r.IntN(100); {
		case x < 15:
			d := time.Duration(r.Int64N(int64(3 * time.Second)))
			if r.IntN(4) == 0 {
				d = time.Duration(r.Int64N(int64(90 * time.Second)))
			}
			clk.Advance(d)
			log = append(log, fmt.Sprintf("advance %v to %d", d, clk.Now()))
		case x < 35:
			k, c := key(), 1+r.Int64N(9)
			d1, e1 := e.Allow(ctx, k, c)
			d2, e2 := m.Allow(now, k, c)
			log = append(log, fmt.Sprintf("Allow %s %d: %+v %v", k, c, d1, e1))
			check(d1 == d2 && keyBoundErr(e1) == keyBoundErr(e2), "the model says %+v %v", d2, e2)
		case x < 45:
			k, c := key(), 1+r.Int64N(20)
			d1, e1 := e.Charge(ctx, k, c)
			d2, e2 := m.Charge(now, k, c)
			log = append(log, fmt.Sprintf("Charge %s %d: %+v %v", k, c, d1, e1))
			check(d1 == d2 && keyBoundErr(e1) == keyBoundErr(e2), "the model says %+v %v", d2, e2)
		case x < 52:
			k, c := key(), 1+r.Int64N(5)
			d1, e1 := e.Refund(ctx, k, c)
			d2, e2 := m.Refund(now, k, c)
			log = append(log, fmt.Sprintf("Refund %s %d: %+v %v", k, c, d1, e1))
			check(d1 == d2 && keyBoundErr(e1) == keyBoundErr(e2), "the model says %+v %v", d2, e2)
		case x < 57:
			k := key()
			d1, e1 := e.Peek(ctx, k)
			d2, e2 := m.Peek(now, k)
			log = append(log, fmt.Sprintf("Peek %s: %+v %v", k, d1, e1))
			check(d1 == d2 && keyBoundErr(e1) == keyBoundErr(e2), "the model says %+v %v", d2, e2)
		case x < 67:
			reqs := make([]engine.Request, 1+r.IntN(4))
			for i := range reqs {
				reqs[i] = engine.Request{Key: key(), Cost: 1 + r.Int64N(4)}
			}
			d1, i1, e1 := e.AllowAll(ctx, reqs)
			d2, i2, e2 := m.AllowAll(now, reqs)
			log = append(log, fmt.Sprintf("AllowAll %v: %+v %d %v", reqs, d1, i1, e1))
			// With several shards, which new key meets the bound first is
			// the engine's to choose (see the model's AllowAll).
			sameAt := i1 == i2 || (shards > 1 && errors.Is(e1, engine.ErrKeyCapacity))
			check(d1 == d2 && sameAt && keyBoundErr(e1) == keyBoundErr(e2), "the model says %+v %d %v", d2, i2, e2)
		case x < 74:
			if shards > 1 {
				continue
			}
			reqs := make([]engine.Request, r.IntN(5))
			for i := range reqs {
				reqs[i] = engine.Request{Key: key(), Cost: 1 + r.Int64N(4)}
			}
			out := make([]engine.Result, len(reqs))
			require.NoError(t, e.AllowBatch(ctx, reqs, out))
			want := m.AllowBatch(now, reqs)
			log = append(log, fmt.Sprintf("AllowBatch %v: %+v", reqs, out))
			for i := range out {
				check(out[i].Decision == want[i].Decision && keyBoundErr(out[i].Err) == keyBoundErr(want[i].Err), "request %d: the model says %+v", i, want[i])
			}
		case x < 82:
			n1, e1 := e.EvictFull(ctx)
			n2, e2 := m.EvictFull(now)
			log = append(log, fmt.Sprintf("EvictFull: %d %v", n1, e1))
			check(n1 == n2 && keyBoundErr(e1) == keyBoundErr(e2), "the model says %d %v", n2, e2)
		case x < 90:
			v := e.Policy().Version
			next := keyBoundPolicy(t, r, v+1)
			e1 := e.ReplacePolicy(ctx, next, v)
			e2 := m.ReplacePolicy(now, next, v)
			log = append(log, fmt.Sprintf("ReplacePolicy %+v: %v", next, e1))
			check(keyBoundErr(e1) == keyBoundErr(e2), "the model says %v", e2)
		default:
			var buf bytes.Buffer
			require.NoError(t, e.Snapshot(ctx, &buf))
			require.NoError(t, e.Close())
			c := cfg
			c.Policy = e.Policy()
			if r.IntN(2) == 0 { // restoring under a new policy is a cutover at the restore
				c.Policy = keyBoundPolicy(t, r, c.Policy.Version+1)
				require.NoError(t, m.ReplacePolicy(now, c.Policy, c.Policy.Version-1))
			}
			var rep engine.RestoreReport
			e, rep, err = engine.Restore(c, &buf, engine.RestoreOptions{})
			require.NoError(t, err)
			log = append(log, fmt.Sprintf("Snapshot, Restore under %+v: %+v", c.Policy, rep))
			check(rep.Restored == m.KeyCount(), "restored %d keys, the model has %d", rep.Restored, m.KeyCount())
		}
		check(e.KeyCount() == m.KeyCount(), "KeyCount %d, the model's %d (%v)", e.KeyCount(), m.KeyCount(), m.Keys())
	}
}
