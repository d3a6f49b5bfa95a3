package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestWaitForReplicasConfig: a count under one, a timeout under a
// millisecond (WAIT's unit; 0 would wait for ever), a Ring, and a client
// whose ReadTimeout is not over the timeout are refused.
func TestWaitForReplicasConfig(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	assert.ErrorIs(t, redisstore.WaitForReplicas(c, 0, time.Second), engine.ErrInvalidConfig)
	assert.ErrorIs(t, redisstore.WaitForReplicas(c, 1, time.Microsecond), engine.ErrInvalidConfig)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	assert.ErrorIs(t, redisstore.WaitForReplicas(ring, 1, time.Second), engine.ErrInvalidConfig)
	// A read that times out before WAIT answers would fail every call
	// (as a lost connection, not ErrNotReplicated).
	for _, read := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
		short := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: read, ContextTimeoutEnabled: true})
		assert.ErrorIs(t, redisstore.WaitForReplicas(short, 1, 300*time.Millisecond), engine.ErrInvalidConfig, "%v", read)
		assert.NoError(t, short.Close())
	}
	sc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ReadTimeout: 50 * time.Millisecond, ContextTimeoutEnabled: true})
	assert.ErrorIs(t, redisstore.WaitForReplicas(sc, 1, 300*time.Millisecond), engine.ErrInvalidConfig, "cluster")
	assert.NoError(t, sc.Close())
	for _, read := range []time.Duration{0, -1, time.Second} { // the default (5 s), none, over
		ok := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: read, ContextTimeoutEnabled: true})
		assert.NoError(t, redisstore.WaitForReplicas(ok, 1, 300*time.Millisecond), "%v", read)
		assert.NoError(t, ok.Close())
	}
	assert.NoError(t, redisstore.WaitForReplicas(c, 1, time.Second))
}

// TestWaitForReplicasUnreplicated: on a server with no replica every
// script call fails with ErrNotReplicated, so a decision is the failure
// rule's, reported to OnError, and nothing else the client sends waits.
func TestWaitForReplicasUnreplicated(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	var mu sync.Mutex
	var seen []error
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1},
		OnError: func(err error) { mu.Lock(); seen = append(seen, err); mu.Unlock() }}, nil)
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.False(t, d.Degraded, "before the hook")

	require.NoError(t, redisstore.WaitForReplicas(c, 1, 20*time.Millisecond))
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	assert.True(t, d.Degraded, "a write no replica acknowledged is not a decision")
	assert.False(t, d.Allowed, "fail closed")
	assert.Equal(t, uint64(1), s.Stats().Failures)
	mu.Lock()
	require.Len(t, seen, 1)
	assert.ErrorIs(t, seen[0], redisstore.ErrNotReplicated)
	mu.Unlock()
	assert.ErrorIs(t, c.Eval(ctx, "return 1", nil).Err(), redisstore.ErrNotReplicated, "a script alone")
	pipe := c.Pipeline()
	ev, get := pipe.Eval(ctx, "return 1", nil), pipe.Get(ctx, "nothing")
	_, _ = pipe.Exec(ctx)
	assert.ErrorIs(t, ev.Err(), redisstore.ErrNotReplicated, "a script in a pipeline")
	assert.ErrorIs(t, get.Err(), redis.Nil, "the pipeline's other command keeps its own answer")
	assert.NoError(t, c.Set(ctx, "plain", "x", time.Minute).Err(), "a command other than a script does not wait")
}

// TestWaitForReplicasCluster: on a cluster whose masters each have a
// replica, decisions with WaitForReplicas(1) are Redis's, admitted and
// denied exactly; asking for two replicas makes them the failure rule's.
func TestWaitForReplicasCluster(t *testing.T) {
	rc := redistest.GetReplicaCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	require.NoError(t, redisstore.WaitForReplicas(cc, 1, 2*time.Second))
	s := newStore(t, redisstore.Config{Client: cc, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clock.NewManual(0))
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, k := range keys {
		for i := range 4 {
			d, err := s.Allow(ctx, k, 1)
			require.NoError(t, err)
			require.False(t, d.Degraded, "%s #%d", k, i)
			assert.Equal(t, i < 3, d.Allowed, "%s #%d", k, i)
		}
	}
	out := make([]engine.Result, len(keys))
	reqs := make([]engine.Request, len(keys))
	for i, k := range keys {
		reqs[i] = engine.Request{Key: k + "'", Cost: 1}
	}
	require.NoError(t, s.AllowBatch(ctx, reqs, out)) // pipelined over the masters
	for i, r := range out {
		require.NoError(t, r.Err)
		assert.True(t, r.Decision.Allowed && !r.Decision.Degraded, "%s", reqs[i].Key)
	}
	assert.Zero(t, s.Stats().Failures)

	two := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = two.Close() })
	require.NoError(t, redisstore.WaitForReplicas(two, 2, 20*time.Millisecond))
	err := two.Eval(ctx, "return redis.call('SET', KEYS[1], 'x')", []string{"tswait:{a}"}).Err()
	assert.True(t, errors.Is(err, redisstore.ErrNotReplicated), "one replica of two: %v", err)
	assert.NoError(t, cc.Del(ctx, "tswait:{a}").Err())
}

// TestWaitForReplicasOneMasterShort: a store started while one master has
// fewer replicas than WaitForReplicas asks (after a failover, until the
// lost node rejoins) answers by the failure rule the keys of that master
// only, as WaitForReplicas says; the others are decided. Before, the
// setup writes New makes on every virtual shard failed there, and the
// store answered every key by the failure rule. One virtual shard stands
// for that master: a hook fails its script calls with ErrNotReplicated,
// after they ran, as WAIT does.
func TestWaitForReplicasOneMasterShort(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	policies, _, _ := redisstore.ShardStateKeys(p)
	short := strings.TrimSuffix(policies[3], "p") // "prefix{tag}": the shard's keys
	c := client(t, addr)
	t.Cleanup(func() { cleanPrefix(c, p) })
	fail := func(cmd redis.Cmder) {
		if n := cmd.Name(); n != "eval" && n != "evalsha" && n != "fcall" || cmd.Err() != nil {
			return
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.HasPrefix(s, short) {
				cmd.SetErr(fmt.Errorf("%w: one master short of replicas", redisstore.ErrNotReplicated))
				return
			}
		}
	}
	c.AddHook(hook{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			err := next(ctx, cmd)
			if err == nil {
				fail(cmd)
				err = cmd.Err()
			}
			return err
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			err := next(ctx, cmds)
			for _, cmd := range cmds {
				fail(cmd)
			}
			return err
		},
	})
	var log errorLog
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: p, Clock: clock.NewManual(0),
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, OnError: log.add})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NotEmpty(t, log.all())
	require.ErrorIs(t, log.all()[0], redisstore.ErrNotReplicated)
	var onShort, elsewhere string
	for i := 0; onShort == "" || elsewhere == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if redisstore.ShardOfStore(s, k) == 3 {
			onShort = k
		} else {
			elsewhere = k
		}
	}
	d, err := s.Allow(context.Background(), elsewhere, 1)
	require.NoError(t, err)
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 3, ResetAfter: time.Second}, d, "a key of a master with its replicas")
	d, err = s.Allow(context.Background(), onShort, 1)
	require.NoError(t, err)
	assert.True(t, d.Degraded, "a key of the master short of replicas")
}
