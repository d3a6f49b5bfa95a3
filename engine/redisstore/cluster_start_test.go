package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestClusterStartOneMasterDown: a store started while one master of a
// cluster is down (cluster-require-full-coverage no, as the package doc
// asks), on a prefix an earlier store set up, decides the keys of the
// other masters by Redis at once, as a store running before the master
// died does, and answers the dead master's keys by the failure rule, at
// once, not at the call's deadline, on a slot map that places them nowhere
// too (Redis 8.0's); once the master is back, its keys are decided by
// Redis too.
func TestClusterStartOneMasterDown(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a cluster of its own
	c := redistest.StartCluster(t)
	ctx := context.Background()
	admin := clusterClient(t, c.Addrs())
	owner := slotOwners(t, admin)
	p := prefix(t)
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	first, err := redisstore.New(ctx, redisstore.Config{Client: admin, Prefix: p, Policy: pol, Timeout: slowMachine})
	require.NoError(t, err)
	require.NoError(t, redisstore.Up(first), "the prefix set up")
	require.NoError(t, first.Close())

	// the master to kill: one that holds no global key
	global := owner(redisstore.GlobalKey(p, "policy"))
	dead := -1
	for i, a := range c.Addrs() {
		if a != global {
			dead = i
			break
		}
	}
	deadAddr := c.Addrs()[dead]
	c.Node(dead).Kill()
	live := c.Addrs()[(dead+1)%len(c.Addrs())]
	if live == deadAddr || live == global {
		live = global
	}
	host, port, _ := strings.Cut(live, ":")
	require.Eventually(t, func() bool { // the others agree that it failed, and serve
		out := c.CLI(t, "-h", host, "-p", port, "cluster", "nodes")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, deadAddr) && strings.Contains(l, " master,fail ") {
				return true
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond) // a real cluster converging

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { _ = cc.Close() })
	var log errorLog
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: p, Policy: pol, OnError: log.add, Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	decided, degraded := 0, 0
	for i := range 60 {
		key := fmt.Sprint("k", i)
		d, err := s.Allow(ctx, key, 1)
		require.NoError(t, err)
		onDead := owner(redisstore.BucketKey(p, key)) == deadAddr
		require.Equal(t, onDead, d.Degraded, "key %s on the dead master: %v; %v", key, onDead, log.all())
		if d.Degraded {
			degraded++
		} else {
			require.True(t, d.Allowed)
			require.Equal(t, int64(2), d.Remaining)
			decided++
		}
	}
	require.Positive(t, decided)
	require.Positive(t, degraded)

	// Redis 8.0 (as from 7.2) lists no slots for a failed master in CLUSTER SHARDS
	// (redis/redis#13414), which go-redis reads for its slot map: a command
	// on those slots goes to a live master and comes back MOVED to the dead
	// one. A slot map without them, given here, is that on Redis 7.0 too.
	liveOnly := func(ctx context.Context) ([]redis.ClusterSlot, error) {
		rc := redis.NewClient(&redis.Options{Addr: live})
		defer rc.Close()
		//lint:ignore SA1019 the map go-redis builds (ClusterSlot), read as Redis 7.0 fills it
		all, err := rc.ClusterSlots(ctx).Result()
		return slices.DeleteFunc(all, func(s redis.ClusterSlot) bool { return s.Nodes[0].Addr == deadAddr }), err
	}
	cc8 := redis.NewClusterClient(&redis.ClusterOptions{ClusterSlots: liveOnly, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { _ = cc8.Close() })
	s8, err := redisstore.New(ctx, redisstore.Config{Client: cc8, Prefix: p, Policy: pol, Timeout: 5 * time.Second})
	require.NoError(t, err, "a store started with a master away, its slots in no node's CLUSTER SHARDS")
	t.Cleanup(func() { _ = s8.Close() })
	for i := range 60 {
		if key := fmt.Sprint("k", i); owner(redisstore.BucketKey(p, key)) != deadAddr {
			d, err := s8.Allow(ctx, key, 1)
			require.NoError(t, err)
			require.True(t, d.Allowed && !d.Degraded, "key %s on a live master: %+v", key, d)
			break
		}
	}
	// A call on the dead master's slots: the MOVED that go-redis could not
	// follow points at a node the cluster marks failed, not at a slot's
	// new master, and is answered by the failure rule at once, as on Redis
	// 7.0's slot map, not sent again until its deadline.
	for i := range 60 {
		if key := fmt.Sprint("k", i); owner(redisstore.BucketKey(p, key)) == deadAddr {
			begin := time.Now()
			d, err := s8.Allow(ctx, key, 1)
			took := time.Since(begin)
			require.NoError(t, err)
			require.Equal(t, failRule(false), d, "key %s on the dead master", key)
			require.Less(t, took, 2500*time.Millisecond, "the failure rule at once, not at the 5 s deadline") // on a loaded machine
			break
		}
	}

	c.Node(dead).Restart(t)
	c.Wait(t)
	for i := range 60 {
		key := fmt.Sprint("k", i)
		if owner(redisstore.BucketKey(p, key)) != deadAddr {
			continue
		}
		require.True(t, untilDecided(t, s, key, failRule(false)).Allowed, "key %s", key)
	}
}

// TestClusterStartHung: a store started while every node of a cluster
// hangs (it accepts connections and answers nothing) starts, answers by
// the failure rule, and is decided by Redis once the nodes answer. A
// cluster client that has not loaded its slot map yet meets such a node
// with a bare i/o timeout (os.ErrDeadlineExceeded), not the context's
// error: New must count it as Redis out of reach, not as an answer.
func TestClusterStartHung(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a cluster of its own
	c := redistest.StartCluster(t)
	for i := range c.Addrs() {
		c.Node(i).Hang(t)
	}
	cc := clusterClient(t, c.Addrs())
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: cc, Prefix: prefix(t), Policy: pol, Timeout: 200 * time.Millisecond})
	require.NoError(t, err, "New on a hung cluster")
	t.Cleanup(func() { _ = s.Close() })
	d, err := s.Allow(context.Background(), "k", 1)
	require.NoError(t, err)
	require.Equal(t, failRule(false), d)

	for i := range c.Addrs() {
		c.Node(i).Resume(t)
	}
	d = untilDecided(t, s, "k", failRule(false))
	require.True(t, d.Allowed)
	require.Equal(t, int64(2), d.Remaining)
}

