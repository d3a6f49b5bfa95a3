package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// clusterClient connects to the shared Redis Cluster redistest provides
// (or skips loudly), closed when the test ends.
func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestAdmissionCluster runs the behaviour suite on a Redis Cluster of three
// masters, every virtual shard in a slot of its own. The suite's AllowAll
// calls take keys without a shared hash tag, which a cluster refuses
// (ErrCrossShard, TestAllowAllCrossShard): its AllowAll tests run on a
// prefix of one virtual shard, where every key is co-located as a {tag}
// would put them. Under the race detector only its Concurrent behaviours
// run (admissiontest.Concurrent).
func TestAdmissionCluster(t *testing.T) {
	exactBalances(t)
	c := clusterClient(t, redistest.ClusterAddrs(t))
	admissiontest.Run(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
		if !admissiontest.Concurrent(t) {
			skipUnderRace(t)
		}
		cfg := redisstore.Config{Client: c, Policy: s.Policy}
		if strings.Contains(t.Name(), "/AllowAll/") {
			cfg.VirtualShards = 1
		}
		return newStore(t, cfg, s.Clock)
	})
}

// TestClusterTwoStoresOneQuota is TestTwoStoresOneQuota on a cluster.
func TestClusterTwoStoresOneQuota(t *testing.T) { twoStoresOneQuota(t, clusterAddr(t), 3) }

// slotOwners returns a function giving the address of the master that
// holds a key's slot.
func slotOwners(t *testing.T, c *redis.ClusterClient) func(key string) string {
	t.Helper()
	//lint:ignore SA1019 not CLUSTER SHARDS, which Redis 6 lacks
	ss, err := c.ClusterSlots(context.Background()).Result()
	require.NoError(t, err)
	return func(key string) string {
		slot := int(c.ClusterKeySlot(context.Background(), key).Val())
		for _, s := range ss {
			if s.Start <= slot && slot <= s.End {
				return s.Nodes[0].Addr // the master
			}
		}
		t.Fatalf("no master for slot %d", slot)
		return ""
	}
}

// TestClusterShardsSpread: the default virtual shards sit evenly on the
// three masters, and a batch over many keys writes buckets on every one.
// The refill is a token an hour, so that no bucket is full, and expired,
// by the KeyCount: at a token a second the buckets expired a second after
// the batch, and a loaded machine took longer over the 300 owner lookups.
func TestClusterShardsSpread(t *testing.T) {
	addr := clusterAddr(t)
	c := clusterClient(t, redistest.ClusterAddrs(t))
	p := prefix(t)
	s := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(1)}})[0]
	owner := slotOwners(t, c)
	per := map[string]int{}
	policies, _, _ := redisstore.ShardStateKeys(p)
	for _, k := range policies {
		per[owner(k)]++
	}
	require.Len(t, per, redistest.ClusterMasters)
	for m, n := range per {
		require.GreaterOrEqual(t, n, redisstore.DefaultVirtualShards/redistest.ClusterMasters, "master %s holds %d of %d shards", m, n, redisstore.DefaultVirtualShards)
	}
	reqs := make([]engine.Request, 300)
	for i := range reqs {
		reqs[i] = engine.Request{Key: fmt.Sprint("key", i), Cost: 1}
	}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, s.AllowBatch(context.Background(), reqs, out))
	buckets := map[string]int{}
	for i, r := range reqs {
		require.NoError(t, out[i].Err)
		require.True(t, out[i].Decision.Allowed)
		require.Equal(t, int64(9), out[i].Decision.Remaining)
		buckets[owner(redisstore.BucketKey(p, r.Key))]++
	}
	require.Len(t, buckets, redistest.ClusterMasters)
	n, err := s.KeyCount(context.Background())
	require.NoError(t, err)
	require.Equal(t, len(reqs), n, "KeyCount counts on every master")
	require.Zero(t, s.Stats().Failures)
}

// keysInShards returns two keys in different virtual shards of s.
func keysInShards(s *redisstore.Store) (string, string) {
	a := "a"
	for i := 0; ; i++ {
		b := fmt.Sprint("b", i)
		if redisstore.ShardOfStore(s, a) != redisstore.ShardOfStore(s, b) {
			return a, b
		}
	}
}

