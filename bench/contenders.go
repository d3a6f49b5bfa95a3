package main

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// decider makes admission decisions for a run of keys. decide is called
// from many goroutines at once, except on a contender marked sequential.
// Each goroutine gets its own decider from forWorker, so batch buffers are
// not shared.
type decider interface {
	decide(keys []string) (allowed int)
}

// decideErrors counts the requests of in-process contenders answered with
// an error, which decide counts as denied: the decisions table warns of any.
var decideErrors atomic.Int64

// instance is one contender set up for one scenario.
type instance struct {
	forWorker func() decider
	close     func()
}

// contender is one way a service could limit requests.
type contender struct {
	name       string
	batch      int  // keys per decide call; 1 for single-request contenders
	peer       bool // a library a service would use instead of tokenshard
	sequential bool // may only be called from one goroutine (the floor)
	keepsState bool // keeps per-key state whose memory is worth measuring
	setup      func(p policy.Policy, maxKeys int) instance
}

var contenders = []contender{
	{name: "tokenshard Allow", batch: 1, keepsState: true, setup: tokenshardAllow},
	{name: "tokenshard AllowBatch 16", batch: 16, setup: tokenshardBatch},
	{name: "tokenshard AllowBatch 64", batch: 64, setup: tokenshardBatch},
	{name: "tokenshard AllowBatch 128", batch: 128, setup: tokenshardBatch},
	{name: "tokenshard Allow +overrides", batch: 1, keepsState: true, setup: withOverrides(tokenshardAllow)},
	{name: "tokenshard AllowBatch 128 +overrides", batch: 128, setup: withOverrides(tokenshardBatch)},
	{name: "tokenshard Allow per minute", batch: 1, keepsState: true, setup: perMinute(tokenshardAllow)},
	{name: "tokenshard AllowBatch 64 per minute", batch: 64, setup: perMinute(tokenshardBatch)},
	{name: "tokenshard Allow +3 bands", batch: 1, keepsState: true, setup: withBands(tokenshardAllow)},
	{name: "tokenshard AllowBatch 64 +3 bands", batch: 64, setup: withBands(tokenshardBatch)},
	{name: "x/time/rate map+mutex", batch: 1, peer: true, keepsState: true, setup: rateMutex},
	{name: "x/time/rate 64 shards", batch: 1, peer: true, keepsState: true, setup: rateSharded},
	{name: "x/time/rate 64 shards, 64 per clock read", batch: 64, peer: true, setup: rateShardedBatch},
	{name: "go-limiter memorystore", batch: 1, peer: true, keepsState: true, setup: goLimiter},
	{name: "floor (policy, 1 goroutine)", batch: 1, sequential: true, keepsState: true, setup: floor},
}

func newEngine(p policy.Policy, maxKeys int) *engine.Engine {
	e, err := engine.New(engine.Config{Policy: p, MaxKeys: maxKeys})
	if err != nil {
		panic(err) // the bench's own configuration is wrong
	}
	return e
}

type allowDecider struct{ e *engine.Engine }

func (d allowDecider) decide(keys []string) int {
	n := 0
	ctx := context.Background()
	for _, k := range keys {
		switch dec, err := d.e.Allow(ctx, k, 1); {
		case err != nil:
			decideErrors.Add(1)
		case dec.Allowed:
			n++
		}
	}
	return n
}

func tokenshardAllow(p policy.Policy, maxKeys int) instance {
	e := newEngine(p, maxKeys)
	return instance{
		forWorker: func() decider { return allowDecider{e} },
		close:     func() { _ = e.Close() },
	}
}

type batchDecider struct {
	e    *engine.Engine
	reqs []engine.Request
	out  []engine.Result
}

func (d *batchDecider) decide(keys []string) int {
	reqs := d.reqs[:0] // a local: appending to the field waits on memory
	for _, k := range keys {
		reqs = append(reqs, engine.Request{Key: k, Cost: 1})
	}
	d.reqs = reqs
	if err := d.e.AllowBatch(context.Background(), reqs, d.out); err != nil {
		decideErrors.Add(int64(len(keys)))
		return 0
	}
	n := 0
	for _, r := range d.out[:len(keys)] {
		switch {
		case r.Err != nil:
			decideErrors.Add(1)
		case r.Decision.Allowed:
			n++
		}
	}
	return n
}

func tokenshardBatch(p policy.Policy, maxKeys int) instance {
	e := newEngine(p, maxKeys)
	return instance{
		forWorker: func() decider {
			return &batchDecider{e: e, reqs: make([]engine.Request, 0, 128), out: make([]engine.Result, 128)}
		},
		close: func() { _ = e.Close() },
	}
}

