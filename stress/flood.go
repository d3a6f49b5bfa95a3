package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// The key flood: millions of distinct keys against MaxKeys 10,000,
// under a clock.Manual so the harness knows exactly which buckets are full.
// Each round, at one instant:
//
//  1. offer floodPerRound new keys at cost 1, from several goroutines:
//     exactly the free slots are created (each answer exact: a fresh bucket
//     less one token), every other key gets ErrKeyCapacity, KeyCount never
//     passes the bound and ends at it;
//  2. a sample of the new keys and every resident (a key depleted at the
//     start) still work at the bound, each answer exact;
//
// then the clock moves one second, which refills every flood key to full
// while no resident gets there, and
//
//  3. the residents are checked and drained to under one token, and EvictFull
//     must remove exactly the flood keys (KeyCount before - residents); the
//     residents are still tracked with their exact balance: never handed a
//     fresh burst;
//  3b. a new key charged so that floodEdge's wait later it is exactly one
//     unit short of full must survive EvictFull, and one nanosecond later
//     be the only key EvictFull removes;
//  4. every other round the policy alternates between a small and a larger
//     capacity: raising it must top no resident up; the residents are then
//     drained again.
//
// The live heap after a GC must not grow with the keys offered: it stays
// within floodHeapSlack of what it was after the first round.

const (
	floodMaxKeys   = 10_000
	floodResidents = 100
	floodPerRound  = 2 * floodMaxKeys
	floodChunk     = 256
	floodOfferers  = 4
	floodSamples   = 16 // per offering goroutine
	floodHeapSlack = 64 << 20
)

// floodShapes alternate at cutovers. With either, a flood key (one token
// short, or two for a sample) is full again one second later, and a
// resident drained below one token is not, so sweeps have exact answers.
// The rates do not divide 1e9: an estimate rounded the wrong way shows.
var floodShapes = [2]policy.Limit{{Capacity: 10, TokensPerSecond: 3}, {Capacity: 20, TokensPerSecond: 7}}

// floodBucket is the exact expected state of one key under the contract's
// refill and decision rules (a balance in units refilled by rate units per
// nanosecond up to capacity, a cost taken whole or denied), small enough for
// int64 (at most 20e9 units, refilled at most a second).
type floodBucket struct{ units, last int64 }

// decide returns the exact answer to cost at now under p and applies it.
func (b *floodBucket) decide(p policy.Policy, now, cost int64) engine.Decision {
	b.refill(p, now)
	d := engine.Decision{Version: p.Version, Limit: p.Capacity}
	need := cost * consUnits
	if b.units >= need {
		b.units -= need
		d.Allowed = true
	} else {
		d.RetryAfter = time.Duration(consCeil(need-b.units, p.TokensPerSecond))
	}
	d.Remaining = b.units / consUnits
	d.ResetAfter = time.Duration(consCeil(p.Capacity*consUnits-b.units, p.TokensPerSecond))
	return d
}

func (b *floodBucket) refill(p policy.Policy, now int64) {
	full := p.Capacity * consUnits
	if elapsed := now - b.last; elapsed > full/p.TokensPerSecond {
		b.units = full
	} else {
		b.units = min(full, b.units+elapsed*p.TokensPerSecond)
	}
	b.last = now
}

// floodRun is one flood scenario.
type floodRun struct {
	o         options
	c         *counters
	eng       *engine.Engine
	clk       *clock.Manual
	pol       policy.Policy
	shape     int // index in floodShapes of pol
	residents []string
	model     []floodBucket
}

// runFlood floods an engine with distinct keys until ctx ends and returns
// the first violation, if any. It closes its engine and leaves no goroutine.
func runFlood(ctx context.Context, o options, c *counters) error {
	return floodFor(ctx, 0, o, c)
}

