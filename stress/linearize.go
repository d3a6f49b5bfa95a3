package main

// The linearizability check. Concurrent clients call an
// engine with several shards while every invocation and response is
// recorded; porcupine then searches for an order of the operations,
// consistent with real time, that the sequential specification (internal/model,
// through linearize_model.go) accepts.
//
// Time: the engine reads a clock.Manual that moves only between rounds. In a
// round every client makes a few calls, and the driver waits for all of them
// before it advances the clock, so every operation of a round was decided at
// the same reading, recorded in its input: the specification needs no
// guess about when an operation read the clock. Cutovers and sweeps run
// inside rounds, concurrently with everything else: Allow, AllowBatch,
// AllowAll (over the keys of one group in a partitioned history, so that
// AllowAlls overlap in keys with each other and with every other call, and
// span shards where there are several), Refund and Peek. Policies carry per-key
// overrides about half the time, Refill rates of other periods and bands a
// third of the time each, and cutovers change them all (bands added,
// dropped, reshaped, matched by name), so the model's per-key limits
// (model.ShapeOf) are checked under concurrency too.
//
// Real time: Call and Return come from one atomic counter, taken just
// before the call and just after it returns, so A.Return < B.Call means A
// really returned before B was invoked.
//
// What is atomic. Porcupine needs each operation to take effect at one
// instant inside its interval. The engine promises that of Allow, Refund and
// Peek (decided by the key's shard, which reserves a new key's slot in the
// atomic key budget as it decides), AllowAll (every shard it touches held
// at once, so it takes effect for all its keys at one instant: it is one
// operation, whose answer and effect depend on all its keys, which is why
// the specification holds every key in one model and partitions merge the
// keys AllowAlls join; see linSpec.partition), KeyCount and Policy (one
// atomic load each) and ReplacePolicy
// (stale or not is judged under the coordinator; a cutover is two-phase: at
// the instant the new policy is stored every shard is prepared and none has
// published, so it takes effect everywhere at once, and every shard's
// cutover reading is the round's). It does not promise it of a whole AllowBatch (parts on
// different shards are decided at different instants) or a whole EvictFull
// (shards are swept one after another, and KeyCount drops one eviction at a
// time). So they are recorded as several atomic operations sharing the
// call's interval, which is sound because the real instants of the pieces
// lie inside it:
//   - a batch becomes one operation per key, holding that key's items in
//     request order: they go to one shard, which decides them in order
//     without serving anything else, and the items of other keys between
//     them cannot change their answers unless the key bound binds, and
//     unpartitioned histories (where it may bind) never repeat a key in a
//     batch;
//   - a sweep becomes one pass per key: evict it if it is full. That happens
//     while its shard serves nothing else, and other shards see the eviction
//     when the key budget is released, so it is atomic. Each pass carries
//     the call's answer; the count must be the number of passes that
//     evicted (checked in unpartitioned histories).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// linTimeout bounds porcupine's search for one history. Histories are kept
// small enough to be checked in milliseconds; a timeout is counted in
// c.linTimeouts, not reported as a violation.
const linTimeout = 10 * time.Second

// linSteps are the clock steps between rounds: none, a nanosecond, fractions
// of a token at the usual rates, and jumps that fill every bucket.
var linSteps = []int64{0, 0, 1, 1_000_000, 100_000_000, 250_000_000, 333_333_333, 500_000_000,
	1_000_000_000, 3_000_000_000, 3_600_000_000_000}

// runLinearizability records and checks histories, seeded from o.seed, until
// ctx ends; the history in progress then finishes. Two of every three are
// partitioned by key (MaxKeys above the number of keys), the third is checked
// whole, usually with MaxKeys below the number of keys. It returns the first
// violation.
func runLinearizability(ctx context.Context, o options, c *counters) error {
	for i := uint64(0); ctx.Err() == nil; i++ {
		rng := rand.New(rand.NewPCG(o.seed, i))
		spec := linNewSpec(rng, i%3 != 2, o.shards)
		if err := linOne(spec, rng, c, os.TempDir()); err != nil {
			if v := (*Violation)(nil); errors.As(err, &v) {
				v.Seed = o.seed
				v.Detail = fmt.Sprintf("history %d of seed %d: %s\n%s", i, o.seed, spec, v.Detail)
			}
			return err
		}
	}
	return nil
}