// TestAllowAllCrossShard: on a cluster, AllowAll over keys of two virtual
// shards is ErrCrossShard at the first key out of reqs[0]'s shard, and
// takes nothing; keys that share a {tag} share a shard and are decided all
// or nothing. On one server the same keys of two shards are decided as one.
func TestAllowAllCrossShard(t *testing.T) {
	pol := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	ctx := context.Background()
	t.Run("cluster", func(t *testing.T) {
		s := newStore(t, redisstore.Config{Client: clusterClient(t, redistest.ClusterAddrs(t)), Policy: pol}, clock.NewManual(0))
		a, b := keysInShards(s)
		_, i, err := s.AllowAll(ctx, []engine.Request{{Key: a, Cost: 1}, {Key: a, Cost: 2}, {Key: b, Cost: 1}})
		require.ErrorIs(t, err, redisstore.ErrCrossShard)
		require.Equal(t, 2, i)
		d, err := s.Peek(ctx, a)
		require.NoError(t, err)
		require.Equal(t, int64(10), d.Remaining, "a refused call takes nothing")

		x, y := "{user:7}:"+a, "{user:7}:"+b
		require.Equal(t, redisstore.ShardOfStore(s, x), redisstore.ShardOfStore(s, y))
		d, _, err = s.AllowAll(ctx, []engine.Request{{Key: x, Cost: 4}, {Key: y, Cost: 10}})
		require.NoError(t, err)
		require.True(t, d.Allowed)
		d, _, err = s.AllowAll(ctx, []engine.Request{{Key: x, Cost: 4}, {Key: y, Cost: 1}})
		require.NoError(t, err)
		require.False(t, d.Allowed, "y is empty")
		d, err = s.Peek(ctx, x)
		require.NoError(t, err)
		require.Equal(t, int64(6), d.Remaining, "the refusal took nothing from x")
	})
	t.Run("one server", func(t *testing.T) {
		s := newStore(t, redisstore.Config{Policy: pol}, clock.NewManual(0))
		a, b := keysInShards(s)
		d, _, err := s.AllowAll(ctx, []engine.Request{{Key: a, Cost: 4}, {Key: b, Cost: 10}})
		require.NoError(t, err)
		require.True(t, d.Allowed)
		d, _, err = s.AllowAll(ctx, []engine.Request{{Key: a, Cost: 4}, {Key: b, Cost: 1}})
		require.NoError(t, err)
		require.False(t, d.Allowed)
		d, err = s.Peek(ctx, a)
		require.NoError(t, err)
		require.Equal(t, int64(6), d.Remaining, "the refusal took nothing from a")
	})
}

// call is one Allow as a caller saw it: when it began and ended, and the
// version its decision was made under.
type call struct {
	begin, end time.Time
	version    int64
}

// TestClusterCutoverLinearizable: stores on a cluster decide keys of every
// virtual shard while another store makes cutovers (lengthening and not):
// a call that begins after another ended never sees an older version, and
// afterwards every shard is at the last version, none prepared, no pending
// flag or lock left.
func TestClusterCutoverLinearizable(t *testing.T) {
	addr := clusterAddr(t)
	p := prefix(t)
	stores := realStores(t, addr, 3, redisstore.Config{Prefix: p,
		Policy: policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1000}, Timeout: 10 * time.Second})
	ctx := context.Background()
	stop := make(chan struct{})
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	for w := range 6 {
		s := stores[1+w%2]
		wg.Go(func() {
			var mine []call
			for i := 0; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					calls = append(calls, mine...)
					mu.Unlock()
					return
				default:
				}
				begin := time.Now()
				d, err := s.Allow(ctx, fmt.Sprint("k", w, ":", i%200), 1)
				end := time.Now()
				if assert.NoError(t, err) {
					mine = append(mine, call{begin, end, d.Version})
				}
			}
		})
	}
	v := int64(1)
	for round := range 8 {
		capacity := int64(1000 + 100*round)
		if round%2 == 1 {
			capacity = 500 // shortens: no pass
		}
		next := policy.Policy{Version: v + 1, Capacity: capacity, TokensPerSecond: 1000}
		require.NoError(t, stores[0].ReplacePolicy(ctx, next, v), "round %d", round)
		v++
		time.Sleep(20 * time.Millisecond) // traffic between cutovers; the check does not depend on it
	}
	close(stop)
	wg.Wait()

	// sorted by end, the highest version of the calls that ended before
	// each call began
	ends := append([]call(nil), calls...)
	sortCalls(ends, func(c call) time.Time { return c.end })
	sortCalls(calls, func(c call) time.Time { return c.begin })
	j, seen := 0, int64(0)
	for _, c := range calls {
		for j < len(ends) && ends[j].end.Before(c.begin) {
			seen = max(seen, ends[j].version)
			j++
		}
		require.GreaterOrEqual(t, c.version, seen, "a call saw version %d after another had seen %d", c.version, seen)
	}
	require.NotEmpty(t, calls)
	require.Equal(t, v, calls[len(calls)-1].version)

	cc := clusterClient(t, redistest.ClusterAddrs(t))
	policies, _, pendings := redisstore.ShardStateKeys(p)
	for i, k := range policies {
		require.Equal(t, fmt.Sprint(v), cc.HGet(ctx, k, "v").Val(), "shard %d", i)
		require.Zero(t, cc.Exists(ctx, pendings[i]).Val(), "shard %d's pending flag", i)
	}
	require.Zero(t, cc.Exists(ctx, redisstore.GlobalKey(p, "lock")).Val())
	for _, s := range stores {
		require.Zero(t, s.Stats().Failures)
	}
}

