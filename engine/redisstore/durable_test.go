package redisstore_test

import (
	"context"
	"errors"
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
// millisecond (WAIT's unit; 0 would wait for ever) and a Ring are refused.
func TestWaitForReplicasConfig(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	assert.ErrorIs(t, redisstore.WaitForReplicas(c, 0, time.Second), engine.ErrInvalidConfig)
	assert.ErrorIs(t, redisstore.WaitForReplicas(c, 1, time.Microsecond), engine.ErrInvalidConfig)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	assert.ErrorIs(t, redisstore.WaitForReplicas(ring, 1, time.Second), engine.ErrInvalidConfig)
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
