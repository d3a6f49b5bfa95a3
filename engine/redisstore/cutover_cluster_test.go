package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// failPublish returns a cluster client whose cutover publish step fails on
// the shard whose policy hash is shardPolicy while block is set (the
// master away during that step), the other commands going through.
func failPublish(t *testing.T, addrs []string, shardPolicy string, block *atomic.Bool) *redis.ClusterClient {
	return failStep(t, addrs, redisstore.PublishScript, shardPolicy, block)
}

// failStep is failPublish for the cutover step whose script is src.
func failStep(t *testing.T, addrs []string, src, shardPolicy string, block *atomic.Bool) *redis.ClusterClient {
	c := clusterClient(t, addrs)
	blocked := func(cmd redis.Cmder) bool {
		k := scriptKeys(cmd)
		return block.Load() && len(k) > 0 && k[0] == shardPolicy && cmd.Name() == "eval" && fmt.Sprint(cmd.Args()[1]) == src
	}
	c.AddHook(hook{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if blocked(cmd) {
				cmd.SetErr(errors.New("the master is away"))
				return cmd.Err()
			}
			return next(ctx, cmd)
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			var pass []redis.Cmder
			for _, cmd := range cmds {
				if blocked(cmd) {
					cmd.SetErr(errors.New("the master is away"))
				} else {
					pass = append(pass, cmd)
				}
			}
			if len(pass) == 0 {
				return nil
			}
			return next(ctx, pass)
		},
	})
	return c
}

// TestClusterCommittedUnpublishedThenReplace: a cutover committed whose
// publish did not reach one shard, then a ReplacePolicy to the next version
// before any call met that shard. The second cutover first finishes the
// first (never overwriting its record), then makes its own: every shard
// ends at the last version, every key is decided, and New succeeds.
func TestClusterCommittedUnpublishedThenReplace(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	ctx := context.Background()
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	policies, _, _ := redisstore.ShardStateKeys(p)
	var block atomic.Bool
	block.Store(true)
	admin, err := redisstore.New(ctx, redisstore.Config{Client: failPublish(t, addrs, policies[0], &block), Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	t.Cleanup(func() { cleanPrefix(clusterClient(t, addrs), p) })
	err = admin.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.Contains(t, err.Error(), "recorded but not finished")
	cc := clusterClient(t, addrs)
	require.Equal(t, "2", cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "v").Val(), "committed")
	require.Equal(t, "p2", cc.HGet(ctx, policies[0], "v").Val(), "shard 0 not published")
	block.Store(false)

	other := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: v1})[0]
	require.NoError(t, other.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 30, TokensPerSecond: 1}, 2))
	for i, k := range policies {
		require.Equal(t, "3", cc.HGet(ctx, k, "v").Val(), "shard %d", i)
	}
	require.Equal(t, "3", cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "v").Val())
	for i := range 64 {
		d, err := other.Allow(ctx, fmt.Sprint("k", i), 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, int64(3), d.Version)
	}
	require.Zero(t, other.Stats().Failures)
	fresh, err := redisstore.New(ctx, redisstore.Config{Client: clusterClient(t, addrs), Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	require.Equal(t, int64(3), fresh.Policy().Version)
}

// TestClusterLatePublishAtCommitInstant: a cutover whose publish missed
// one shard, finished ten seconds later by a call, converts that shard's
// buckets as of the commit's instant, as an immediate cutover does: never
// refilled under the old (faster) limit past it.
func TestClusterLatePublishAtCommitInstant(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	ctx := context.Background()
	const key = "k"
	v1 := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 10}
	v2 := policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1}
	remaining := func(late bool) int64 {
		p := prefix(t)
		policies, _, _ := redisstore.ShardStateKeys(p)
		var block atomic.Bool
		clk := clock.NewManual(0)
		newStore(t, redisstore.Config{Client: clusterClient(t, addrs), Prefix: p, Policy: v1}, clk) // creates the prefix's key map
		s := newStore(t, redisstore.Config{Client: failPublish(t, addrs, policies[redisstore.ShardOf(p, key)], &block),
			Prefix: p, Policy: v1}, clk)
		d, err := s.Allow(ctx, key, 100)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		clk.Advance(time.Second) // 10 refilled under v1
		block.Store(late)
		err = s.ReplacePolicy(ctx, v2, 1)
		if late {
			require.ErrorContains(t, err, "recorded but not finished")
		} else {
			require.NoError(t, err)
		}
		clk.Advance(10 * time.Second) // 10 refilled under v2
		block.Store(false)
		d, err = s.Peek(ctx, key)
		require.NoError(t, err)
		require.Equal(t, int64(2), d.Version)
		require.Zero(t, s.Stats().Failures)
		return d.Remaining
	}
	require.Equal(t, int64(20), remaining(false), "an immediate cutover")
	require.Equal(t, int64(20), remaining(true), "a cutover whose publish reached the key's shard 10 s late")
}