func sortCalls(cs []call, by func(call) time.Time) {
	slices.SortFunc(cs, func(a, b call) int { return by(a).Compare(by(b)) })
}

// TestClusterInterruptedCutover: a cutover that stops after it prepared
// every shard (here its commit fails) leaves every shard refusing every
// caller; the next store call that meets one finishes the cutover, and no
// caller is refused for it. A cutover recorded and never prepared is
// finished by the next New.
func TestClusterInterruptedCutover(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	ctx := context.Background()
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	other := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: v1})[0]
	d, err := other.Allow(ctx, "k", 3)
	require.NoError(t, err)
	require.Equal(t, int64(7), d.Remaining)

	ac := clusterClient(t, addrs)
	commit := func(cmd redis.Cmder) bool {
		k := scriptKeys(cmd)
		return len(k) == 3 && k[0] == redisstore.GlobalKey(p, "policy") && k[1] == redisstore.GlobalKey(p, "history") &&
			strings.Contains(fmt.Sprint(cmd.Args()[1]), "'next'")
	}
	// sent alone, or (as the store sends a command alone on a cluster) in a
	// pipeline of its own
	ac.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if commit(cmd) {
			cmd.SetErr(errors.New("the process died"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}, pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			if commit(cmd) {
				cmd.SetErr(errors.New("the process died"))
				return cmd.Err()
			}
		}
		return next(ctx, cmds)
	}})
	admin, err := redisstore.New(ctx, redisstore.Config{Client: ac, Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	err = admin.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.Contains(t, err.Error(), "recorded but not finished")

	cc := clusterClient(t, addrs)
	policies, _, _ := redisstore.ShardStateKeys(p)
	for i, k := range policies {
		require.Equal(t, "p2", cc.HGet(ctx, k, "v").Val(), "shard %d prepared", i)
	}
	d, err = other.Allow(ctx, "k", 1)
	require.NoError(t, err)
	// the cutover clamped k's 7 to the new capacity 5; one taken
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 4, Version: 2, Limit: 5, ResetAfter: time.Second}, d)
	require.Zero(t, other.Stats().Failures)
	for i, k := range policies {
		require.Equal(t, "2", cc.HGet(ctx, k, "v").Val(), "shard %d published", i)
	}
	require.Equal(t, "2", cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "v").Val())

	// recorded only: the next New finishes it
	require.NoError(t, cc.Set(ctx, redisstore.GlobalKey(p, "lock"), "gone", 0).Err())
	blob := redisstore.PolicyBlob(policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, cc.Eval(ctx, "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) redis.call('HSET', KEYS[2], 'next', ARGV[3]) return 1",
		[]string{redisstore.GlobalKey(p, "blobs"), redisstore.GlobalKey(p, "policy")}, "3", blob, "3 0 5 1 0").Err())
	require.NoError(t, cc.Del(ctx, redisstore.GlobalKey(p, "lock")).Err())
	fresh := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: v1})[0]
	require.Equal(t, int64(3), fresh.Policy().Version, "New finished the recorded cutover")
	for i, k := range policies {
		require.Equal(t, "3", cc.HGet(ctx, k, "v").Val(), "shard %d published", i)
	}
	d, err = other.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(3), d.Version)
}

