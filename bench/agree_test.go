package main

import (
	"math"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/internal/keycopy"
	"github.com/tokenshard/tokenshard/policy"
)

// TestContendersDecideAlike gives every contender the same policy and the
// same stream of keys, decided from several goroutines at once (the floor
// from one), and checks each admits exactly what the policy does: with a
// refill far too slow to matter, min(capacity, requests) per key. A
// contender with another policy, other per-key state, or errors counted as
// denials (a denial is cheaper than an admission) would make its figures
// no comparison with the others'.
func TestContendersDecideAlike(t *testing.T) {
	const capacity, draws = 3, 20_000
	for _, p := range []policy.Policy{
		{Version: 1, Capacity: capacity, TokensPerSecond: 1},
		{Version: 1, Capacity: capacity, Refill: policy.PerMinute(1)}, // as allDenied's
	} {
		decideAlike(t, p, capacity, draws)
	}
}

func decideAlike(t *testing.T, p policy.Policy, capacity int64, draws int) {
	for _, s := range []struct {
		name string
		keys int
		zipf float64
	}{{"hot", 1, 0}, {"uniform", 5000, 0}, {"zipf", 5000, 1.1}} {
		names := keyNames(s.keys)
		r := rand.New(rand.NewSource(1))
		var z *rand.Zipf
		if s.zipf > 0 {
			z = rand.NewZipf(r, s.zipf, 1, uint64(s.keys-1))
		}
		picks := make([]int, draws)
		for i := range picks {
			if z != nil {
				picks[i] = int(z.Uint64())
			} else {
				picks[i] = r.Intn(s.keys)
			}
		}
		seen := map[int]int64{}
		for _, k := range picks {
			seen[k]++
		}
		want := int64(0)
		for _, n := range seen {
			want += min(n, capacity)
		}
		stream := keycopy.Copies(names, picks)
		for _, c := range contenders {
			inst := c.setup(p, s.keys)
			workers := 4 * runtime.GOMAXPROCS(0)
			if c.sequential {
				workers = 1
			}
			start := time.Now()
			var got int64
			var mu sync.Mutex
			var wg sync.WaitGroup
			part := (draws + workers - 1) / workers
			for w := range workers {
				d, mine := inst.forWorker(), stream[min(w*part, draws):min((w+1)*part, draws)]
				wg.Go(func() {
					n := 0
					for i := 0; i < len(mine); i += c.batch {
						n += d.decide(mine[i:min(i+c.batch, len(mine))])
					}
					mu.Lock()
					got += int64(n)
					mu.Unlock()
				})
			}
			wg.Wait()
			took := time.Since(start)
			inst.close()
			// A run of a second or more may see refills: one token per key
			// per second at most.
			slack := int64(took/time.Second) * int64(len(seen))
			if got < want || got > want+slack {
				t.Errorf("%v: %s / %s admitted %d of %d requests (in %v), where the policy admits %d", p.Limit().Rate(), s.name, c.name, got, draws, took, want)
			}
		}
	}
}

// TestMeasureCountsErrors: a request answered with an error is counted,
// so that the decisions table warns of it rather than reading it as a
// (cheap) denial. Here the engine tracks half the scenario's keys.
func TestMeasureCountsErrors(t *testing.T) {
	s := scenario{name: "uniform", keys: 1000, policy: admitAll}
	names := keyNames(s.keys)
	picks := make([]int, drawLen)
	for i := range picks {
		picks[i] = i % s.keys
	}
	ks := &keySet{names: names, draws: keycopy.Copies(names, picks)}
	for _, c := range []contender{
		{name: "Allow, half the keys", batch: 1, setup: func(p policy.Policy, n int) instance { return tokenshardAllow(p, n/2) }},
		{name: "AllowBatch, half the keys", batch: 16, setup: func(p policy.Policy, n int) instance { return tokenshardBatch(p, n/2) }},
	} {
		rg := newRig(c, s, func() *keySet { return ks })
		rg.ready() // warming up meets errors too, before any measurement
		_, _, made, allowed, failed := measure(rg, 1000/c.batch)
		rg.close()
		if failed == 0 || allowed+failed != made {
			t.Errorf("%s: %d decisions, %d admitted, %d errors: want errors counted, the rest admitted", c.name, made, allowed, failed)
		}
	}
}

// allocSink keeps what allocDecider allocates reachable, so that the
// allocation is not optimised away; atomic, as the workers share it.
var allocSink atomic.Pointer[[64]byte]

// allocDecider admits every key and allocates once per call, as a batch
// path that built a slice per call would.
type allocDecider struct{}

func (allocDecider) decide(keys []string) int {
	allocSink.Store(new([64]byte))
	return len(keys)
}

// TestMeasureCountsAllocs: the decisions table's allocations are per
// decision and not rounded down, so a contender that allocates once per
// call of 64 shows it (1/64 of an allocation per decision), and the
// harness's own allocations (its worker goroutines, their deciders and
// cursors, a few dozen per measurement) are not charged to the contender
// however few calls a measurement makes: at most one, when waiting for the
// workers takes the runtime a new wait record.
func TestMeasureCountsAllocs(t *testing.T) {
	s := scenario{name: "hot", keys: 1, policy: admitAll}
	ks := newKeySet(s)
	for _, c := range []struct {
		c        contender
		calls    int
		min, max float64
	}{
		{contender{name: "one allocation per call of 64", batch: 64, setup: func(policy.Policy, int) instance {
			return instance{forWorker: func() decider { return allocDecider{} }, close: func() {}}
		}}, 2000, 1.0 / 64, 1.5 / 64},
		{contender{name: "no allocation, few calls", batch: 1, setup: func(policy.Policy, int) instance {
			return instance{forWorker: func() decider { return noopDecider{} }, close: func() {}}
		}}, 20, 0, 1.0 / 20},
		{contender{name: "no allocation, few calls, sequential", batch: 1, sequential: true, setup: func(policy.Policy, int) instance {
			return instance{forWorker: func() decider { return noopDecider{} }, close: func() {}}
		}}, 20, 0, 1.0 / 20},
	} {
		rg := newRig(c.c, s, func() *keySet { return ks })
		rg.ready()
		// The most of a few measurements: a stray allocation by the runtime
		// may land in one of them.
		least := math.Inf(1)
		for range 3 {
			_, allocs, _, _, _ := measure(rg, c.calls)
			least = min(least, float64(allocs))
		}
		rg.close()
		if least < c.min || least > c.max {
			t.Errorf("%s: %v allocations per decision, want %v to %v", c.c.name, least, c.min, c.max)
		}
	}
}

// noopDecider admits every key and allocates nothing.
type noopDecider struct{}

func (noopDecider) decide(keys []string) int { return len(keys) }
