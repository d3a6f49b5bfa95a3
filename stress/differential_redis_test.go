package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

// diffRedisSeeds is how many fixed seeds TestDifferentialRedis replays.
const diffRedisSeeds = 30

// diffRedisClient connects to the test binary's Redis (or skips loudly),
// closed when the test ends.
func diffRedisClient(t *testing.T) (*redis.Client, string) {
	t.Helper()
	return diffRedisClientOf(t, redistest.Addr(t))
}

// diffRedisClientOf is diffRedisClient on the server at addr.
func diffRedisClientOf(t *testing.T, addr string) (*redis.Client, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb, addr
}

// TestDiffGenerateStore: the store's traces keep to the configuration the
// store shares with the engine, and keep the generator's variety.
func TestDiffGenerateStore(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		tr := diffGenerateStore(seed, diffOpsPerTrace)
		require.True(t, tr.cfg.store)
		require.Zero(t, tr.cfg.maxKeys, "seed %d", seed)
		require.False(t, tr.cfg.regress, "seed %d", seed)
		require.Equal(t, 1, tr.cfg.shards, "seed %d", seed)
		require.True(t, tr.monotonic(), "seed %d: the clock steps back", seed)
		eng := diffGenerate(seed, []int{1, 2, 16}, diffOpsPerTrace)
		assert.Equal(t, eng.cfg.policy.Version, tr.cfg.policy.Version, "seed %d: the configuration is drawn as the engine's", seed)
		assert.Equal(t, eng.cfg.maxKeyBytes, tr.cfg.maxKeyBytes, "seed %d", seed)
		assert.Equal(t, eng.cfg.start, tr.cfg.start, "seed %d", seed)
	}
	assert.False(t, diffGenerate(1, []int{1}, diffOpsPerTrace).cfg.store, "the engine's traces are not the store's")
	assert.Contains(t, diffGenerateStore(1, 10).cfg.String(), "redisstore.New(")
}

// TestDiffRedisCleans: a target's keys are gone once it closes.
func TestDiffRedisCleans(t *testing.T) {
	rdb, _ := diffRedisClient(t)
	tr := diffGenerateStore(3, diffOpsPerTrace)
	tg, err := diffRedisMaker(rdb)(tr.cfg, nil)
	require.NoError(t, err)
	for _, op := range tr.ops[:20] {
		tg.setTime(op.t)
		diffApply(tg, op.resolve(tg.policy().Version))
	}
	prefix := tg.(*diffRedis).prefix
	ctx := context.Background()
	// A whole SCAN, not one call: one call visits only part of a server
	// that other packages' tests are filling at the same time.
	scan := func() []string {
		var keys []string
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for key := range iter.Vals(ctx) {
			keys = append(keys, key)
		}
		require.NoError(t, iter.Err())
		return keys
	}
	require.NotEmpty(t, scan(), "the trace wrote nothing")
	require.NoError(t, tg.close())
	assert.Empty(t, scan())
}

// TestDiffRedisRejectsEngineTraces: an engine trace (a key bound, a clock
// that steps back) is refused, not replayed with another meaning.
func TestDiffRedisRejectsEngineTraces(t *testing.T) {
	_, err := diffNewRedis(nil, diffConfig{maxKeys: 3, shards: 1}, nil)
	require.Error(t, err)
	_, err = diffNewRedis(nil, diffConfig{store: true, regress: true, shards: 1}, nil)
	require.Error(t, err)
}

// TestDiffRedisDown: a failure to reach Redis is the harness's; the store
// giving up with Redis answering is a wrong answer.
func TestDiffRedisDown(t *testing.T) {
	assert.True(t, diffRedisDown(fmt.Errorf("%w: %w", redisstore.ErrUnavailable, context.DeadlineExceeded)))
	assert.True(t, diffRedisDown(redis.ErrClosed))
	assert.False(t, diffRedisDown(fmt.Errorf("%w: gave up after 8 attempts", redisstore.ErrUnavailable)))
	assert.False(t, diffRedisDown(errors.New("ERR user_script:1: Script attempted to access nonexistent global variable")))

	// A store whose Redis is gone: the replay stops with a harness error.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	defer rdb.Close()
	_, err := diffReplay(diffGenerateStore(1, 5), diffRedisMaker(rdb), nil, false)
	require.Error(t, err)
}

// TestDiffShrinkRedis plants a fault behind the Redis store and checks that
// the shrinker reduces a failing trace to a short reproduction that names
// -redis, fails with the fault and passes without it.
func TestDiffShrinkRedis(t *testing.T) {
	rdb, addr := diffRedisClient(t)
	honest := diffRedisMaker(rdb)
	mk := func(cfg diffConfig, c *counters) (diffTarget, error) {
		tg, err := honest(cfg, c)
		if err != nil {
			return nil, err
		}
		return &diffFault{diffTarget: tg, retry: true}, nil
	}
	tr := diffTripAndShrink(t, func(seed uint64) diffTrace {
		return diffGenerateStore(seed, diffOpsPerTrace)
	}, mk, honest, 3)

	err := diffCheckAs(tr, mk, nil, "-redis "+addr)
	var v *Violation
	require.ErrorAs(t, err, &v)
	t.Log(v.Error())
	assert.Equal(t, tr.seed, v.Seed)
	assert.Contains(t, v.Detail, "reproduce: go run ./stress -check differential -redis "+addr+" -seed ")
	assert.Contains(t, v.Detail, "redisstore.New(")
}

// TestDiffRedisCommand runs the check on the Redis store from the command
// line for a second, and checks the flag's validation.
func TestDiffRedisCommand(t *testing.T) {
	_, addr := diffRedisClient(t)
	var buf bytes.Buffer
	// Seeds from 1 on pass for far more traces than a second replays (see
	// TestDifferentialRedis).
	code := run(context.Background(), []string{"-check", "differential", "-redis", addr, "-duration", "1s", "-seed", "1"}, &buf, &buf)
	require.Equal(t, 0, code, buf.String())
	m := regexp.MustCompile(`differential traces\s*\|\s*(\d+)`).FindStringSubmatch(buf.String())
	require.NotNil(t, m, buf.String())
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	assert.Positive(t, n, buf.String())

	buf.Reset()
	code = run(context.Background(), []string{"-check", "flood", "-redis", addr}, &buf, &buf)
	assert.Equal(t, 2, code, "-redis without the differential check")
	assert.Contains(t, buf.String(), "-redis applies only to the differential and leases checks")

	buf.Reset()
	code = run(context.Background(), []string{"-check", "differential", "-redis", addr + "," + addr}, &buf, &buf)
	assert.Equal(t, 2, code, "a list of servers given to -redis")
	assert.Contains(t, buf.String(), "give a cluster's masters to -redis-cluster")
}
