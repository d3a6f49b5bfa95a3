package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestForeignBucketValue: a value no store writes at a bucket's key (here
// text) is outside the store's contract; what the package doc says of it
// holds: the calls that meet it answer by the failure rule, not from it,
// and deleting the key mends it.
func TestForeignBucketValue(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, OnError: func(error) {}}, clk)
	ctx := context.Background()
	key := redisstore.BucketKey(p, "k")
	require.NoError(t, c.Set(ctx, key, "hello", 0).Err())
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Degraded && !d.Allowed, "answered by the failure rule (closed): %+v", d)
	require.Equal(t, "hello", c.Get(ctx, key).Val(), "left as it was")
	require.NoError(t, c.Del(ctx, key).Err())
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: time.Second}, d, "deleted: a new bucket")
}

// TestPolicyBlobOfAnotherVersion: a policy record stored under one version
// that holds another (an operator's copy under the wrong field) is an error
// that names both, not a policy the store adopts, whose calls every shard
// would then refuse as stale until they gave up.
func TestPolicyBlobOfAnotherVersion(t *testing.T) {
	c := client(t, redisAddr(t))
	p := prefix(t)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: v1}, nil)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, redisstore.GlobalKey(p, "blobs"), "1",
		redisstore.PolicyBlob(policy.Policy{Version: 5, Capacity: 3, TokensPerSecond: 1})).Err())
	_, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: p, Policy: v1})
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorContains(t, err, "stored policy version 1 holds version 5")
}

// TestShardVersionNotAVersion: a virtual shard whose version is not one (an
// operator's typo) fails the calls on it at once, by the failure rule, and
// a ReplacePolicy, each saying which shard holds what: not as a policy
// that keeps changing, after as many attempts as the store allows.
func TestShardVersionNotAVersion(t *testing.T) {
	c := client(t, redisAddr(t))
	p := prefix(t)
	var mu sync.Mutex
	var reported []error
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
		OnError: func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }}, nil)
	ctx := context.Background()
	policies, _, _ := redisstore.ShardStateKeys(p)
	for _, k := range policies {
		require.NoError(t, c.HSet(ctx, k, "v", "x1").Err())
	}
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Degraded)
	require.Equal(t, noFuncRetries(t, c), s.Stats().Retries, "not sent again")
	mu.Lock()
	require.Len(t, reported, 1)
	require.ErrorIs(t, reported[0], redisstore.ErrUnavailable)
	require.ErrorContains(t, reported[0], `holds version "x1"`)
	mu.Unlock()
	err = s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}, 1)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorContains(t, err, `holds version "x1"`)
}

// TestForeignCutoverLock: a cutover lock no store set (a key with no
// expiry, or of another type: an operator's) never goes away by itself, so
// ReplacePolicy fails at once, saying so, rather than wait on it for as
// long as its context allows; deleting it is the way back.
func TestForeignCutoverLock(t *testing.T) {
	c := client(t, redisAddr(t))
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, nil)
	ctx := context.Background()
	lock := redisstore.GlobalKey(p, "lock")
	for _, set := range []func() error{
		func() error { return c.Set(ctx, lock, "someone", 0).Err() },
		func() error { return c.HSet(ctx, lock, "someone", "1").Err() },
	} {
		require.NoError(t, set())
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.ReplacePolicy(rctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}, 1)
		cancel()
		require.ErrorIs(t, err, redisstore.ErrUnavailable)
		require.NotErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "delete it")
		require.NoError(t, c.Del(ctx, lock).Err())
	}
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}, 1))
}

// TestCutoverLockReadFails: a reply error other than WRONGTYPE to the
// read of a cutover lock another store holds (BUSY, LOADING, CLUSTERDOWN:
// the server's state, not the key's) says nothing of who set the lock, so
// ReplacePolicy waits on as for any holder, rather than fail telling the
// user to delete a live store's lock.
func TestCutoverLockReadFails(t *testing.T) {
	c, holder := client(t, redisAddr(t)), client(t, redisAddr(t))
	p := prefix(t)
	lock := redisstore.GlobalKey(p, "lock")
	ctx := context.Background()
	var once sync.Once
	c.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); cmd.Name() == "get" && len(a) == 2 && a[1] == lock {
			once.Do(func() {
				// the holder lets go as the read fails
				require.NoError(t, holder.Del(ctx, lock).Err())
				err = transientReply("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.")
				cmd.SetErr(err)
			})
		}
		return err
	}})
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, nil)
	require.NoError(t, c.Set(ctx, lock, "another store", time.Minute).Err()) // a store's: with an expiry
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, s.ReplacePolicy(rctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}, 1))
}