// TestClusterStartHungKnownSlots: a store started on a cluster client
// that has loaded its slot map (a pipeline, say) but not yet the servers'
// command table, while the masters hang, returns from New and from its
// calls by their deadline. go-redis reads the command table (COMMAND, from
// random nodes) on its first command outside a pipeline, under a context
// of its own of 5 s, whatever the caller's: a node that hangs holds that
// command, and every command behind it, for those 5 s. With one master of
// three hung, that is a store in three whose New takes 5 s; here every
// master hangs, so that it is every one.
func TestClusterStartHungKnownSlots(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a cluster of its own
	c := redistest.StartCluster(t)
	cc := clusterClient(t, c.Addrs())
	ctx := context.Background()
	_, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Get(ctx, prefix(t)+"x").Err() })
	require.ErrorIs(t, err, redis.Nil) // the slot map is loaded
	for i := range c.Addrs() {
		c.Node(i).Hang(t)
	}
	const timeout = 200 * time.Millisecond
	// go-redis's read of the command table would hold a call 5 s; the
	// bound is far from both, for a loaded machine's sake
	const bound = 2500 * time.Millisecond
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	begin := time.Now()
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: prefix(t), Policy: pol, Timeout: timeout})
	took := time.Since(begin)
	require.NoError(t, err, "New on a hung cluster")
	t.Cleanup(func() { _ = s.Close() })
	require.Less(t, took, bound, "New took %v", took)
	for range 3 {
		begin = time.Now()
		d, err := s.Allow(ctx, "k", 1)
		took = time.Since(begin)
		require.NoError(t, err)
		require.Equal(t, failRule(false), d)
		require.Less(t, took, bound, "Allow took %v", took)
	}

	for i := range c.Addrs() {
		c.Node(i).Resume(t)
	}
	d := untilDecided(t, s, "k", failRule(false))
	require.True(t, d.Allowed)
	require.Equal(t, int64(2), d.Remaining)
}

