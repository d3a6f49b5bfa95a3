package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The differential check on the Redis store (-redis): the traces of
// diffGenerateStore replayed on a redisstore.Store whose time is a Manual
// clock the replay sets (Config.Clock), compared with the model as
// the engine is. Each target has a key prefix of its own, deleted when it
// closes, so traces never meet and the server does not fill up; one client
// serves them all.

const (
	// diffRedisTimeout is the store's Config.Timeout: generous, so a slow
	// machine (or -race) gives a harness error, never a fail-closed answer
	// that would pass for a denial.
	diffRedisTimeout = 10 * time.Second
	// diffRedisPrefix starts every target's prefix, so a server's leftovers
	// from a killed run are easy to find: redis-cli --scan --pattern 'tsstress:*'.
	diffRedisPrefix = "tsstress:"
)

// diffRedis is a Redis store behind diffTarget. It is used by one goroutine.
type diffRedis struct {
	s       *redisstore.Store
	rdb     redis.UniversalClient
	prefix  string
	manual  *clock.Manual
	c       *counters
	failure error // the first failure no answer shows, or nil: see failed
}

// diffRedisMaker returns the maker of Redis targets on rdb, which must have
// ContextTimeoutEnabled; the caller closes rdb after the last target.
func diffRedisMaker(rdb redis.UniversalClient) diffMaker {
	return func(cfg diffConfig, c *counters) (diffTarget, error) { return diffNewRedis(rdb, cfg, c) }
}

func diffNewRedis(rdb redis.UniversalClient, cfg diffConfig, c *counters) (diffTarget, error) {
	if !cfg.store || cfg.maxKeys != 0 || cfg.regress || cfg.shards > 1 {
		return nil, fmt.Errorf("differential: the Redis store replays only diffGenerateStore's traces (maxKeys 0, no regression, one shard), not %s", cfg)
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	d := &diffRedis{rdb: rdb, prefix: diffRedisPrefix + hex.EncodeToString(raw[:]) + ":", manual: clock.NewManual(cfg.start), c: c}
	s, err := redisstore.New(context.Background(), redisstore.Config{
		Client:      rdb,
		Prefix:      d.prefix,
		Policy:      cfg.policy,
		MaxKeyBytes: cfg.maxKeyBytes,
		Timeout:     diffRedisTimeout,
		OnError:     d.onError,
		Clock:       d.manual,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("differential: redisstore.New: %w", err), d.clean())
	}
	d.s = s
	return d, nil
}

// onError is the store's OnError: requests answered by the fail-closed
// rule, which the replay must not take for denials, or a pass that failed
// after a cutover.
func (d *diffRedis) onError(err error) { d.fail(err) }

// fail keeps the first failure, as the harness's if Redis could not serve.
func (d *diffRedis) fail(err error) {
	switch {
	case d.failure != nil:
	case diffRedisDown(err):
		d.failure = &diffUnreachable{err}
	default:
		d.failure = err
	}
}

// unreachable keeps err if it says Redis could not serve a call whose
// answer is the error. A store's failure with Redis answering is left to
// show as a wrong answer.
func (d *diffRedis) unreachable(err error) {
	if err != nil && diffRedisDown(err) {
		d.fail(err)
	}
}

// diffRedisDown reports whether err says Redis could not be reached or
// could not serve: the connection or its pool failed, a deadline passed,
// or the server is loading, busy, out of memory or out of clients. Any
// other error, such as the store giving up on its retries or a script's
// runtime error, is the store's own, with Redis answering.
func diffRedisDown(err error) bool {
	var ne net.Error
	switch {
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrClosed),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, engine.ErrKeyCapacity): // the store's word for Redis's OOM
		return true
	}
	for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "OOM", "MAXCLIENTS", "ERR max number of clients"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

func (d *diffRedis) setTime(t int64) int64 { return diffAdvance(d.manual, t) }

func (d *diffRedis) allow(key string, cost int64) (engine.Decision, error) {
	dec, err := d.s.Allow(context.Background(), key, cost)
	d.unreachable(err) // ErrKeyCapacity: Redis out of memory
	diffRecord(d.c, d.s.Policy, key, dec, err)
	return dec, err
}

func (d *diffRedis) charge(key string, tokens int64) (engine.Decision, error) {
	dec, err := d.s.Charge(context.Background(), key, tokens)
	d.unreachable(err) // ErrKeyCapacity: Redis out of memory; a degraded answer told onError
	if d.c != nil && err == nil && !dec.Degraded {
		d.c.charges.Add(1)
		if dec.Remaining < 0 {
			d.c.debts.Add(1)
		}
	}
	return dec, err
}