// nodeClient connects to one cluster node alone.
func nodeClient(t *testing.T, addr string) *redis.Client { return client(t, addr) }

// migrateSlot moves slot from the node at from to the node at to, as
// redis-cli --cluster reshard does: IMPORTING and MIGRATING, then MIGRATE a
// few keys at a time (pausing, so traffic meets the slot half moved), then
// the slot assigned to its new owner on every node.
func migrateSlot(t *testing.T, addrs []string, slot int, from, to string) {
	t.Helper()
	ctx := context.Background()
	src, dst := nodeClient(t, from), nodeClient(t, to)
	srcID, err := src.Do(ctx, "cluster", "myid").Text()
	require.NoError(t, err)
	dstID, err := dst.Do(ctx, "cluster", "myid").Text()
	require.NoError(t, err)
	require.NoError(t, dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err())
	require.NoError(t, src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err())
	host, port, _ := strings.Cut(to, ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 3).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, src.Do(ctx, args...).Err())
		time.Sleep(3 * time.Millisecond) // let calls meet the slot half moved
	}
	for _, a := range addrs {
		require.NoError(t, nodeClient(t, a).Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
	}
}

// TestClusterSlotMigration moves the slot of a virtual shard to another
// master while two stores hammer its keys: every call is answered by Redis
// (none by the failure rule: MOVED and ASK are followed, TRYAGAIN waited
// out), and no key admits more than its capacity plus what its rate
// refilled over the run.
func TestClusterSlotMigration(t *testing.T) {
	cl := redistest.StartCluster(t)
	addr := strings.Join(cl.Addrs(), ",")
	p := prefix(t)
	const (
		keys     = 20
		capacity = 200
		rate     = 1 // per second
	)
	stores := realStores(t, addr, 2, redisstore.Config{Prefix: p,
		Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate}, Timeout: 10 * time.Second})
	ctx := context.Background()
	key := func(i int) string { return fmt.Sprint("{hot}", i) } // one shard
	for i := range keys {
		_, err := stores[0].Allow(ctx, key(i), 1) // every bucket exists before the move
		require.NoError(t, err)
	}
	cc := clusterClient(t, cl.Addrs())
	slot := int(cc.ClusterKeySlot(ctx, redisstore.BucketKey(p, key(0))).Val())
	from := slotOwners(t, cc)(redisstore.BucketKey(p, key(0)))
	to := cl.Addrs()[0]
	if to == from {
		to = cl.Addrs()[1]
	}

	begin := time.Now()
	var admitted [keys]atomic.Int64
	var answered atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		s := stores[w%2]
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := i % keys
				d, err := s.Allow(ctx, key(k), 1)
				if assert.NoError(t, err) {
					answered.Add(1)
					if d.Allowed {
						admitted[k].Add(1)
					}
				}
			}
		})
	}
	for answered.Load() < 200 {
		runtime.Gosched()
	}
	migrateSlot(t, cl.Addrs(), slot, from, to)
	for seen := answered.Load(); answered.Load() < seen+200; {
		runtime.Gosched() // traffic on the new owner, through a stale slot map: MOVED
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(begin)

	require.Equal(t, to, slotOwners(t, cc)(redisstore.BucketKey(p, key(0))), "the slot moved")
	bound := int64(capacity - 1 + rate*(int64(elapsed/time.Second)+1))
	for k := range keys {
		require.LessOrEqual(t, admitted[k].Load(), bound, "key %d admitted more than its credit", k)
	}
	for _, s := range stores {
		require.Zero(t, s.Stats().Failures, "a call answered by the failure rule")
	}
	t.Logf("%d calls over %v; slot %d moved from %s to %s", answered.Load(), elapsed, slot, from, to)
}

