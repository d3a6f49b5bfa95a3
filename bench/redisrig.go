package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The Redis rig: what the Redis section of `go run ./bench` and
// BenchmarkRedisStore share. Both run the in-process engine and the Redis
// store through engine.Admitter, so both pay the same interface call.

// redisAdmit admits every request of a run, with the buckets of every key
// kept in Redis throughout: prespend takes redisHeadroom tokens from each,
// and at one token a second a bucket lives until it has refilled them (the
// store expires full buckets, as the engine's sweep evicts them). So every
// measured decision reads, refills and writes an existing bucket, as the
// engine's rows do, rather than creating one. The capacity is one the
// script computes on in doubles (up to 4,503,599 tokens), as most services'
// are; larger ones take its limb arithmetic, several times slower.
var redisAdmit = policy.Policy{Version: 1, Capacity: 1_000_000, TokensPerSecond: 1}

// redisHeadroom is how many seconds a pre-spent bucket outlives the
// prespend: longer than the Redis section, short enough that the keys of an
// interrupted run (which cannot delete them) expire soon after it.
const redisHeadroom = 600

// redisTimeout bounds each store call. The default (250 ms) is a service's
// choice; under 64 goroutines on a busy 2-core machine a pipelined batch
// can queue longer, and a fail-closed answer would be a wrong measurement,
// not a slow one.
const redisTimeout = 5 * time.Second

// newRedisClient connects to addr as redisstore requires, with go-redis's
// default pools (10 connections per GOMAXPROCS, plus 10 for pipelines),
// and checks that something answers. An addr of several addresses joined
// by commas is a Redis Cluster's masters (-redis-cluster).
func newRedisClient(ctx context.Context, addr string) (redis.UniversalClient, error) {
	var rdb redis.UniversalClient
	if strings.Contains(addr, ",") {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addr, ","), ContextTimeoutEnabled: true})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	return rdb, nil
}

// servers calls f with each server of rdb: the one, or every master of a
// cluster in turn.
func servers(ctx context.Context, rdb redis.UniversalClient, f func(c redis.UniversalClient) error) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return f(rdb)
	}
	var ms []redis.UniversalClient
	var mu sync.Mutex
	if err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		ms = append(ms, c)
		mu.Unlock()
		return nil
	}); err != nil {
		return err
	}
	for _, m := range ms {
		if err := f(m); err != nil {
			return err
		}
	}
	return nil
}

// masters is how many servers rdb has: 1, or a cluster's masters.
func masters(ctx context.Context, rdb redis.UniversalClient) int {
	n := 0
	_ = servers(ctx, rdb, func(redis.UniversalClient) error { n++; return nil })
	return n
}

// freshPrefix is a key prefix no earlier run used: "tsbench:<16 hex>:".
func freshPrefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "tsbench:" + hex.EncodeToString(b[:]) + ":"
}