// TestClusterScriptLoadOneMasterHung: a store whose decide script is not
// yet loaded on the masters (a first deploy of this version) while one
// master hangs decides the other masters' keys by Redis, within the
// call's deadline: a call that meets the script missing loads it where it
// is missing, not on every master one after the other, where the hung one
// held every call until its deadline.
func TestClusterScriptLoadOneMasterHung(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a cluster of its own
	c := redistest.StartCluster(t)
	ctx := context.Background()
	admin := clusterClient(t, c.Addrs())
	owner := slotOwners(t, admin)
	p := prefix(t)
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	cc := clusterClient(t, c.Addrs())
	// A call that loaded the script on the hung master too would be held
	// to this deadline and answered by the failure rule; 300 ms also had
	// to cover New's reading of the prefix's state on a cluster just
	// started, and each decision with its script load, on a loaded machine.
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: p, Policy: pol, Timeout: slowMachine})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, redisstore.Up(s), "the prefix set up before the hang")

	// a master that holds no global key, and a key on each other master
	global := owner(redisstore.GlobalKey(p, "policy"))
	hung := c.Addrs()[0]
	if hung == global {
		hung = c.Addrs()[1]
	}
	keys := map[string]string{} // master: key
	for i := 0; len(keys) < len(c.Addrs())-1; i++ {
		k := fmt.Sprint("k", i)
		if m := owner(redisstore.BucketKey(p, k)); m != hung && keys[m] == "" {
			keys[m] = k
		}
	}
	c.Node(slices.Index(c.Addrs(), hung)).Hang(t)
	for m, k := range keys {
		begin := time.Now()
		d, err := s.Allow(ctx, k, 1)
		took := time.Since(begin)
		require.NoError(t, err)
		require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 3, ResetAfter: time.Second}, d,
			"key %s on %s, a master that answers (%s hangs)", k, m, hung)
		require.Less(t, took, 2500*time.Millisecond, "a real decision, not the whole deadline and more") // on a loaded machine
	}
}

// TestClusterHookFailsAPipeline: a hook on a cluster client that fails a
// pipeline without sending it (a circuit breaker, say) leaves its commands
// without an error or a reply; each of the store's commands, which go in
// pipelines on a cluster, takes the pipeline's error, and New reports it
// rather than reading a reply that is not there.
func TestClusterHookFailsAPipeline(t *testing.T) {
	cc := clusterClient(t, redistest.ClusterAddrs(t))
	injected := errors.New("injected: the breaker is open")
	cc.AddHook(hook{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if cmds[0].Name() == "hmget" {
			return injected
		}
		return next(ctx, cmds)
	}})
	_, err := redisstore.New(context.Background(), redisstore.Config{Client: cc, Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}})
	require.ErrorIs(t, err, injected)
}

// TestClusterStartBeforeSlots: a store started on a cluster whose nodes
// answer but serve no slot yet (a cluster being created: CLUSTER SLOTS is
// empty until its slots are assigned) answers by the failure rule, and
// once the slots are served it is decided by Redis within about a second,
// as after any outage. go-redis keeps a slot map of no node, and answers
// every command on it with "cluster has no nodes", until it reloads the
// map: by itself only once a minute (ClusterStateReloadInterval), so the
// store must ask for the reload, as it does when a node is lost.
func TestClusterStartBeforeSlots(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	ctx := context.Background()
	real := clusterClient(t, addrs)
	var served atomic.Bool // whether the slots are assigned
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ContextTimeoutEnabled: true,
		ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
			if !served.Load() {
				return nil, nil // the nodes answer; no slot is assigned yet
			}
			//lint:ignore SA1019 ClusterOptions.ClusterSlots takes CLUSTER SLOTS' form, whichever command Redis prefers
			return real.ClusterSlots(ctx).Result()
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	p := prefix(t)
	t.Cleanup(func() { cleanPrefix(real, p) })
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	// Timeout 5 s: a call that timed out on a loaded machine after its
	// script ran would take a token unseen, and Remaining below would read 1.
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: p, Policy: pol, Timeout: 5 * time.Second})
	require.NoError(t, err, "New on a cluster serving no slot")
	t.Cleanup(func() { _ = s.Close() })
	for range 3 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, failRule(false), d)
	}

	served.Store(true)
	// untilDecided allows 15 s, room for a loaded machine where a second is
	// the promise; the client alone would take a minute
	d := untilDecided(t, s, "k", failRule(false))
	require.True(t, d.Allowed)
	require.Equal(t, int64(2), d.Remaining)
}