// TestClusterMovedToLiveMasterRetried: a MOVED that go-redis did not follow
// (here MaxRedirects -1, and a slot map that sends every slot to the wrong
// master), which points at a master that answers, as during a migration,
// is sent again once go-redis has reloaded its slot map, and decided by
// Redis: only a MOVED to a node the cluster marks failed is answered by
// the failure rule (TestClusterStartOneMasterDown).
func TestClusterMovedToLiveMasterRetried(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	ctx := context.Background()
	real := clusterClient(t, addrs)
	var wrong atomic.Bool // the next slot map read sends each slot to the next master
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ContextTimeoutEnabled: true,
		MaxRedirects:          -1, // none followed
		ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
			//lint:ignore SA1019 ClusterOptions.ClusterSlots takes CLUSTER SLOTS' form, whichever command Redis prefers
			ss, err := real.ClusterSlots(ctx).Result()
			if err != nil || !wrong.CompareAndSwap(true, false) {
				return ss, err
			}
			moved := make([]redis.ClusterSlot, len(ss))
			for i := range ss {
				moved[i] = redis.ClusterSlot{Start: ss[i].Start, End: ss[i].End, Nodes: ss[(i+1)%len(ss)].Nodes}
			}
			return moved, nil
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	p := prefix(t)
	t.Cleanup(func() { cleanPrefix(real, p) })
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: p, Policy: pol, Timeout: slowMachine})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, redisstore.Up(s))
	master := func() string {
		m, err := cc.MasterForKey(ctx, redisstore.BucketKey(p, "k"))
		require.NoError(t, err)
		return m.Options().Addr
	}
	owner := master()
	wrong.Store(true)
	cc.ReloadState(ctx)
	require.Eventually(t, func() bool { return master() != owner }, 5*time.Second, 5*time.Millisecond) // go-redis reloads on a goroutine of its own

	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 3, ResetAfter: time.Second}, d)
	require.Zero(t, s.Stats().Failures)
}

// TestClusterMasterKilled kills the master that holds a key's shard: calls
// on that key are answered by the failure rule (closed, then open), keys
// of shards on the other masters are decided as before, and once the
// master is back (its data kept: append-only) both are decided again.
func TestClusterMasterKilled(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a cluster of its own
	cl := redistest.StartCluster(t)
	addr := strings.Join(cl.Addrs(), ",")
	p := prefix(t)
	cc := clusterClient(t, cl.Addrs())
	owner := slotOwners(t, cc)
	ctx := context.Background()
	pol := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	for _, failOpen := range []bool{false, true} {
		stores := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: pol, FailOpen: failOpen,
			FailRetryAfter: 7 * time.Second, Timeout: 300 * time.Millisecond})
		s := stores[0]
		dead := cl.Addrs()[1]
		victim, alive := "", ""
		for i := 0; victim == "" || alive == ""; i++ {
			k := fmt.Sprint("key", i)
			if owner(redisstore.BucketKey(p, k)) == dead {
				victim = k
			} else {
				alive = k
			}
		}
		d, err := s.Allow(ctx, victim, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		before, at := d.Remaining, time.Now()

		cl.Node(1).Kill()
		for range 3 {
			d, err := s.Allow(ctx, victim, 1)
			require.NoError(t, err)
			require.Equal(t, failOpen, d.Allowed, "the failure rule")
			if !failOpen {
				require.Equal(t, 7*time.Second, d.RetryAfter)
			}
		}
		require.GreaterOrEqual(t, s.Stats().Failures, uint64(3))
		f := s.Stats().Failures
		d, err = s.Allow(ctx, alive, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed, "a shard on a live master is still decided")
		require.Equal(t, f, s.Stats().Failures)
		// also in a batch that has keys on the dead master: go-redis gives
		// every command of a cluster pipeline the error that ends its
		// retries, the live masters' replies too
		out := make([]engine.Result, 2)
		require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: victim, Cost: 1}, {Key: alive, Cost: 1}}, out))
		require.Equal(t, failOpen, out[0].Decision.Allowed, "the failure rule")
		require.True(t, out[0].Decision.Degraded)
		require.False(t, out[1].Decision.Degraded, "a shard on a live master is still decided in a batch")
		require.True(t, out[1].Decision.Allowed)
		require.Equal(t, f+1, s.Stats().Failures)
		f = s.Stats().Failures
		// a cutover is refused before it prepares any shard: the live
		// masters' shards go on deciding under the version in force
		require.ErrorIs(t, s.ReplacePolicy(ctx, policy.Policy{Version: pol.Version + 1, Capacity: 50, TokensPerSecond: 1}, pol.Version), redisstore.ErrUnavailable)
		d, err = s.Allow(ctx, alive, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, pol.Version, d.Version)
		require.Equal(t, f, s.Stats().Failures)

		cl.Node(1).Restart(t)
		cl.Wait(t)
		for i := 0; ; i++ {
			require.Less(t, i, 100, "service did not resume after the master came back")
			f := s.Stats().Failures
			d, err = s.Allow(ctx, victim, 1)
			require.NoError(t, err)
			if s.Stats().Failures == f {
				break
			}
			time.Sleep(50 * time.Millisecond) // the cluster reconverging, not the store
		}
		require.True(t, d.Allowed)
		// kept across the restart, nothing taken while down, refilled at 1/s meanwhile
		require.GreaterOrEqual(t, d.Remaining, before-1)
		require.LessOrEqual(t, d.Remaining, min(99, before-1+int64(time.Since(at)/time.Second)+1))
		// s cuts over again too. Each step of a cutover has s's 300 ms
		// Timeout, which a loaded machine can overrun on a master just
		// restarted: an attempt that fails so (ErrUnavailable) is made
		// again, a few times, as the calls above are.
		pol.Version++
		for i := 0; ; i++ {
			err := s.ReplacePolicy(ctx, pol, pol.Version-1)
			if err == nil {
				break
			}
			require.ErrorIs(t, err, redisstore.ErrUnavailable)
			require.Less(t, i, 5, "the cutover after the master came back: %v", err)
		}
	}
}