// linOne records one history of spec and checks it. It returns a
// *Violation, an error that kept it from checking, or nil.
func linOne(spec *linSpec, rng *rand.Rand, c *counters, vizDir string) error {
	h, err := linRecord(spec, rng, c)
	if err != nil {
		return err
	}
	v, unknown := linCheck(spec, h, vizDir)
	if unknown {
		c.linTimeouts.Add(1)
		return nil
	}
	c.histories.Add(1)
	if v != nil {
		return v
	}
	return nil
}

// linNewSpec draws one history's configuration. shards 0 draws a count.
func linNewSpec(rng *rand.Rand, partitioned bool, shards int) *linSpec {
	sp := &linSpec{partitioned: partitioned, shards: shards}
	if sp.shards == 0 {
		sp.shards = []int{1, 2, 3, 4, 16}[rng.IntN(5)]
	}
	var keys int
	if partitioned {
		keys = 3 + rng.IntN(6)
		sp.maxKeys = keys + 1 + rng.IntN(4) // above the keys: the bound never binds
		sp.clients = 3 + rng.IntN(4)
		sp.rounds = 8 + rng.IntN(8)
		sp.perRound = 3
	} else {
		// Small, so the search over every key at once stays fast.
		keys = 3 + rng.IntN(2)
		sp.maxKeys = 1 + rng.IntN(keys-1) // below the keys: ErrKeyCapacity
		if rng.IntN(4) == 0 {
			sp.maxKeys = keys + rng.IntN(2)
		}
		sp.clients = 3 + rng.IntN(2)
		sp.rounds = 6 + rng.IntN(6)
		sp.perRound = 2
	}
	for i := range keys {
		sp.keys = append(sp.keys, fmt.Sprintf("k%d", i))
	}
	sp.pol = linRandPolicy(rng, 1+rng.Int64N(3))
	sp.pol.Overrides = linRandOverrides(rng, nil)
	switch rng.IntN(8) {
	case 0:
		sp.start = math.MaxInt64 - 5_000_000_000_000 // the clock saturates within the history
	case 1, 2:
		sp.start = rng.Int64N(1 << 40)
	}
	return sp
}

func (sp *linSpec) String() string {
	mode := "unpartitioned"
	if sp.partitioned {
		mode = "partitioned"
	}
	return fmt.Sprintf("%s, %d keys, MaxKeys %d, %d shards, %d clients, %d rounds, policy %s, start %d",
		mode, len(sp.keys), sp.maxKeys, sp.shards, sp.clients, sp.rounds, policyText(sp.pol), sp.start)
}

// linRandPolicy draws a policy: small capacities and rates, so buckets run
// dry and refill within a history, and now and then math.MaxInt64; a third
// of the time a Refill rate of another period, and a third of the time
// bands.
func linRandPolicy(rng *rand.Rand, version int64) policy.Policy {
	caps := []int64{1, 2, 3, 4, 5, 8, 10, 16}
	rates := []int64{1, 2, 3, 4, 7, 10}
	p := policy.Policy{Version: version, Capacity: caps[rng.IntN(len(caps))], TokensPerSecond: rates[rng.IntN(len(rates))]}
	switch rng.IntN(30) {
	case 0:
		p.Capacity = math.MaxInt64
	case 1:
		p.TokensPerSecond = math.MaxInt64
	case 2:
		p.TokensPerSecond = policy.UnitsPerToken // a token a nanosecond
	}
	if rng.IntN(3) == 0 {
		p.TokensPerSecond, p.Refill = 0, linRefills[rng.IntN(len(linRefills))]
	}
	if rng.IntN(3) == 0 {
		p.Bands = linRandBands(rng)
	}
	return p
}

// linRefills are the Refill rates policies draw: periods the clock steps
// (linSteps) split unevenly, slow ones a history never refills, and the
// extremes.
var linRefills = []policy.Rate{
	{Tokens: 7, Per: 3 * time.Second}, policy.PerMinute(100), {Tokens: 1, Per: 250 * time.Millisecond},
	{Tokens: 2, Per: 3}, policy.PerHour(3), policy.PerDay(1), {Tokens: 1, Per: math.MaxInt64}, {Tokens: math.MaxInt64, Per: 1},
}

// linBandNames are the names bands draw from, few so that cutovers match
// bands by name; "daily" is an override name too (linRandOverrides).
var linBandNames = []string{"daily", "burst", "b"}