type transientReply string

func (e transientReply) Error() string { return string(e) }
func (transientReply) RedisError()     {}

// TestCutoverRecordWithoutPolicy: a cutover record that names a version
// whose policy is not stored (written by hand) is never finished: its
// finisher fails, saying so, before it prepares any shard, so the stores
// on the prefix go on deciding under the version in force, rather than
// every call meeting a committed version no store can read.
func TestCutoverRecordWithoutPolicy(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	p := prefix(t)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: v1}, clk)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, redisstore.GlobalKey(p, "policy"), "next", "9 0 0 - 10 1 0").Err())
	_, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: p, Policy: v1, Clock: clk})
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorContains(t, err, "policy version 9")
	require.Equal(t, "1", c.HGet(ctx, redisstore.GlobalKey(p, "policy"), "v").Val(), "not committed")
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: time.Second}, d, "decided under version 1")
	// the way back: remove the record
	require.NoError(t, c.HDel(ctx, redisstore.GlobalKey(p, "policy"), "next").Err())
	s2, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: p, Policy: v1, Clock: clk})
	require.NoError(t, err)
	require.NoError(t, s2.Close())
}

// TestPolicyRecordOfANewerLayout: a stored policy with a field this
// version of the package does not know (written by a newer one, which
// must not share the prefix) is an error, not a policy read without the
// limit it names.
func TestPolicyRecordOfANewerLayout(t *testing.T) {
	c := client(t, redisAddr(t))
	p := prefix(t)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: v1}, nil)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, redisstore.GlobalKey(p, "blobs"), "1",
		`{"Version":1,"Capacity":10,"TokensPerSecond":1,"Concurrency":{"Max":3}}`).Err())
	_, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: p, Policy: v1})
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorContains(t, err, `unknown field "Concurrency"`)
}

// TestShardCopyWithoutVersion: a virtual shard's copy of the policy state
// that lost its version but kept its key map (an operator's HDEL) is
// installed again at the version in force, as one lost whole is, rather
// than refuse every call until the store gives up.
func TestShardCopyWithoutVersion(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	policies, _, _ := redisstore.ShardStateKeys(p)
	for _, k := range policies {
		require.NoError(t, c.HDel(ctx, k, "v").Err())
	}
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: time.Second}, d)
	require.Equal(t, "1", c.HGet(ctx, policies[0], "v").Val(), "the copy every call reads on one server")
}

// TestGlobalPolicyWithoutVersion: the prefix's global policy hash that lost
// its version but kept its key map (an operator's HDEL) is installed again
// as lost global keys are (from the newest version a shard holds, which
// the store must know), keeping its key map, rather than fail every New
// and ReplacePolicy with "the policy disappeared while it was read".
func TestGlobalPolicyWithoutVersion(t *testing.T) {
	c := client(t, redisAddr(t))
	p := prefix(t)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: v1}, nil)
	ctx := context.Background()
	v2 := policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}
	require.NoError(t, s.ReplacePolicy(ctx, v2, 1))
	global := redisstore.GlobalKey(p, "policy")
	seed := c.HGet(ctx, global, "seed").Val()
	require.NoError(t, c.HDel(ctx, global, "v").Err())

	_, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: p, Policy: v1})
	require.ErrorContains(t, err, "only a store that knows version 2", "a store that does not know the shards' version")
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 20, TokensPerSecond: 1}, 2), "one that does reinstalls it")
	require.Equal(t, "3", c.HGet(ctx, global, "v").Val())
	require.Equal(t, seed, c.HGet(ctx, global, "seed").Val(), "the key map kept")

	require.NoError(t, c.HDel(ctx, global, "v").Err())
	s2, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 3, Capacity: 20, TokensPerSecond: 1}})
	require.NoError(t, err, "so does New with the shards' version")
	require.NoError(t, s2.Close())
	require.Equal(t, "3", c.HGet(ctx, global, "v").Val())
	require.Equal(t, seed, c.HGet(ctx, global, "seed").Val(), "the key map kept")
}