// TestClusterLostReplyNotResent: on a cluster, a decision whose reply is
// lost (the script ran) is answered by the failure rule and never sent
// again: go-redis's ClusterClient retries commands after a network error,
// and would take the tokens twice. The client reaches every master through
// a proxy that drops the connection after forwarding the call on one key.
func TestClusterLostReplyNotResent(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	ctx := context.Background()
	//lint:ignore SA1019 not CLUSTER SHARDS, which Redis 6 lacks
	ranges, err := clusterClient(t, addrs).ClusterSlots(ctx).Result()
	require.NoError(t, err)
	var slots []redis.ClusterSlot
	var proxies []*dropProxy
	proxyOf := map[string]*dropProxy{} // a master's, which may hold several ranges
	for _, r := range ranges {
		px := proxyOf[r.Nodes[0].Addr]
		if px == nil {
			// The decide call on the key, not any command that names it.
			px = startDropProxy(t, r.Nodes[0].Addr, regexp.MustCompile(`(?i)(evalsha\r\n\$40\r\n[0-9a-f]{40}|fcall\r\n\$\d+\r\ntokenshard_decide_[0-9a-f]+)\r\n[^ ]*lost-once`))
			proxyOf[r.Nodes[0].Addr], proxies = px, append(proxies, px)
		}
		slots = append(slots, redis.ClusterSlot{Start: r.Start, End: r.End, Nodes: []redis.ClusterNode{{Addr: px.ln.Addr().String()}}})
	}
	proxied := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil }})
	t.Cleanup(func() { _ = proxied.Close() })
	p := prefix(t)
	pol := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: proxied, Prefix: p, Policy: pol, FailRetryAfter: 3 * time.Second}, clock.NewManual(0))
	direct := newStore(t, redisstore.Config{Client: clusterClient(t, addrs), Prefix: p, Policy: pol}, clock.NewManual(0))
	// The script loaded where the lost call goes, so the reply dropped is
	// the decision's, not a "Function not found" (loads are per master, on
	// a miss: a warm-up on another key may land on another master).
	_, err = direct.Peek(ctx, "lost-once")
	require.NoError(t, err)
	_, err = s.Peek(ctx, "warm") // where FCALL is refused (Redis 6), s's first call meets it: not this one
	require.NoError(t, err)
	d, err := s.Allow(ctx, "lost-once", 3)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: false, RetryAfter: 3 * time.Second, Version: 1, Limit: 10, Degraded: true}, d, "the failure rule")
	require.Equal(t, uint64(1), s.Stats().Failures)

	d, err = direct.Peek(ctx, "lost-once")
	require.NoError(t, err)
	var dropped []string
	for _, px := range proxies {
		if px.fired.Load() {
			dropped = append(dropped, px.droppedReply())
		}
	}
	require.Len(t, dropped, 1, "one decide call's reply dropped")
	require.Equal(t, int64(7), d.Remaining, "the script ran once: 3 taken, not 6 (the reply dropped: %s)", dropped[0])
}