// floodFor is runFlood, except that its first minRounds rounds run whole,
// and are checked, even once ctx has ended: a floor on the work checked
// however slowly the machine runs them.
func floodFor(ctx context.Context, minRounds int, o options, c *counters) error {
	f := &floodRun{o: o, c: c, clk: clock.NewManual(0)}
	f.pol = policy.Policy{Version: 1, Capacity: floodShapes[0].Capacity, TokensPerSecond: floodShapes[0].TokensPerSecond}
	eng, err := engine.New(engine.Config{Policy: f.pol, MaxKeys: floodMaxKeys, Shards: o.shards, Clock: f.clk})
	if err != nil {
		return fmt.Errorf("flood: %w", err)
	}
	f.eng = eng
	defer eng.Close()

	// Residents are depleted at the start: cost = capacity.
	for i := range floodResidents {
		f.residents = append(f.residents, "resident/"+strconv.Itoa(i))
		f.model = append(f.model, floodBucket{units: f.pol.Capacity * consUnits})
	}
	if v := f.touchResidents("depleting", func(b *floodBucket) int64 { return f.pol.Capacity }); v != nil {
		return v
	}

	var baseline uint64
	lastHeap := time.Now()
	for round := 0; round < minRounds || ctx.Err() == nil; round++ {
		rctx := ctx
		if round < minRounds {
			rctx = context.WithoutCancel(ctx)
		}
		v, complete := f.round(rctx, round)
		if v != nil {
			return v
		}
		if !complete {
			break
		}
		if round == 0 || time.Since(lastHeap) >= time.Second {
			lastHeap = time.Now()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			c.sampleHeap()
			if round == 0 {
				baseline = ms.HeapAlloc
			} else if ms.HeapAlloc > baseline+floodHeapSlack {
				return f.violation("", "live heap after GC",
					fmt.Sprintf("<= %d MiB (after the first round) + %d MiB", baseline>>20, floodHeapSlack>>20),
					fmt.Sprintf("%d MiB after %d keys offered", ms.HeapAlloc>>20, c.floodKeys.Load()))
			}
		}
	}
	return nil
}

func (f *floodRun) violation(key, op, want, got string) *Violation {
	return &Violation{Check: "flood", Key: key, Op: op, Want: want, Got: got, Seed: f.o.seed}
}

// round runs one round; complete is false if ctx ended part-way, when the
// round's counts are not checked.
func (f *floodRun) round(ctx context.Context, r int) (v *Violation, complete bool) {
	now := f.clk.Now()
	if n := f.eng.KeyCount(); n != floodResidents {
		return f.violation("", fmt.Sprintf("KeyCount at the start of round %d", r), strconv.Itoa(floodResidents)+", the residents", strconv.Itoa(n)), false
	}
	free := floodMaxKeys - floodResidents

	// 1. The flood.
	parts := make([]floodPart, max(1, min(f.o.workers, floodOfferers)))
	var next atomic.Int64
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.offer(ctx, r, &next, &parts[i])
		}()
	}
	wg.Wait()
	created, refused := 0, 0
	var samples []string
	for _, p := range parts {
		if p.v != nil {
			return p.v, false
		}
		if p.cut {
			return nil, false
		}
		created += p.created
		refused += p.refused
		samples = append(samples, p.samples...)
	}
	if created != free || refused != floodPerRound-free {
		return f.violation("", fmt.Sprintf("round %d: %d new keys with %d slots free", r, floodPerRound, free),
			fmt.Sprintf("%d created, %d ErrKeyCapacity", free, floodPerRound-free),
			fmt.Sprintf("%d created, %d ErrKeyCapacity", created, refused)), false
	}
	if n := f.eng.KeyCount(); n != floodMaxKeys {
		return f.violation("", fmt.Sprintf("KeyCount after round %d's flood", r), strconv.Itoa(floodMaxKeys), strconv.Itoa(n)), false
	}

	// 2. Existing keys keep working at the bound: a flood key spends a
	// second token, a resident is refused what a fresh bucket would allow.
	for _, k := range samples {
		b := floodBucket{units: f.pol.Capacity*consUnits - consUnits, last: now}
		want := b.decide(f.pol, now, 1)
		d, err := f.eng.Allow(context.Background(), k, 1)
		f.c.record(d, err)
		if err != nil || d != want {
			return f.violation(k, "Allow(cost 1) on a flood key at the key bound", fmt.Sprintf("%+v", want), fmt.Sprintf("%+v, %v", d, err)), false
		}
	}
	full := func(*floodBucket) int64 { return f.pol.Capacity }
	if v := f.touchResidents("at the key bound", full); v != nil {
		return v, false
	}

	// 3. One second: every flood key is full, no resident is. Drain the
	// residents to under a token so a sweep that evicted depleted buckets
	// would take them.
	f.clk.Advance(time.Second)
	if v := f.touchResidents("after a second", full); v != nil {
		return v, false
	}
	if v := f.touchResidents("draining", func(b *floodBucket) int64 { return b.units / consUnits }); v != nil {
		return v, false
	}
	before := f.eng.KeyCount()
	n, err := f.eng.EvictFull(context.Background())
	f.c.evictions.Add(int64(n))
	if err != nil || n != before-floodResidents {
		return f.violation("", fmt.Sprintf("EvictFull with %d keys tracked, %d of them depleted residents", before, floodResidents),
			fmt.Sprintf("%d evicted", before-floodResidents), fmt.Sprintf("%d evicted, %v", n, err)), false
	}
	if n := f.eng.KeyCount(); n != floodResidents {
		return f.violation("", "KeyCount after EvictFull", strconv.Itoa(floodResidents), strconv.Itoa(n)), false
	}
	if v := f.touchResidents("after the sweep", full); v != nil {
		return v, false
	}

	// 3b. The edge of full: a key one unit short of full survives a sweep,
	// and one nanosecond later it is evicted.
	if v := f.edge(r); v != nil {
		return v, false
	}

	// 4. Alternate the policy; a raise must top nobody up. Then drain the
	// residents again (the edge's wait refilled them), so each round starts
	// with them under a token.
	if r%2 == 1 {
		f.shape = 1 - f.shape
		next := policy.Policy{Version: f.pol.Version + 1, Capacity: floodShapes[f.shape].Capacity, TokensPerSecond: floodShapes[f.shape].TokensPerSecond}
		if err := f.eng.ReplacePolicy(context.Background(), next, f.pol.Version); err != nil {
			return f.violation("", fmt.Sprintf("ReplacePolicy(%+v, %d)", next, f.pol.Version), "nil", err.Error()), false
		}
		now := f.clk.Now()
		for i := range f.model {
			b := &f.model[i]
			b.refill(f.pol, now)
			b.units = min(b.units, next.Capacity*consUnits)
		}
		f.pol = next
	}
	if v := f.touchResidents("draining again", func(b *floodBucket) int64 { return b.units / consUnits }); v != nil {
		return v, false
	}
	return nil, true
}

