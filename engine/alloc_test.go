//go:build !race

// The race detector makes sync.Pool drop items on purpose, so these run only
// without -race; .ci/run runs `go test work` for them.

package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestAllowDoesNotAllocate holds the hot-path promise: deciding a request on
// an existing key allocates nothing, allowed or denied, single or batched,
// with or without overrides, whatever the rate's period and however many
// bands; nor does charging one.
func TestAllowDoesNotAllocate(t *testing.T) {
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "alpha", Capacity: 1000, TokensPerSecond: 5},
		policy.Override{Match: "*mm*", Capacity: 1000, TokensPerSecond: 7},
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    policy.Policy
	}{
		{"plain", pol(1, 1000, 1)},
		{"overrides", policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1, Overrides: set}},
		{"per minute", policy.Policy{Version: 1, Capacity: 1000, Refill: policy.PerMinute(60)}},
		{"bands", policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1, Bands: bands(t,
			policy.Band{Name: "hourly", Capacity: 2000, Refill: policy.PerHour(2000)},
			policy.Band{Name: "daily", Capacity: 5000, Refill: policy.PerDay(5000)},
			policy.Band{Name: "odd", Capacity: 900, Refill: policy.Rate{Tokens: 7, Per: 3e9}})}},
	} {
		for _, shards := range shardCounts {
			t.Run(fmt.Sprintf("%s/shards=%d", tc.name, shards), func(t *testing.T) {
				allocsPerDecision(t, engine.Config{Policy: tc.p, Shards: shards})
			})
		}
	}
}