// TestPlainClientOnClusterNodeFails: a *redis.Client pointed at one node of
// a cluster cannot run the store (its scripts span shards, or meet MOVED):
// New says so rather than a later decision, and says what to give it.
func TestPlainClientOnClusterNodeFails(t *testing.T) {
	addr := redistest.ClusterAddrs(t)[0]
	_, err := redisstore.New(context.Background(), redisstore.Config{Client: client(t, addr), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Timeout: 2 * time.Second})
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorContains(t, err, "the server is a node of a Redis Cluster, which the store reaches only through a *redis.ClusterClient")
	t.Log(err)
}

// TestClusterClientOnPlainServerFails: the mirror of
// TestPlainClientOnClusterNodeFails. A *redis.ClusterClient pointed at a
// server that is not in a cluster gets go-redis's "cluster support disabled"
// from every command: New says what to give it instead.
func TestClusterClientOnPlainServerFails(t *testing.T) {
	_, err := redisstore.New(context.Background(), redisstore.Config{Client: clusterClient(t, []string{redisAddr(t)}), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Timeout: 2 * time.Second})
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorContains(t, err, "the server is not a node of a Redis Cluster; reach it through a *redis.Client")
	t.Log(err)
}

// TestClusterMasterLosesData: a master restarts empty (no persistence),
// losing its shards' policy state, their buckets and perhaps the global
// keys. The store reinstalls what is missing at the policy it knows and
// decides again without a new Store: the lost buckets start full (as on
// one server that lost everything), the others keep their balance.
func TestClusterMasterLosesData(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a cluster of its own
	cl := redistest.StartCluster(t)
	addr := strings.Join(cl.Addrs(), ",")
	p := prefix(t)
	cc := clusterClient(t, cl.Addrs())
	owner := slotOwners(t, cc)
	ctx := context.Background()
	pol := policy.Policy{Version: 4, Capacity: 100, TokensPerSecond: 1}
	// The calls to the master while it restarts are refused, within
	// go-redis's dial retries (about 400 ms): the Timeout bounds only the
	// calls that must be decided, the ReplacePolicy's steps too, which
	// 300 ms need not cover on a loaded machine.
	s := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: pol, Timeout: slowMachine})[0]
	lost, kept := "", ""
	for i := 0; lost == "" || kept == ""; i++ {
		k := fmt.Sprint("key", i)
		if owner(redisstore.BucketKey(p, k)) == cl.Addrs()[2] {
			lost = k
		} else {
			kept = k
		}
	}
	for _, k := range []string{lost, kept} {
		d, err := s.Allow(ctx, k, 50)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	cl.RestartEmpty(t, 2)
	for i := 0; ; i++ {
		require.Less(t, i, 100, "service did not resume after the master came back empty")
		f := s.Stats().Failures
		d, err := s.Allow(ctx, lost, 1)
		require.NoError(t, err)
		if s.Stats().Failures == f {
			require.True(t, d.Allowed)
			require.Equal(t, int64(99), d.Remaining, "the lost bucket starts full")
			require.Equal(t, int64(4), d.Version, "under the policy the store reinstalled")
			break
		}
		time.Sleep(50 * time.Millisecond) // the cluster reconverging, not the store
	}
	d, err := s.Allow(ctx, kept, 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Less(t, d.Remaining, int64(60), "the other master's bucket kept its balance")
	pol.Version++
	require.NoError(t, s.ReplacePolicy(ctx, pol, 4))
	d, err = s.Allow(ctx, lost, 1)
	require.NoError(t, err)
	require.Equal(t, int64(5), d.Version)
}

// TestVirtualShardsStored: the first store on a prefix stores its number of
// virtual shards; a later store with another number uses the stored one,
// so both map every key to the same bucket. Out of range is refused.
func TestVirtualShardsStored(t *testing.T) {
	ctx := context.Background()
	c := client(t, redisAddr(t))
	p := prefix(t)
	pol := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	clk := clock.NewManual(0)
	a := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: pol, VirtualShards: 4}, clk)
	b := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: pol, VirtualShards: 32}, clk)
	for i := range 20 {
		k := fmt.Sprint("k", i)
		_, err := a.Allow(ctx, k, 3)
		require.NoError(t, err)
		d, err := b.Peek(ctx, k)
		require.NoError(t, err)
		require.Equal(t, int64(7), d.Remaining, "%s: b sees a's bucket", k)
	}
	require.Equal(t, "4", c.HGet(ctx, redisstore.GlobalKey(p, "policy"), "shards").Val())
	for _, n := range []int{-1, redisstore.MaxVirtualShards + 1} {
		_, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: prefix(t), Policy: pol, VirtualShards: n})
		require.ErrorIs(t, err, engine.ErrInvalidConfig, "VirtualShards %d", n)
	}
}