// touchResidents sends every resident one request of cost(model), skipping
// a zero cost, and checks each answer exactly against the model.
func (f *floodRun) touchResidents(what string, cost func(*floodBucket) int64) *Violation {
	now := f.clk.Now()
	for i, k := range f.residents {
		b := &f.model[i]
		b.refill(f.pol, now)
		n := cost(b)
		if n < 1 {
			continue
		}
		want := b.decide(f.pol, now, n)
		d, err := f.eng.Allow(context.Background(), k, n)
		f.c.record(d, err)
		if err != nil || d != want {
			return f.violation(k, fmt.Sprintf("Allow(cost %d) on a resident key, %s, at %v", n, what, time.Duration(now)),
				fmt.Sprintf("%+v", want), fmt.Sprintf("%+v, %v", d, err))
		}
	}
	return nil
}

// floodPart is what one offering goroutine saw.
type floodPart struct {
	created, refused int
	samples          []string
	cut              bool // ctx ended before it offered everything
	v                *Violation
}

// offer offers chunks of round r's keys, taken from next, until there are
// none left: mostly AllowBatch, every eighth chunk as single Allow calls.
func (f *floodRun) offer(ctx context.Context, r int, next *atomic.Int64, p *floodPart) {
	now := f.clk.Now()
	fresh := floodBucket{units: f.pol.Capacity * consUnits, last: now}
	want := fresh.decide(f.pol, now, 1)
	reqs := make([]engine.Request, 0, floodChunk)
	out := make([]engine.Result, floodChunk)
	prefix := "flood/" + strconv.Itoa(r) + "/"
	bg := context.Background()
	for {
		if ctx.Err() != nil {
			p.cut = true
			return
		}
		j := int(next.Add(1) - 1)
		lo, hi := j*floodChunk, min((j+1)*floodChunk, floodPerRound)
		if lo >= floodPerRound {
			return
		}
		reqs = reqs[:0]
		for i := lo; i < hi; i++ {
			reqs = append(reqs, engine.Request{Key: prefix + strconv.Itoa(i), Cost: 1})
		}
		single := j%8 == 7
		if single {
			for i, q := range reqs {
				d, err := f.eng.Allow(bg, q.Key, q.Cost)
				out[i] = engine.Result{Decision: d, Err: err}
			}
		} else if err := f.eng.AllowBatch(bg, reqs, out); err != nil {
			p.v = f.violation(reqs[0].Key, fmt.Sprintf("AllowBatch of %d new keys", len(reqs)), "nil", err.Error())
			return
		}
		f.c.floodKeys.Add(int64(len(reqs)))
		for i, q := range reqs {
			res := out[i]
			f.c.record(res.Decision, res.Err)
			switch {
			case res.Err == nil && res.Decision == want:
				p.created++
				if len(p.samples) < floodSamples {
					p.samples = append(p.samples, q.Key)
				}
			case errors.Is(res.Err, engine.ErrKeyCapacity):
				p.refused++
			default:
				op := "AllowBatch"
				if single {
					op = "Allow"
				}
				p.v = f.violation(q.Key, op+"(cost 1) on a new key", fmt.Sprintf("%+v or ErrKeyCapacity", want),
					fmt.Sprintf("%+v, %v", res.Decision, res.Err))
				return
			}
		}
		clear(out)
		if n := f.eng.KeyCount(); n > floodMaxKeys {
			p.v = f.violation("", "KeyCount during the flood", fmt.Sprintf("<= %d", floodMaxKeys), strconv.Itoa(n))
			return
		}
	}
}