func allocsPerDecision(t *testing.T, cfg engine.Config) {
	e, _ := newEngine(t, cfg)
	ctx := context.Background()
	keys := []string{"alpha", "beta", "gamma", "delta"}
	reqs := make([]engine.Request, 64)
	for i := range reqs {
		reqs[i] = engine.Request{Key: keys[i%len(keys)], Cost: 1}
	}
	out := make([]engine.Result, len(reqs))
	// Warm up: create the keys and fill the pools.
	for range 3 {
		if err := e.AllowBatch(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		i++
		if _, err := e.Allow(ctx, keys[i%len(keys)], 1); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Allow: %v allocations per call, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := e.AllowBatch(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AllowBatch: %v allocations per call, want 0", n)
	}
	// Requests and results in arrays on the caller's stack stay there: no
	// shard keeps either past the call, so neither escapes.
	if n := testing.AllocsPerRun(100, func() {
		reqs := [4]engine.Request{{Key: keys[0], Cost: 1}, {Key: keys[1], Cost: 1}, {Key: keys[2], Cost: 1}, {Key: keys[3], Cost: 1}}
		var out [4]engine.Result
		if err := e.AllowBatch(ctx, reqs[:], out[:]); err != nil {
			t.Fatal(err)
		}
		if out[0].Err != nil {
			t.Fatal(out[0].Err)
		}
	}); n != 0 {
		t.Errorf("AllowBatch on stack arrays: %v allocations per call, want 0", n)
	}
	// A charge, into debt and at the floor, is a single request like Allow.
	if n := testing.AllocsPerRun(1000, func() {
		i++
		if d, err := e.Charge(ctx, keys[i%len(keys)], 700); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}); n != 0 {
		t.Errorf("Charge: %v allocations per call, want 0", n)
	}
	// Rejections are preallocated errors, not fmt.Errorf per request.
	if n := testing.AllocsPerRun(100, func() {
		if _, err := e.Allow(ctx, "alpha", 1001); err == nil {
			t.Fatal("cost above capacity was admitted")
		}
		if _, err := e.Allow(ctx, " ", 1); err == nil {
			t.Fatal("blank key was admitted")
		}
	}); n != 0 {
		t.Errorf("rejections: %v allocations per call, want 0", n)
	}
}

// TestAllowBatchMixedKeysDoesNotAllocate: a batch of 64 requests drawn at
// random from many keys, as a service collects them (not grouped by shard),
// allocates nothing once its keys exist, for stored limits too, whose level
// records the batch warms as well as their slots.
func TestAllowBatchMixedKeysDoesNotAllocate(t *testing.T) {
	const nkeys = 1 << 17
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%012d", i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	batches := make([][]engine.Request, 64)
	for b := range batches {
		batches[b] = make([]engine.Request, 64)
		for j := range batches[b] {
			batches[b][j] = engine.Request{Key: keys[r.IntN(nkeys)], Cost: 1}
		}
	}
	for _, tc := range []struct {
		name string
		p    policy.Policy
	}{
		{"plain", pol(1, 1000, 1000)},
		{"bands", policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1000, Bands: bands(t,
			policy.Band{Name: "daily", Capacity: 5000, Refill: policy.PerDay(5000)})}},
	} {
		for _, shards := range []int{1, 2, 16} {
			t.Run(fmt.Sprintf("%s/shards=%d", tc.name, shards), func(t *testing.T) {
				e, _ := newEngine(t, engine.Config{Policy: tc.p, Shards: shards})
				ctx := context.Background()
				out := make([]engine.Result, 64)
				fill := make([]engine.Request, 64)
				for i := 0; i < nkeys; i += len(fill) {
					for j := range fill {
						fill[j] = engine.Request{Key: keys[i+j], Cost: 1}
					}
					if err := e.AllowBatch(ctx, fill, out); err != nil {
						t.Fatal(err)
					}
				}
				i := 0
				if n := testing.AllocsPerRun(200, func() {
					i++
					if err := e.AllowBatch(ctx, batches[i%len(batches)], out); err != nil {
						t.Fatal(err)
					}
				}); n != 0 {
					t.Errorf("AllowBatch of 64 mixed keys: %v allocations per call, want 0", n)
				}
			})
		}
	}
}

// TestAllowAllDoesNotAllocate: once warm, AllowAll allocates nothing, for
// one shape of call repeated and for shapes that take turns (many shards
// with few keys each, one shard with many keys, a few of each).
func TestAllowAllDoesNotAllocate(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1<<40, 1<<40), Shards: 16})
	ctx := context.Background()
	var wide, narrow []engine.Request // 8 keys on 8 shards; 60 keys on shard 0
	seen := map[int]bool{}
	for i := 0; len(wide) < 8 || len(narrow) < 60; i++ {
		k := fmt.Sprintf("k%d", i)
		switch s := e.ShardOf(k); {
		case s == 0 && len(narrow) < 60:
			narrow = append(narrow, engine.Request{Key: k, Cost: 1})
		case s != 0 && !seen[s] && len(wide) < 8:
			seen[s] = true
			wide = append(wide, engine.Request{Key: k, Cost: 1})
		}
	}
	for name, calls := range map[string][][]engine.Request{
		"one shape": {wide[:3]},
		"shapes":    {wide, narrow, wide[:3]},
	} {
		round := func() {
			for _, reqs := range calls {
				if _, _, err := e.AllowAll(ctx, reqs); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range 20 {
			round() // warm: the pool, the parts as sent, the shards' maps
		}
		if a := testing.AllocsPerRun(200, round); a != 0 {
			t.Errorf("%s: %v allocations per round", name, a)
		}
	}
}

// endingCtx is a context that ends at its left+1-th look at Err: a
// deadline that passes in the middle of a call, at a chosen step.
type endingCtx struct {
	context.Context
	left atomic.Int32
	once sync.Once
	done chan struct{}
}

func (c *endingCtx) Done() <-chan struct{} { return c.done }

func (c *endingCtx) Err() error {
	if c.left.Add(-1) >= 0 {
		return nil
	}
	c.once.Do(func() { close(c.done) })
	return context.Canceled
}

// TestAllowAllDoesNotAllocateAfterFailedSends: an AllowAll whose context
// ends between the sends of its parts leaves nothing behind that makes
// later calls allocate. (The parts it never sent were never given back,
// and once a few calls had ended so, every later one made its parts anew.)
func TestAllowAllDoesNotAllocateAfterFailedSends(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1<<40, 1<<40), Shards: 16})
	var reqs []engine.Request // 3 keys on 3 shards
	seen := map[int]bool{}
	for i := 0; len(reqs) < 3; i++ {
		k := fmt.Sprintf("k%d", i)
		if s := e.ShardOf(k); !seen[s] {
			seen[s] = true
			reqs = append(reqs, engine.Request{Key: k, Cost: 1})
		}
	}
	round := func() {
		if _, _, err := e.AllowAll(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
	}
	// A call looks at its context once before it sends, then once a
	// part: each of these ends at the second part's send, the first sent.
	// Whether their calls' parts were pooled together is the scheduler's
	// choice: a few goes.
	for range 5 {
		for range 6 {
			ctx := &endingCtx{Context: context.Background(), done: make(chan struct{})}
			ctx.left.Store(2)
			if _, _, err := e.AllowAll(ctx, reqs); err == nil {
				t.Fatal("a call whose context ended at its second send: no error")
			}
		}
		for range 20 {
			round()
		}
		if a := testing.AllocsPerRun(200, round); a != 0 {
			t.Fatalf("after calls that ended in their context: %v allocations per call", a)
		}
	}
}