// TestClusterLengtheningFinishedByAnother: a lengthening cutover whose
// prepare missed one shard (its master away) and whose process then gave up
// (its pending flags released) keeps that shard writing buckets without
// expiry: the cutover's own pending flag, set before any shard is
// prepared. A call on another store finishes it, removing only that flag
// (another holder's stays), and leaves the record for the expiry pass,
// which the next ReplacePolicy runs before its own cutover.
func TestClusterLengtheningFinishedByAnother(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	ctx := context.Background()
	policies, _, pendings := redisstore.ShardStateKeys(p)
	const key = "k"
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 10}
	v2 := policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 10} // lengthens
	// s creates the prefix's key map, by which the shard is picked
	s := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: v1})[0]
	sh := redisstore.ShardOfStore(s, key)
	other := "o"
	for i := 0; redisstore.ShardOfStore(s, other) == sh; i++ {
		other = fmt.Sprint("o", i)
	}
	var block atomic.Bool
	admin, err := redisstore.New(ctx, redisstore.Config{Client: failStep(t, addrs, redisstore.PrepareScript, policies[sh], &block), Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	cc := clusterClient(t, addrs)

	block.Store(true)
	require.ErrorContains(t, admin.ReplacePolicy(ctx, v2, 1), "recorded but not finished")
	block.Store(false)
	require.Equal(t, "1", cc.HGet(ctx, policies[sh], "v").Val(), "the shard was not prepared")
	d, err := s.Allow(ctx, key, 5)
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Version)
	require.Equal(t, time.Duration(-1), cc.PTTL(ctx, redisstore.BucketKey(p, key)).Val(),
		"a bucket written under the old version while the lengthening cutover is unfinished has no expiry")
	require.NoError(t, cc.HSet(ctx, pendings[sh], "foreign", "1").Err()) // another holder's flag
	require.NoError(t, cc.PExpire(ctx, pendings[sh], time.Minute).Err())

	d, err = s.Allow(ctx, other, 1) // a prepared shard: the call finishes the cutover
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	require.Zero(t, s.Stats().Failures)
	for i, k := range policies {
		require.Equal(t, "2", cc.HGet(ctx, k, "v").Val(), "shard %d", i)
		require.False(t, cc.HExists(ctx, pendings[i], "c2").Val(), "shard %d keeps the cutover's flag", i)
	}
	require.True(t, cc.HExists(ctx, pendings[sh], "foreign").Val(), "another holder's flag was removed")
	require.NotEmpty(t, cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "next").Val(), "the record waits for the expiry pass")
	require.NoError(t, cc.HDel(ctx, pendings[sh], "foreign").Err()) // its holder is done

	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 50, TokensPerSecond: 10}, 2))
	ttl := cc.PTTL(ctx, redisstore.BucketKey(p, key)).Val()
	require.Greater(t, ttl, time.Duration(0), "the expiry pass set the bucket's expiry")
	require.Empty(t, cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "next").Val(), "both cutovers ended")
}

// TestClusterGlobalLostNotReinstalledOlder: the global keys are lost (their
// master restarted empty) while the shards, on other masters, hold the
// version a cutover published. A store that never met that version does
// not reinstall the global keys below it (its calls fail by the failure
// rule, with an error that says why), nor does New with an older
// Config.Policy; a store that knows the version reinstalls them at it, and
// every store decides again.
func TestClusterGlobalLostNotReinstalledOlder(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	ctx := context.Background()
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	var errs []error
	var mu sync.Mutex
	stores := realStores(t, strings.Join(addrs, ","), 2, redisstore.Config{Prefix: p, Policy: v1,
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }})
	a, b := stores[0], stores[1]
	require.NoError(t, a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1))
	cc := clusterClient(t, addrs)
	for _, name := range []string{"policy", "history", "blobs", "lock"} {
		require.NoError(t, cc.Del(ctx, redisstore.GlobalKey(p, name)).Err())
	}

	d, err := b.Allow(ctx, "k", 1) // b is at version 1: the shard answers stale
	require.NoError(t, err)
	require.False(t, d.Allowed, "the failure rule")
	require.NotZero(t, b.Stats().Failures)
	mu.Lock()
	require.NotEmpty(t, errs)
	require.ErrorContains(t, errs[len(errs)-1], "newer than this store's 1")
	mu.Unlock()
	require.Zero(t, cc.Exists(ctx, redisstore.GlobalKey(p, "policy")).Val(), "not reinstalled at version 1")
	_, err = redisstore.New(ctx, redisstore.Config{Client: clusterClient(t, addrs), Prefix: p, Policy: v1, Timeout: slowMachine})
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.Zero(t, cc.Exists(ctx, redisstore.GlobalKey(p, "policy")).Val(), "New did not reinstall them at version 1")

	// a knows version 2: its next cutover reinstalls the global keys at it first
	require.NoError(t, a.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 30, TokensPerSecond: 1}, 2))
	f := b.Stats().Failures
	d, err = b.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, int64(3), d.Version)
	require.Equal(t, f, b.Stats().Failures)
}

// TestClusterLengtheningSetsExpiries: on a cluster as on one server, a
// lengthening cutover's pass gives every bucket an expiry under the new
// policy before ReplacePolicy returns: the caller's pending flags go once
// every shard is published, before the pass.
func TestClusterLengtheningSetsExpiries(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	ctx := context.Background()
	// A token a minute, so that k0 (5 tokens short) is not full, and gone,
	// before the 31 Allows after it and the cutover's first steps are
	// done, however long a loaded machine takes. Each bucket's expiry is
	// then 5 minutes and some, and 95 minutes under the new policy.
	s := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(1)}})[0]
	keys := make([]string, 32) // over several shards, so over every master
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		d, err := s.Allow(ctx, keys[i], 5) // full again in 5 minutes
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100, Refill: policy.PerMinute(1)}, 1)) // lengthens
	cc := clusterClient(t, addrs)
	for _, k := range keys {
		require.Greater(t, cc.PTTL(ctx, redisstore.BucketKey(p, k)).Val(), 10*time.Minute, "%s after the lengthening cutover: no expiry, or the old one", k)
	}
	_, _, pendings := redisstore.ShardStateKeys(p)
	for _, k := range pendings {
		require.Zero(t, cc.Exists(ctx, k).Val(), "the pending flags are cleared")
	}
}