// linRandBands draws one to three bands of small shapes.
func linRandBands(rng *rand.Rand) *policy.BandSet {
	caps := []int64{1, 2, 3, 5, 10}
	var bs []policy.Band
	for _, i := range rng.Perm(len(linBandNames))[:1+rng.IntN(len(linBandNames))] {
		r := linRefills[rng.IntN(len(linRefills))]
		if rng.IntN(3) == 0 {
			r = policy.PerSecond(1 + rng.Int64N(10))
		}
		bs = append(bs, policy.Band{Name: linBandNames[i], Capacity: caps[rng.IntN(len(caps))], Refill: r})
	}
	return mustBands(bs...)
}

// linMatches are the Matches overrides draw from, over the keys k0 to k8:
// exact keys, and patterns with '*' first, inside, last, around, alone, and
// one that matches no key.
var linMatches = []string{"k0", "k1", "k2", "k5", "*1", "*3", "k*2", "k*4", "k*", "*k*", "*", "k1*", "q*"}

// linRandOverrides draws the overrides of a policy, or nil (about half the
// time): one to three, with limits from linRandPolicy's small shapes. From
// prev's, now and then: its Matches in a new order, each limit kept or
// moved, so keys change limits at a cutover whose default stays put too.
func linRandOverrides(rng *rand.Rand, prev *policy.OverrideSet) *policy.OverrideSet {
	if rng.IntN(2) == 0 {
		return nil
	}
	var os []policy.Override
	if prev.Len() > 0 && rng.IntN(3) == 0 {
		os = prev.Overrides()
		rng.Shuffle(len(os), func(i, j int) { os[i], os[j] = os[j], os[i] })
		for i := range os {
			if rng.IntN(2) == 0 {
				l := linRandPolicy(rng, 1)
				os[i].Capacity, os[i].TokensPerSecond, os[i].Refill, os[i].Bands = l.Capacity, l.TokensPerSecond, l.Refill, l.Bands
			}
		}
		return namedOverrides(os)
	}
	for _, i := range rng.Perm(len(linMatches))[:1+rng.IntN(3)] {
		l := linRandPolicy(rng, 1)
		o := policy.Override{Match: linMatches[i], Capacity: l.Capacity, TokensPerSecond: l.TokensPerSecond, Refill: l.Refill, Bands: l.Bands}
		if rng.IntN(3) == 0 {
			o.Name = []string{"gold", "daily"}[rng.IntN(2)]
		}
		os = append(os, o)
	}
	return namedOverrides(os)
}

// linCapacity is the capacity a request on key is drawn around: mostly the
// largest cost the key's own limit under cur admits (its smallest band's
// capacity), sometimes its primary's or the default's, so a cost may be
// within one and above the other.
func linCapacity(rng *rand.Rand, cur policy.Policy, key string) int64 {
	switch rng.IntN(8) {
	case 0, 1:
		return cur.Capacity
	case 2:
		return shapeOf(cur, key).Primary.Capacity
	}
	return minCapacity(shapeOf(cur, key))
}

// linCall is one planned engine call. kind uses the operation kinds:
// linAllow (an AllowBatch when reqs is set), linAllowAll (of reqs),
// linRefund and linCharge (of cost tokens), linPeek, linCutover, linPass
// for EvictFull,
// linKeyCount and linPolicy.
type linCall struct {
	kind     linKind
	key      string
	cost     int64
	reqs     []engine.Request
	next     policy.Policy
	expected int64
}

// linRecorder runs one history's calls and records them.
type linRecorder struct {
	e       *engine.Engine
	spec    *linSpec
	c       *counters
	seq     atomic.Int64 // the logical time of Call and Return
	sweeps  atomic.Int64 // numbers EvictFull calls
	shardOf map[string]int
	groups  [][]string // the key groups an AllowAll draws its keys from
}