// Overrides as a real service might carry them: many exact keys (tenants on
// a paid plan) and a handful of patterns (routes), every new key tried
// against all of them.
const (
	benchExact    = 1000
	benchPatterns = 20
)

// withOverrides gives setup a policy with benchExact exact overrides, spread
// over the scenario's keys (the rest name keys it never uses), and
// benchPatterns patterns, of which one matches a tenth of the keys. Every
// override has the scenario's own limit, so the decisions, and the table's
// "allowed" counts, are those of the plain policy: the difference is the
// cost of resolving.
func withOverrides(setup func(policy.Policy, int) instance) func(policy.Policy, int) instance {
	return func(p policy.Policy, maxKeys int) instance {
		seen := map[string]bool{}
		var os []policy.Override
		add := func(match string) {
			if !seen[match] {
				seen[match] = true
				os = append(os, policy.Override{Match: match, Capacity: p.Capacity, TokensPerSecond: p.TokensPerSecond, Refill: p.Refill})
			}
		}
		step := max(1, maxKeys/benchExact)
		for i := 0; i < maxKeys && len(os) < benchExact; i += step {
			add(keyName(i))
		}
		for i := maxKeys; len(os) < benchExact; i++ {
			add(keyName(i))
		}
		add("tenant:*7") // a tenth of the keys
		for i := 1; i < benchPatterns; i++ {
			add(fmt.Sprintf("route:%d:*", i))
		}
		set, err := policy.NewOverrideSet(os...)
		if err != nil {
			panic(err) // the bench's own configuration is wrong
		}
		p.Overrides = set
		return setup(p, maxKeys)
	}
}

// perMinute gives setup the scenario's rate written per minute, Refill
// PerMinute(60 x rate): the same decisions, but a period too long for the
// compact bucket, so every key keeps a level in the shard's level store.
// A scenario whose rate is already a Refill (allDenied's, per minute) is
// left as it is.
func perMinute(setup func(policy.Policy, int) instance) func(policy.Policy, int) instance {
	return func(p policy.Policy, maxKeys int) instance {
		if p.TokensPerSecond != 0 {
			p.Refill, p.TokensPerSecond = policy.PerMinute(60*p.TokensPerSecond), 0
		}
		return setup(p, maxKeys)
	}
}

// withBands adds three bands to the scenario's policy, per minute, hour
// and day, each too large ever to bind, so the decisions (and "allowed"
// counts) are the plain policy's: the difference is the cost of deciding
// four bands at once.
func withBands(setup func(policy.Policy, int) instance) func(policy.Policy, int) instance {
	return func(p policy.Policy, maxKeys int) instance {
		const big = 1 << 40
		set, err := policy.NewBands(
			policy.Band{Name: "minute", Capacity: big, Refill: policy.PerMinute(big)},
			policy.Band{Name: "hour", Capacity: big, Refill: policy.PerHour(big)},
			policy.Band{Name: "day", Capacity: big, Refill: policy.PerDay(big)})
		if err != nil {
			panic(err) // the bench's own configuration is wrong
		}
		p.Bands = set
		return setup(p, maxKeys)
	}
}

// rateLimit converts a policy to x/time/rate's float form, as its users do:
// tokens per second (a Refill's Tokens per Per), and the capacity as burst.
func rateLimit(p policy.Policy) (rate.Limit, int) {
	r := p.Limit().Rate()
	return rate.Limit(float64(r.Tokens) / r.Per.Seconds()), asInt(p.Capacity)
}

// asInt is v as an int, math.MaxInt if it is larger: where int is 32 bits
// a conversion alone would make admitAll's capacity of 1<<40 a burst of 0,
// which admits nothing.
func asInt(v int64) int { return int(min(v, math.MaxInt)) }

// rateMap is how services commonly use x/time/rate: a map of limiters
// guarded by one mutex.
type rateMap struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

func (r *rateMap) allow(key string) bool { return r.limiter(key).Allow() }

func (r *rateMap) limiter(key string) *rate.Limiter {
	r.mu.Lock()
	l, ok := r.m[key]
	if !ok {
		l = rate.NewLimiter(r.limit, r.burst)
		r.m[key] = l
	}
	r.mu.Unlock()
	return l
}

func (r *rateMap) decide(keys []string) int {
	n := 0
	for _, k := range keys {
		if r.allow(k) {
			n++
		}
	}
	return n
}