// floodEdge returns, for policy p, a cost and a wait such that a full
// bucket charged cost is exactly one unit short of full wait ns later
// (cost*UnitsPerToken-1 is a multiple of the rate), and one nanosecond
// after that full again; ok is false if no cost up to the capacity does.
func floodEdge(p policy.Policy) (cost, wait int64, ok bool) {
	for cost = 1; cost <= p.Capacity; cost++ {
		if (cost*consUnits-1)%p.TokensPerSecond == 0 {
			return cost, (cost*consUnits - 1) / p.TokensPerSecond, true
		}
	}
	return 0, 0, false
}

// edge checks round r's sweep at the edge of full: a new key charged so
// that, after floodEdge's wait, it is one unit short of full must survive
// a sweep, and one nanosecond later it must be the one key the next sweep
// evicts (the residents are far from full). A sweep that judges by whole
// tokens, or rounds a balance up, evicts it early and hands out a fresh
// bucket it never earned.
func (f *floodRun) edge(r int) *Violation {
	cost, wait, ok := floodEdge(f.pol)
	if !ok {
		return f.violation("", "floodEdge", fmt.Sprintf("a cost for %+v", f.pol), "none")
	}
	key := "edge/" + strconv.Itoa(r)
	now := f.clk.Now()
	b := floodBucket{units: f.pol.Capacity * consUnits, last: now}
	want := b.decide(f.pol, now, cost)
	d, err := f.eng.Allow(context.Background(), key, cost)
	f.c.record(d, err)
	if err != nil || d != want {
		return f.violation(key, fmt.Sprintf("Allow(cost %d) on a new key", cost), fmt.Sprintf("%+v", want), fmt.Sprintf("%+v, %v", d, err))
	}
	f.clk.Advance(time.Duration(wait))
	for _, step := range []struct {
		advance time.Duration
		evicted int
		state   string
	}{{0, 0, "one unit short of full"}, {1, 1, "full"}} {
		f.clk.Advance(step.advance)
		n, err := f.eng.EvictFull(context.Background())
		f.c.evictions.Add(int64(n))
		if err != nil || n != step.evicted {
			return f.violation(key, fmt.Sprintf("EvictFull with %s %s and %d depleted residents", key, step.state, floodResidents),
				fmt.Sprintf("%d evicted", step.evicted), fmt.Sprintf("%d evicted, %v", n, err))
		}
		if n, want := f.eng.KeyCount(), floodResidents+1-step.evicted; n != want {
			return f.violation(key, fmt.Sprintf("KeyCount after EvictFull with %s %s", key, step.state), strconv.Itoa(want), strconv.Itoa(n))
		}
	}
	return nil
}