// linRecord runs spec's history on a fresh engine and returns it.
func linRecord(spec *linSpec, rng *rand.Rand, c *counters) ([]porcupine.Operation, error) {
	clk := clock.NewManual(spec.start)
	cfg := engine.Config{Policy: spec.pol, MaxKeys: spec.maxKeys, Shards: spec.shards, Clock: clk}
	e, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	r := &linRecorder{e: e, spec: spec, c: c, shardOf: linShards(e, spec.keys)}
	defer func() { _ = r.e.Close() }() // the engine in use at the end
	r.groups = linGroups(rng, spec, r.shardOf)
	ops := make([][]porcupine.Operation, spec.clients) // ops[w] is written only by client w
	for round := range spec.rounds {
		if round > 0 {
			// No call is in flight: the previous round has been waited for.
			clk.Advance(time.Duration(linSteps[rng.IntN(len(linSteps))]))
			if rng.IntN(8) == 0 {
				if err := r.restart(cfg); err != nil {
					return nil, err
				}
			}
		}
		now := clk.Now()
		plans := r.plan(rng)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range spec.clients {
			wg.Go(func() {
				<-start // released together, so the calls of a round overlap
				for _, call := range plans[w] {
					ops[w] = r.do(w, now, call, ops[w])
				}
			})
		}
		close(start)
		wg.Wait()
	}
	var h []porcupine.Operation
	for _, o := range ops {
		h = append(h, o...)
	}
	c.holdsAborted.Add(int64(r.e.Stats().Total.HoldsAborted))
	linCountOverrides(spec, h, c)
	return h, nil
}

// restart snapshots the engine between rounds, closes it, and goes on with
// the engine Restore builds from the snapshot, under the policy in force, at
// the same reading: every balance comes back as it was, debts included, so
// the history needs no operation for it. The shards' counts of what was
// held while it ran start again from zero.
func (r *linRecorder) restart(cfg engine.Config) error {
	var buf bytes.Buffer
	if err := r.e.Snapshot(context.Background(), &buf); err != nil {
		return err
	}
	r.c.holdsAborted.Add(int64(r.e.Stats().Total.HoldsAborted))
	cfg.Policy = r.e.Policy()
	if err := r.e.Close(); err != nil {
		return err
	}
	e, _, err := engine.Restore(cfg, &buf, engine.RestoreOptions{})
	if err != nil {
		return err
	}
	r.e = e
	r.c.restores.Add(1)
	return nil
}

// linCountOverrides counts, for the summary and the tests, the decisions of
// h made under an override and the keys its cutovers gave another limit.
func linCountOverrides(spec *linSpec, h []porcupine.Operation, c *counters) {
	pols := map[int64]policy.Policy{spec.pol.Version: spec.pol}
	for _, op := range h {
		if in := op.Input.(*linInput); in.kind == linCutover && op.Output.(*linOutput).err == nil {
			pols[in.next.Version] = in.next
		}
	}
	for _, op := range h {
		in, out := op.Input.(*linInput), op.Output.(*linOutput)
		switch in.kind {
		case linAllow, linAllowAll:
			key := in.key
			if in.kind == linAllowAll {
				if out.n < 0 || out.n >= len(in.reqs) {
					continue
				}
				key = in.reqs[out.n].Key // the binding request's
			}
			for _, r := range out.res {
				p, ok := pols[r.d.Version]
				if !ok || r.err != nil {
					continue
				}
				if overridden(p, key) {
					c.overridden.Add(1)
				}
				recordShape(c, shapeOf(p, key), r.d.Band)
			}
		case linCutover:
			if prev, ok := pols[in.expected]; ok && out.err == nil {
				for _, k := range spec.keys {
					if shapeOf(prev, k) != shapeOf(in.next, k) {
						c.limitMoves.Add(1)
					}
					c.bandMoves.Add(int64(bandMoves(shapeOf(prev, k), shapeOf(in.next, k), nil)))
				}
			}
		}
	}
}