// TestClusterShardBehindIsRaised: a shard left at an older version than the
// committed one (reinstalled from a version read just before a commit) is
// published to the committed version by the first store call that meets
// it, rather than refusing every store that knows the commit.
func TestClusterShardBehindIsRaised(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	ctx := context.Background()
	s := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}})[0]
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1))
	cc := clusterClient(t, addrs)
	policies, _, _ := redisstore.ShardStateKeys(p)
	sh := redisstore.ShardOf(p, "k")
	require.NoError(t, cc.HSet(ctx, policies[sh], "v", "1").Err())
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 19, Version: 2, Limit: 20, ResetAfter: time.Second}, d)
	require.Zero(t, s.Stats().Failures)
	require.Equal(t, "2", cc.HGet(ctx, policies[sh], "v").Val())
}

// A prefix may hold braces, but for a first "{" closed at once (New
// refuses that one): a tag in the prefix puts every key in its slot (one
// master), while a "{" left open, or a stray "}", leaves the store's own
// tags to place the shards, evenly over the masters as for a plain prefix.
// Each works on a cluster as on one server.
func TestClusterPrefixWithBraces(t *testing.T) {
	ctx := context.Background()
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	cc := clusterClient(t, redistest.ClusterAddrs(t))
	owner := slotOwners(t, cc)
	for _, tail := range []string{"app{t}:", "a{b:", "}{:", "{", "a}b:"} {
		p := prefix(t) + tail
		s := newStore(t, redisstore.Config{Client: clusterClient(t, redistest.ClusterAddrs(t)), Prefix: p, Policy: pol}, clock.NewManual(0))
		per := map[string]int{}
		policies, _, _ := redisstore.ShardStateKeys(p)
		for _, k := range policies {
			per[owner(k)]++
		}
		if tail == "app{t}:" {
			require.Len(t, per, 1, "prefix tail %q: every shard in the prefix tag's slot", tail)
		} else {
			require.Len(t, per, redistest.ClusterMasters, "prefix tail %q: %v", tail, per)
			for m, n := range per {
				require.GreaterOrEqual(t, n, redisstore.DefaultVirtualShards/redistest.ClusterMasters, "prefix tail %q: master %s holds %d of %d shards", tail, m, n, redisstore.DefaultVirtualShards)
			}
		}
		for i, want := range []bool{true, true, true, false} {
			d, err := s.Allow(ctx, "k", 1)
			require.NoError(t, err, "prefix tail %q", tail)
			require.False(t, d.Degraded, "prefix tail %q", tail)
			require.Equal(t, want, d.Allowed, "prefix tail %q, request %d", tail, i)
		}
		out := make([]engine.Result, 3)
		require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 3}, {Key: "a", Cost: 3}}, out))
		require.Equal(t, []bool{true, true, false}, []bool{out[0].Decision.Allowed, out[1].Decision.Allowed, out[2].Decision.Allowed}, "prefix tail %q: %+v", tail, out)
		require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1), "prefix tail %q", tail)
		d, err := s.Allow(ctx, "b", 1)
		require.NoError(t, err)
		require.Equal(t, engine.Decision{RetryAfter: time.Second, Version: 2, Limit: 5, ResetAfter: 5 * time.Second}, d, "prefix tail %q", tail)
	}
}