// deletePrefix deletes every key under prefix (SCAN prefix* then DEL) and
// returns how many. prefix must hold no glob characters (freshPrefix's
// do not).
func deletePrefix(ctx context.Context, rdb redis.UniversalClient, prefix string) (int, error) {
	n := 0
	err := servers(ctx, rdb, func(rdb redis.UniversalClient) error {
		var cursor uint64
		for {
			keys, next, err := rdb.Scan(ctx, cursor, prefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			for _, k := range keys { // one by one: a cluster's are in many slots
				del, err := rdb.Del(ctx, k).Result()
				if err != nil {
					return err
				}
				n += int(del)
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
	return n, err
}

// newRedisStore makes a store on prefix with policy p and redisTimeout.
func newRedisStore(ctx context.Context, rdb redis.UniversalClient, prefix string, p policy.Policy) (*redisstore.Store, error) {
	return redisstore.New(ctx, redisstore.Config{Client: rdb, Prefix: prefix, Policy: p, Timeout: redisTimeout})
}

// maxTopUp is how many keys a scenario may have for topUp to run before
// each store run: its hot keys. A scenario of many keys spends a few
// tokens of each per run, far from draining any.
const maxTopUp = 64

// topUp brings the store's buckets of names back to where prespend left
// them: full (a refund caps at capacity), then pre-spent again.
func topUp(ctx context.Context, a engine.Admitter, names []string) error {
	for _, k := range names {
		if _, err := a.Refund(ctx, k, a.Policy().Capacity); err != nil {
			return err
		}
	}
	return prespend(ctx, a, names)
}

// prespend makes one decision for every key of ks, costing redisHeadroom
// tokens (at most the capacity), so that every bucket exists and, under
// redisAdmit, outlives the run. It returns the first error any request met.
func prespend(ctx context.Context, a engine.Admitter, names []string) error {
	cost := min(int64(redisHeadroom), a.Policy().Capacity)
	const chunk = 1024 // four script calls, pipelined
	reqs := make([]engine.Request, 0, chunk)
	out := make([]engine.Result, chunk)
	for i := 0; i < len(names); i += chunk {
		reqs = reqs[:0]
		for _, k := range names[i:min(i+chunk, len(names))] {
			reqs = append(reqs, engine.Request{Key: k, Cost: cost})
		}
		if err := a.AllowBatch(ctx, reqs, out); err != nil {
			return err
		}
		for _, r := range out[:len(reqs)] {
			if r.Err != nil {
				return r.Err
			}
		}
	}
	return nil
}

// admitterAllow decides one key per Allow call; errs counts calls that
// returned an error.
type admitterAllow struct {
	a    engine.Admitter
	errs *atomic.Int64
}

func (d admitterAllow) decide(keys []string) int {
	n := 0
	ctx := context.Background()
	for _, k := range keys {
		dec, err := d.a.Allow(ctx, k, 1)
		switch {
		case err != nil:
			d.errs.Add(1)
		case dec.Allowed:
			n++
		}
	}
	return n
}

// admitterBatch decides all keys in one AllowBatch call, with buffers of its
// own; errs counts requests that got an error.
type admitterBatch struct {
	a    engine.Admitter
	errs *atomic.Int64
	reqs []engine.Request
	out  []engine.Result
}

func newAdmitterBatch(a engine.Admitter, errs *atomic.Int64, size int) *admitterBatch {
	return &admitterBatch{a: a, errs: errs, reqs: make([]engine.Request, 0, size), out: make([]engine.Result, size)}
}

func (d *admitterBatch) decide(keys []string) int {
	d.reqs = d.reqs[:0]
	for _, k := range keys {
		d.reqs = append(d.reqs, engine.Request{Key: k, Cost: 1})
	}
	if err := d.a.AllowBatch(context.Background(), d.reqs, d.out); err != nil {
		d.errs.Add(int64(len(keys)))
		return 0
	}
	n := 0
	for _, r := range d.out[:len(keys)] {
		switch {
		case r.Err != nil:
			d.errs.Add(1)
		case r.Decision.Allowed:
			n++
		}
	}
	return n
}

// admitterDecider is a decider for one worker: Allow for batch 1, else
// AllowBatch of batch keys.
func admitterDecider(a engine.Admitter, errs *atomic.Int64, batch int) decider {
	if batch == 1 {
		return admitterAllow{a: a, errs: errs}
	}
	return newAdmitterBatch(a, errs, batch)
}

// cellResult is what a fixed-time run of one contender measured.
type cellResult struct {
	decisions, allowed int64
	elapsed            time.Duration
	mallocs            uint64 // heap allocations in the process meanwhile
}

func (r cellResult) nsPer() float64 { return float64(r.elapsed.Nanoseconds()) / float64(r.decisions) }

// runFor runs workers goroutines, each deciding runs of batch keys from its
// own offset in ks.draws, for about d: each worker stops after the call in
// flight when d ends, and elapsed runs until the last one has.
func runFor(ks *keySet, workers, batch int, d time.Duration, newDecider func() decider) cellResult {
	var stop atomic.Bool
	var decisions, allowed atomic.Int64
	begin := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		dec := newDecider()
		wg.Add(1)
		go func() {
			defer wg.Done()
			cur := newDrawCursor(ks, w*104_729, batch)
			<-begin
			var n, a int64
			for !stop.Load() {
				a += int64(dec.decide(cur.next()))
				n += int64(batch)
			}
			decisions.Add(n)
			allowed.Add(a)
		}()
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	close(begin)
	time.AfterFunc(d, func() { stop.Store(true) }) // fired before wg.Wait returns
	wg.Wait()
	elapsed := time.Since(t0)
	runtime.ReadMemStats(&after)
	return cellResult{
		decisions: decisions.Load(),
		allowed:   allowed.Load(),
		elapsed:   elapsed,
		mallocs:   after.Mallocs - before.Mallocs,
	}
}

// cmdStats is what INFO commandstats says Redis spent running scripts
// (EVALSHA, EVAL, FCALL): their calls and microseconds (the script with the
// commands it calls, not the I/O).
type cmdStats struct{ calls, usec int64 }

func readCmdStats(ctx context.Context, rdb redis.UniversalClient) (cmdStats, error) {
	var s cmdStats
	err := servers(ctx, rdb, func(rdb redis.UniversalClient) error {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		s.add(info)
		return nil
	})
	return s, err
}

// add adds what one server's INFO commandstats says.
func (s *cmdStats) add(info string) {
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var calls, usec int64
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall":
			s.calls += calls
			s.usec += usec
		}
	}
}

// serverVersion is Redis's version, for the section's title.
func serverVersion(ctx context.Context, rdb redis.UniversalClient) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}