// plan draws one round's calls, client by client. It reads the engine's
// policy, between rounds, to aim cutovers at the version in force.
func (r *linRecorder) plan(rng *rand.Rand) [][]linCall {
	sp := r.spec
	cur := r.e.Policy()
	plans := make([][]linCall, sp.clients)
	sweeps := 0
	for w := range plans {
		for range 1 + rng.IntN(sp.perRound) {
			var call linCall
			switch k := rng.IntN(100); {
			case k < 36:
				key := r.randKey(rng)
				call = linCall{kind: linAllow, key: key, cost: linCost(rng, linCapacity(rng, cur, key))}
			case k < 42:
				key := r.randKey(rng)
				call = linCall{kind: linCharge, key: key, cost: linChargeTokens(rng, linCapacity(rng, cur, key))}
			case k < 53:
				call = linCall{kind: linAllow, reqs: r.randBatch(rng, cur)}
			case k < 67:
				call = linCall{kind: linAllowAll, reqs: r.randAll(rng, cur)}
			case k < 71:
				key := r.randKey(rng)
				call = linCall{kind: linRefund, key: key, cost: linCost(rng, linCapacity(rng, cur, key))}
			case k < 73:
				call = linCall{kind: linPeek, key: r.randKey(rng)}
			case k < 79 && (sp.partitioned || sweeps == 0):
				// A sweep is a pass per key, and passes nearly commute:
				// when porcupine backtracks over a round it tries their
				// interleavings, so a whole history gets one sweep a round.
				sweeps++
				call = linCall{kind: linPass}
			case k < 79:
				key := r.randKey(rng)
				call = linCall{kind: linAllow, key: key, cost: linCost(rng, linCapacity(rng, cur, key))}
			case k < 88:
				call = linCutoverCall(rng, cur)
			case k < 94:
				call = linCall{kind: linKeyCount}
			default:
				call = linCall{kind: linPolicy}
			}
			plans[w] = append(plans[w], call)
		}
	}
	return plans
}

func (r *linRecorder) randKey(rng *rand.Rand) string {
	if rng.IntN(40) == 0 {
		return " " // blank: ErrInvalidKey
	}
	return r.spec.keys[rng.IntN(len(r.spec.keys))]
}

// randBatch draws 2 to 4 requests. Unpartitioned histories use distinct
// keys (see the note on batches at the top of the file).
func (r *linRecorder) randBatch(rng *rand.Rand, cur policy.Policy) []engine.Request {
	sp := r.spec
	n := 2 + rng.IntN(3)
	var reqs []engine.Request
	if sp.partitioned {
		for range n {
			key := r.randKey(rng)
			reqs = append(reqs, engine.Request{Key: key, Cost: linCost(rng, linCapacity(rng, cur, key))})
		}
		return reqs
	}
	for _, i := range rng.Perm(len(sp.keys))[:min(n, len(sp.keys))] {
		key := sp.keys[i]
		reqs = append(reqs, engine.Request{Key: key, Cost: linCost(rng, linCapacity(rng, cur, key))})
	}
	return reqs
}

// randAll draws an AllowAll: one to four requests on the keys of one group
// (so a key may repeat, and its costs add up), mostly of cost 1 or 2 so
// that calls are decided, admitted or refused; now and then a blank key, a
// cost drawn as linCost draws, no requests, or one too many.
func (r *linRecorder) randAll(rng *rand.Rand, cur policy.Policy) []engine.Request {
	switch rng.IntN(60) {
	case 0:
		return nil // ErrAllowAllSize
	case 1:
		return slices.Repeat([]engine.Request{{Key: r.spec.keys[0], Cost: 1}}, engine.MaxAllowAll+1)
	}
	group := r.groups[rng.IntN(len(r.groups))]
	reqs := make([]engine.Request, 1+rng.IntN(4))
	for i := range reqs {
		key := group[rng.IntN(len(group))]
		if rng.IntN(50) == 0 {
			key = " " // blank: ErrInvalidKey
		}
		reqs[i] = engine.Request{Key: key, Cost: 1 + rng.Int64N(2)}
		if rng.IntN(6) == 0 {
			reqs[i].Cost = linCost(rng, linCapacity(rng, cur, key))
		}
	}
	return reqs
}

// linGroups splits spec's keys into the groups AllowAlls draw from. An
// unpartitioned history has one, every key. A partitioned one has groups of
// two or three keys, each its own partition (see linSpec.partition), dealt
// from the keys of each shard in turn so that a group spans shards when it
// can: an AllowAll over several shards holds them all.
func linGroups(rng *rand.Rand, spec *linSpec, shardOf map[string]int) [][]string {
	if !spec.partitioned {
		return [][]string{spec.keys}
	}
	byShard := map[int][]string{}
	for _, k := range spec.keys {
		byShard[shardOf[k]] = append(byShard[shardOf[k]], k)
	}
	shards := slices.Sorted(maps.Keys(byShard))
	rng.Shuffle(len(shards), func(i, j int) { shards[i], shards[j] = shards[j], shards[i] })
	var dealt []string
	for len(dealt) < len(spec.keys) {
		for _, s := range shards {
			if ks := byShard[s]; len(ks) > 0 {
				i := rng.IntN(len(ks))
				dealt = append(dealt, ks[i])
				byShard[s] = slices.Delete(ks, i, i+1)
			}
		}
	}
	var groups [][]string
	for len(dealt) > 0 {
		n := min(2+rng.IntN(2), len(dealt))
		groups = append(groups, dealt[:n])
		dealt = dealt[n:]
	}
	return groups
}