func rateMutex(p policy.Policy, _ int) instance {
	limit, burst := rateLimit(p)
	r := &rateMap{m: map[string]*rate.Limiter{}, limit: limit, burst: burst}
	return instance{forWorker: func() decider { return r }, close: func() {}}
}

// rateShards splits the map into 64 mutex-guarded shards by a string hash:
// hash/maphash's, the standard library's fastest, as tokenshard's shards use
// the runtime's. (A byte-at-a-time FNV-1a, here before, took 13 ns on a
// 17-byte key where maphash.String takes 8: a cost of the harness, not of
// x/time/rate.)
type rateShards struct {
	seed   maphash.Seed
	shards [64]rateMap
}

func (r *rateShards) decide(keys []string) int {
	n := 0
	for _, k := range keys {
		if r.of(k).allow(k) {
			n++
		}
	}
	return n
}

// of is the shard of key k.
func (r *rateShards) of(k string) *rateMap { return &r.shards[maphash.String(r.seed, k)&63] }

func rateSharded(p policy.Policy, _ int) instance {
	r := newRateShards(p)
	return instance{forWorker: func() decider { return r }, close: func() {}}
}

func newRateShards(p policy.Policy) *rateShards {
	limit, burst := rateLimit(p)
	r := &rateShards{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i] = rateMap{m: map[string]*rate.Limiter{}, limit: limit, burst: burst}
	}
	return r
}

// rateShardsBatch is rateShards deciding a batch at one reading of the
// clock, as x/time/rate's AllowN(t, 1) lets a caller do: the peer of
// tokenshard's AllowBatch, which reads its shards' clocks once per batch.
type rateShardsBatch struct{ *rateShards }

func (r rateShardsBatch) decide(keys []string) int {
	n := 0
	now := time.Now()
	for _, k := range keys {
		if r.of(k).limiter(k).AllowN(now, 1) {
			n++
		}
	}
	return n
}

func rateShardedBatch(p policy.Policy, _ int) instance {
	r := rateShardsBatch{newRateShards(p)}
	return instance{forWorker: func() decider { return r }, close: func() {}}
}

type storeDecider struct{ s limiter.Store }

func (d storeDecider) decide(keys []string) int {
	n := 0
	ctx := context.Background()
	for _, k := range keys {
		switch _, _, _, ok, err := d.s.Take(ctx, k); {
		case err != nil:
			decideErrors.Add(1)
		case ok:
			n++
		}
	}
	return n
}

func goLimiter(p policy.Policy, _ int) instance {
	s, err := memorystore.New(&memorystore.Config{Tokens: uint64(p.Capacity), Interval: goLimiterInterval(p), SweepInterval: time.Hour})
	if err != nil {
		panic(err)
	}
	return instance{
		forWorker: func() decider { return storeDecider{s} },
		close:     func() { _ = s.Close(context.Background()) },
	}
}

// goLimiterInterval is the Interval that makes go-limiter's bucket p's:
// it counts tokens per interval, so Capacity tokens refilled over
// Capacity/rate seconds (Capacity x Per / Tokens) is the same bucket. But
// at each new interval it adds intervals x Interval/Tokens tokens, which
// for a bucket of more
// tokens than the interval has nanoseconds rounds to none: such a bucket,
// one no run empties, gets an interval no run reaches, and so stays full
// as it does in every other contender. (Capacity seconds in nanoseconds
// also overflows int64 there.)
func goLimiterInterval(p policy.Policy) time.Duration {
	const never = 24 * time.Hour
	r := p.Limit().Rate()
	hi, lo := bits.Mul64(uint64(p.Capacity), uint64(r.Per))
	if hi != 0 || lo/uint64(r.Tokens) > uint64(never) || uint64(p.Capacity) > lo/uint64(r.Tokens) {
		return never
	}
	return time.Duration(lo / uint64(r.Tokens))
}

// floorDecider is the exact arithmetic on a plain map from one goroutine
// with no synchronisation: what any design pays at least, per core.
type floorDecider struct {
	m   map[string]policy.Bucket
	lim policy.Limit
	clk clock.Clock
}

func (f *floorDecider) decide(keys []string) int {
	n := 0
	now := f.clk.Now()
	for _, k := range keys {
		b, ok := f.m[k]
		if !ok {
			b = policy.NewBucket(f.lim, now)
		}
		if b.Decide(f.lim, now, 1).Allowed {
			n++
		}
		f.m[k] = b
	}
	return n
}

func floor(p policy.Policy, _ int) instance {
	f := &floorDecider{m: map[string]policy.Bucket{}, lim: p.Limit(), clk: clock.NewMonotonic()}
	return instance{forWorker: func() decider { return f }, close: func() {}}
}