func (d *diffRedis) peek(key string) (engine.Decision, error) {
	dec, err := d.s.Peek(context.Background(), key)
	d.unreachable(err)
	return dec, err
}

func (d *diffRedis) refund(key string, tokens int64) (engine.Decision, error) {
	dec, err := d.s.Refund(context.Background(), key, tokens)
	d.unreachable(err)
	return dec, err
}

func (d *diffRedis) allowBatch(reqs []engine.Request, out []engine.Result) error {
	err := d.s.AllowBatch(context.Background(), reqs, out)
	if len(out) >= len(reqs) {
		for i, r := range out[:len(reqs)] {
			d.unreachable(r.Err)
			diffRecord(d.c, d.s.Policy, reqs[i].Key, r.Decision, r.Err)
		}
	}
	return err
}

func (d *diffRedis) evictFull() (int, error) {
	n, err := d.s.EvictFull(context.Background())
	d.unreachable(err)
	return n, err
}

func (d *diffRedis) replacePolicy(next policy.Policy, expected int64) error {
	err := d.s.ReplacePolicy(context.Background(), next, expected)
	d.unreachable(err)
	diffCountCutover(d.c, err)
	return err
}

func (d *diffRedis) allowAll(reqs []engine.Request) (engine.Decision, int, error) {
	dec, at, err := d.s.AllowAll(context.Background(), reqs)
	d.unreachable(err)
	return dec, at, err
}

// keyCount is the store's SCAN count: exact here, since one goroutine
// writes the prefix and a store driven by a clock sets no expiries.
func (d *diffRedis) keyCount() int {
	n, err := d.s.KeyCount(context.Background())
	if err != nil {
		d.fail(fmt.Errorf("KeyCount: %w", err))
		return -1
	}
	return n
}

func (d *diffRedis) policy() policy.Policy { return d.s.Policy() }

// failed also checks the store's own count of fail-closed answers, in case
// one came without an OnError call (then its cause is unknown, and taken
// for the harness's).
func (d *diffRedis) failed() error {
	if d.failure != nil {
		return d.failure
	}
	if n := d.s.Stats().Failures; n > 0 {
		return &diffUnreachable{fmt.Errorf("the store answered %d requests by its fail-closed rule, with no OnError call", n)}
	}
	return nil
}

func (d *diffRedis) close() error {
	return errors.Join(d.s.Close(), d.clean())
}

// clean deletes every key under the target's prefix.
func (d *diffRedis) clean() error {
	ctx, cancel := context.WithTimeout(context.Background(), diffRedisTimeout)
	defer cancel()
	clean := func(ctx context.Context, rdb redis.UniversalClient) error {
		var keys []string
		iter := rdb.Scan(ctx, 0, d.prefix+"*", 1000).Iterator() // the prefix is hex: no glob characters
		for key := range iter.Vals(ctx) {
			keys = append(keys, key)
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("differential: deleting the keys of prefix %s: %w", d.prefix, err)
		}
		for _, k := range keys { // one by one: on a cluster they are in many slots
			if err := rdb.Unlink(ctx, k).Err(); err != nil {
				return fmt.Errorf("differential: deleting the keys of prefix %s: %w", d.prefix, err)
			}
		}
		return nil
	}
	if cc, ok := d.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return clean(ctx, c) })
	}
	return clean(ctx, d.rdb)
}

// runDifferentialRedis is runDifferential on the Redis store at o.redis,
// or on the Redis Cluster at o.redisCluster (its traces have no AllowAll,
// which a cluster takes only within one virtual shard).
func runDifferentialRedis(ctx context.Context, o options, c *counters) (err error) {
	var rdb redis.UniversalClient
	label := "-redis " + o.redis
	if o.redisCluster != "" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(o.redisCluster, ","), ContextTimeoutEnabled: true})
		label = "-redis-cluster " + o.redisCluster
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: o.redis, ContextTimeoutEnabled: true})
	}
	defer func() { err = errors.Join(err, rdb.Close()) }()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("differential: %s: %w", label, err)
	}
	mk := diffRedisMaker(rdb)
	for i := uint64(0); ctx.Err() == nil; i++ {
		tr := diffGenerateStore(o.seed+i, diffOpsPerTrace)
		if o.redisCluster != "" {
			// On a cluster AllowAll takes only keys of one virtual shard
			// (redisstore.ErrCrossShard), which the model does not know of.
			tr.ops = slices.DeleteFunc(tr.ops, func(op diffOp) bool { return op.kind == diffAllowAll })
		}
		if err := diffCheckAs(tr, mk, c, label); err != nil {
			return err
		}
		c.traces.Add(1)
	}
	return nil
}