// linShards returns the shard of each of keys in e: a Peek of each (which
// changes nothing a history can see) and the shard whose count of Peeks
// moved. A key whose shard it could not tell within a second (a shard
// publishes its counts when it parks) is not in the map.
func linShards(e *engine.Engine, keys []string) map[string]int {
	out := map[string]int{}
	peeks := func() []uint64 {
		st := e.Stats()
		n := make([]uint64, len(st.Shards))
		for i, s := range st.Shards {
			n[i] = s.Peeks
		}
		return n
	}
	if len(e.Stats().Shards) == 1 {
		for _, k := range keys {
			out[k] = 0
		}
		return out
	}
	before := peeks()
	for _, k := range keys {
		if _, err := e.Peek(context.Background(), k); err != nil {
			continue
		}
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); runtime.Gosched() {
			now := peeks()
			moved := -1
			for i := range now {
				if now[i] != before[i] {
					moved = i
				}
			}
			if moved >= 0 {
				out[k], before = moved, now
				break
			}
		}
	}
	return out
}

// countAll counts a decided AllowAll: admitted or refused, and whether its
// keys span several shards.
func (r *linRecorder) countAll(reqs []engine.Request, d engine.Decision, err error) {
	if err != nil {
		return
	}
	if d.Allowed {
		r.c.allAdmitted.Add(1)
	} else {
		r.c.allRefused.Add(1)
	}
	shards := map[int]bool{}
	for _, q := range reqs {
		if s, ok := r.shardOf[q.Key]; ok {
			shards[s] = true
		}
	}
	if len(shards) > 1 {
		r.c.allSpread.Add(1)
	}
}

// linCost draws a cost: mostly small, sometimes the whole capacity or just
// above it, and now and then invalid.
func linCost(rng *rand.Rand, capacity int64) int64 {
	switch k := rng.IntN(20); {
	case k < 10:
		return 1
	case k < 15:
		return 2 + rng.Int64N(2)
	case k < 18:
		return 1 + rng.Int64N(min(capacity, 1<<40)+1)
	case k == 18:
		return capacity
	default:
		return []int64{0, 17, math.MaxInt64}[rng.IntN(3)]
	}
}

// linChargeTokens draws the tokens of a Charge: mostly a few, else about
// the capacity, twice it (a full bucket taken to its floor), far past it,
// or invalid.
func linChargeTokens(rng *rand.Rand, capacity int64) int64 {
	switch k := rng.IntN(20); {
	case k < 10:
		return 1 + rng.Int64N(3)
	case k < 14:
		return capacity
	case k < 17:
		return min(capacity, math.MaxInt64/2) * 2
	case k < 19:
		return math.MaxInt64
	default:
		return 0 // ErrInvalidCost
	}
}

// linCutoverCall draws a ReplacePolicy aimed at cur: mostly one that can
// succeed (clients racing with the same expected version: one wins), else
// stale in each way, or invalid. Its overrides are new, cur's moved, or
// cur's very set.
func linCutoverCall(rng *rand.Rand, cur policy.Policy) linCall {
	call := linCall{kind: linCutover, next: linRandPolicy(rng, cur.Version+1+rng.Int64N(2)), expected: cur.Version}
	call.next.Overrides = linRandOverrides(rng, cur.Overrides)
	if rng.IntN(5) == 0 {
		call.next.Overrides = cur.Overrides
	}
	if rng.IntN(5) == 0 {
		call.next.Bands = cur.Bands // the same set, by reference
	}
	switch rng.IntN(10) {
	case 6:
		call.expected = cur.Version - 1
	case 7:
		call.next.Version = cur.Version
	case 8:
		call.expected = cur.Version + 1
	case 9:
		call.next.Version = 0
	}
	return call
}

