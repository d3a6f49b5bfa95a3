package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/policy"
)

// redis_rate (github.com/go-redis/redis_rate, GCRA over a double "next
// allowed time") is the usual Go limiter on Redis: the Redis section
// measures it beside the store on the same server, keys and limit. Its
// single call is its own Limiter.Allow; it has no batch, so its batched
// rows pipeline its own script (the one Limiter.Allow sends, by its SHA,
// with the arguments Allow gives it) in one round trip per batch.

// rateKeyPrefix is what redis_rate puts before every key it is given.
const rateKeyPrefix = "rate:"

// gcraLimit is p as a redis_rate limit: its capacity as the burst, its
// rate per second, each math.MaxInt at most.
func gcraLimit(p policy.Policy) redis_rate.Limit {
	return redis_rate.Limit{Rate: asInt(p.TokensPerSecond), Burst: asInt(p.Capacity), Period: time.Second}
}

// rateArgs are the script arguments redis_rate's AllowN sends for a cost.
func rateArgs(l redis_rate.Limit, cost int) []any {
	return []any{l.Burst, l.Rate, l.Period.Seconds(), cost}
}

// rateRecorder is enough of a Redis client for redis_rate to call, to learn
// the SHA of its script: it records the EVALSHA and answers as Redis would.
type rateRecorder struct {
	redis.Cmdable
	sha string
}

func (r *rateRecorder) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	r.sha = sha
	return redis.NewCmdResult([]any{int64(1), int64(0), "-1", "0"}, nil)
}

// rateSHA is the SHA of redis_rate's script, loaded on rdb.
func rateSHA(ctx context.Context, rdb redis.UniversalClient) (string, error) {
	rec := &rateRecorder{Cmdable: rdb}
	if _, err := redis_rate.NewLimiter(rec).Allow(ctx, "x", redis_rate.PerSecond(1)); err != nil {
		return "", err
	}
	// Run loads the script itself after a NOSCRIPT; the pipelined rows
	// send EVALSHA only. On a cluster it loads it on the master of its key:
	// keys of many slots reach every master.
	n := 1
	if _, ok := rdb.(*redis.ClusterClient); ok {
		n = 256
	}
	for i := range n {
		k := fmt.Sprint("tsbench-load-", i)
		if _, err := redis_rate.NewLimiter(rdb).Allow(ctx, k, redis_rate.PerSecond(1)); err != nil {
			return "", err
		}
		_ = rdb.Del(ctx, rateKeyPrefix+k).Err()
	}
	return rec.sha, nil
}

// ratePeer is redis_rate on one scenario's keys.
type ratePeer struct {
	rdb   redis.UniversalClient
	l     *redis_rate.Limiter
	limit redis_rate.Limit
	sha   string
	pfx   string // before each key name (redis_rate adds rateKeyPrefix)
}

// rateAllow decides one key per Limiter.Allow call.
type rateAllow struct {
	p    *ratePeer
	errs *atomic.Int64
	key  []byte
}

func (d *rateAllow) decide(keys []string) int {
	n := 0
	ctx := context.Background()
	for _, k := range keys {
		d.key = append(append(d.key[:0], d.p.pfx...), k...)
		res, err := d.p.l.Allow(ctx, string(d.key), d.p.limit)
		switch {
		case err != nil:
			d.errs.Add(1)
		case res.Allowed > 0:
			n++
		}
	}
	return n
}

// ratePipe decides its keys in one pipeline of redis_rate's script, and
// reads each reply as Limiter.AllowN does.
type ratePipe struct {
	p    *ratePeer
	errs *atomic.Int64
	args []any
	cmds []*redis.Cmd
}

func (d *ratePipe) decide(keys []string) int {
	ctx := context.Background()
	pipe := d.p.rdb.Pipeline()
	d.cmds = d.cmds[:0]
	for _, k := range keys {
		d.cmds = append(d.cmds, pipe.EvalSha(ctx, d.p.sha, []string{rateKeyPrefix + d.p.pfx + k}, d.args...))
	}
	_, _ = pipe.Exec(ctx)
	n := 0
	for _, c := range d.cmds {
		allowed, ok := rateReply(c)
		switch {
		case !ok:
			d.errs.Add(1)
		case allowed:
			n++
		}
	}
	return n
}

// rateReply parses one reply of redis_rate's script as AllowN does.
func rateReply(c *redis.Cmd) (allowed, ok bool) {
	v, err := c.Slice()
	if err != nil || len(v) != 4 {
		return false, false
	}
	a, ok1 := v[0].(int64)
	_, ok2 := v[1].(int64)
	r, ok3 := v[2].(string)
	s, ok4 := v[3].(string)
	_, err1 := strconv.ParseFloat(r, 64)
	_, err2 := strconv.ParseFloat(s, 64)
	return a > 0, ok1 && ok2 && ok3 && ok4 && err1 == nil && err2 == nil
}

// decider is a decider for one worker: Limiter.Allow for batch 1,
// else a pipeline of batch script calls.
func (p *ratePeer) decider(errs *atomic.Int64, batch int) decider {
	if batch == 1 {
		return &rateAllow{p: p, errs: errs}
	}
	return &ratePipe{p: p, errs: errs, args: rateArgs(p.limit, 1), cmds: make([]*redis.Cmd, 0, batch)}
}

// prespend takes redisHeadroom tokens (at most the burst) from every key,
// as the store's prespend does, so that each key exists through the run.
func (p *ratePeer) prespend(ctx context.Context, names []string) error {
	cost := min(redisHeadroom, p.limit.Burst)
	const chunk = 1024
	for i := 0; i < len(names); i += chunk {
		pipe := p.rdb.Pipeline()
		for _, k := range names[i:min(i+chunk, len(names))] {
			pipe.EvalSha(ctx, p.sha, []string{rateKeyPrefix + p.pfx + k}, rateArgs(p.limit, cost)...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// topUp brings redis_rate's buckets of names back to where prespend left
// them, as the store's topUp does: deleted (a missing key is a full
// bucket to its script), then pre-spent again.
func (p *ratePeer) topUp(ctx context.Context, names []string) error {
	// One DEL per key: on a cluster the keys may live on different masters.
	for _, k := range names {
		if err := p.rdb.Del(ctx, rateKeyPrefix+p.pfx+k).Err(); err != nil {
			return err
		}
	}
	return p.prespend(ctx, names)
}

// redisCPU is the server's CPU time (INFO CPU used_cpu_sys + used_cpu_user)
// in seconds.
// On a cluster it is the masters' sum.
func redisCPU(ctx context.Context, rdb redis.UniversalClient) (float64, error) {
	total := 0.0
	err := servers(ctx, rdb, func(rdb redis.UniversalClient) error {
		info, err := rdb.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return err
				}
				total += f
			}
		}
		return nil
	})
	return total, err
}