// do makes one call for client w at the round's reading now and appends
// its operations to ops.
func (r *linRecorder) do(w int, now int64, call linCall, ops []porcupine.Operation) []porcupine.Operation {
	ctx := context.Background() // a history is short: it finishes even when the run ends
	add := func(in *linInput, out *linOutput, t0, t1 int64) {
		ops = append(ops, porcupine.Operation{ClientId: w, Input: in, Call: t0, Output: out, Return: t1})
	}
	switch call.kind {
	case linAllow:
		if call.reqs == nil {
			t0 := r.seq.Add(1)
			d, err := r.e.Allow(ctx, call.key, call.cost)
			t1 := r.seq.Add(1)
			r.c.record(d, err)
			add(&linInput{kind: linAllow, now: now, key: call.key, costs: []int64{call.cost}},
				&linOutput{res: []linResult{{d, err}}}, t0, t1)
			return ops
		}
		res := make([]engine.Result, len(call.reqs))
		t0 := r.seq.Add(1)
		err := r.e.AllowBatch(ctx, call.reqs, res)
		t1 := r.seq.Add(1)
		group := map[string]int{}
		var ins []*linInput
		var outs []*linOutput
		for i, q := range call.reqs {
			r.c.record(res[i].Decision, res[i].Err)
			g, ok := group[q.Key]
			if !ok {
				g = len(ins)
				group[q.Key] = g
				ins = append(ins, &linInput{kind: linAllow, now: now, key: q.Key, batch: true})
				outs = append(outs, &linOutput{err: err})
			}
			ins[g].costs = append(ins[g].costs, q.Cost)
			outs[g].res = append(outs[g].res, linResult{res[i].Decision, res[i].Err})
		}
		for g := range ins {
			add(ins[g], outs[g], t0, t1)
		}
	case linAllowAll:
		t0 := r.seq.Add(1)
		d, at, err := r.e.AllowAll(ctx, call.reqs)
		t1 := r.seq.Add(1)
		r.c.record(d, err)
		r.countAll(call.reqs, d, err)
		add(&linInput{kind: linAllowAll, now: now, reqs: call.reqs}, &linOutput{res: []linResult{{d, err}}, n: at}, t0, t1)
	case linRefund, linPeek, linCharge:
		t0 := r.seq.Add(1)
		var d engine.Decision
		var err error
		in := &linInput{kind: call.kind, now: now, key: call.key}
		switch call.kind {
		case linRefund:
			d, err = r.e.Refund(ctx, call.key, call.cost)
			in.costs = []int64{call.cost}
		case linCharge:
			d, err = r.e.Charge(ctx, call.key, call.cost)
			in.costs = []int64{call.cost}
			if err == nil {
				r.c.charges.Add(1)
				if d.Remaining < 0 {
					r.c.debts.Add(1)
				}
			}
		default:
			d, err = r.e.Peek(ctx, call.key)
		}
		t1 := r.seq.Add(1)
		add(in, &linOutput{res: []linResult{{d, err}}}, t0, t1)
	case linCutover:
		t0 := r.seq.Add(1)
		err := r.e.ReplacePolicy(ctx, call.next, call.expected)
		t1 := r.seq.Add(1)
		switch {
		case err == nil:
			r.c.cutovers.Add(1)
		case errors.Is(err, engine.ErrStalePolicy):
			r.c.stale.Add(1)
		}
		add(&linInput{kind: linCutover, now: now, next: call.next, expected: call.expected}, &linOutput{err: err}, t0, t1)
	case linPass:
		id := int(r.sweeps.Add(1))
		t0 := r.seq.Add(1)
		n, err := r.e.EvictFull(ctx)
		t1 := r.seq.Add(1)
		r.c.evictions.Add(int64(n))
		out := &linOutput{n: n, err: err}
		for _, k := range r.spec.keys {
			add(&linInput{kind: linPass, now: now, key: k, sweep: id, passes: len(r.spec.keys), tally: !r.spec.partitioned}, out, t0, t1)
		}
	case linKeyCount:
		t0 := r.seq.Add(1)
		n := r.e.KeyCount()
		t1 := r.seq.Add(1)
		add(&linInput{kind: linKeyCount, now: now}, &linOutput{n: n}, t0, t1)
	case linPolicy:
		t0 := r.seq.Add(1)
		p := r.e.Policy()
		t1 := r.seq.Add(1)
		add(&linInput{kind: linPolicy, now: now}, &linOutput{pol: p}, t0, t1)
	}
	return ops
}
