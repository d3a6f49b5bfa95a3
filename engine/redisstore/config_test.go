package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestNewWithoutPolicySaysSo: a Config with no Policy at all is told so,
// not that its policy's version 0 is too low.
func TestNewWithoutPolicySaysSo(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisstore.New(context.Background(), redisstore.Config{Client: c})
	require.ErrorIs(t, err, engine.ErrInvalidPolicy)
	require.EqualError(t, err, "policy: invalid: Config.Policy is not set, and it is required")
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	noTimeout := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = noTimeout.Close() })
	ok := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ok.Close() })
	clusterNoTimeout := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = clusterNoTimeout.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	noPort := redis.NewClient(&redis.Options{Addr: "127.0.0.1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = noPort.Close() })
	clusterNoPort := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1", "localhost"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = clusterNoPort.Close() })
	// a port no dial can use: refused, not taken for a server that is down
	badPort := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	clusterBadPort := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1", "127.0.0.1:abc"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = clusterBadPort.Close() })
	clusterNoAddrs := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = clusterNoAddrs.Close() })
	clusterBadHost := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1", "redis 2:6379"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = clusterBadHost.Close() })
	replicaReads := func(o redis.ClusterOptions) *redis.ClusterClient {
		o.Addrs, o.ContextTimeoutEnabled = []string{"127.0.0.1:1"}, true
		c := redis.NewClusterClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var nilClient *redis.Client
	for _, tc := range []struct {
		name string
		cfg  redisstore.Config
		want error
	}{
		{"invalid policy", redisstore.Config{Client: ok}, engine.ErrInvalidPolicy},
		{"no client", redisstore.Config{Policy: good}, engine.ErrInvalidConfig},
		{"no context timeouts", redisstore.Config{Policy: good, Client: noTimeout}, engine.ErrInvalidConfig},
		{"cluster without context timeouts", redisstore.Config{Policy: good, Client: clusterNoTimeout}, engine.ErrInvalidConfig},
		{"a Ring", redisstore.Config{Policy: good, Client: ring}, engine.ErrInvalidConfig},
		{"cluster reading replicas", redisstore.Config{Policy: good, Client: replicaReads(redis.ClusterOptions{ReadOnly: true})}, engine.ErrInvalidConfig},
		{"cluster routing by latency", redisstore.Config{Policy: good, Client: replicaReads(redis.ClusterOptions{RouteByLatency: true})}, engine.ErrInvalidConfig},
		{"cluster routing randomly", redisstore.Config{Policy: good, Client: replicaReads(redis.ClusterOptions{RouteRandomly: true})}, engine.ErrInvalidConfig},
		{"a nil *redis.Client", redisstore.Config{Policy: good, Client: nilClient}, engine.ErrInvalidConfig},
		{"negative MaxKeyBytes", redisstore.Config{Policy: good, Client: ok, MaxKeyBytes: -1}, engine.ErrInvalidConfig},
		{"negative Timeout", redisstore.Config{Policy: good, Client: ok, Timeout: -1}, engine.ErrInvalidConfig},
		{"negative FailRetryAfter", redisstore.Config{Policy: good, Client: ok, FailRetryAfter: -1}, engine.ErrInvalidConfig},
		{"Monotonic clock", redisstore.Config{Policy: good, Client: ok, Clock: clock.NewMonotonic()}, engine.ErrInvalidConfig},
		{"an address without a port", redisstore.Config{Policy: good, Client: noPort}, engine.ErrInvalidConfig},
		{"a cluster address without a port", redisstore.Config{Policy: good, Client: clusterNoPort}, engine.ErrInvalidConfig},
		{"port 99999", redisstore.Config{Policy: good, Client: badPort("127.0.0.1:99999")}, engine.ErrInvalidConfig},
		{"port 0", redisstore.Config{Policy: good, Client: badPort("127.0.0.1:0")}, engine.ErrInvalidConfig},
		{"port -1", redisstore.Config{Policy: good, Client: badPort("127.0.0.1:-1")}, engine.ErrInvalidConfig},
		{"port 6379x", redisstore.Config{Policy: good, Client: badPort(":6379x")}, engine.ErrInvalidConfig},
		{"a cluster address with port abc", redisstore.Config{Policy: good, Client: clusterBadPort}, engine.ErrInvalidConfig},
		// a host no dial can reach, whatever the network does: refused, not
		// taken for a server that is down (which would start a store that
		// answers by the failure rule for ever)
		{"a host with a space", redisstore.Config{Policy: good, Client: badPort("redis host:6379")}, engine.ErrInvalidConfig},
		{"a host led by a space", redisstore.Config{Policy: good, Client: badPort(" 127.0.0.1:6379")}, engine.ErrInvalidConfig},
		{"two hosts in one address", redisstore.Config{Policy: good, Client: badPort("a,b:6379")}, engine.ErrInvalidConfig},
		{"a host with a slash", redisstore.Config{Policy: good, Client: badPort("redis/0:6379")}, engine.ErrInvalidConfig},
		{"a cluster address with a space", redisstore.Config{Policy: good, Client: clusterBadHost}, engine.ErrInvalidConfig},
		{"a cluster client with no address", redisstore.Config{Policy: good, Client: clusterNoAddrs}, engine.ErrInvalidConfig},
		// Redis Cluster would hash each key whole, so no script's keys would
		// share a slot; refused on one server too, so that moving to a
		// cluster does not break it
		{"a prefix whose first { is closed at once", redisstore.Config{Policy: good, Client: ok, Prefix: "app{}:"}, engine.ErrInvalidConfig},
		{"a prefix of {}", redisstore.Config{Policy: good, Client: ok, Prefix: "x}{}{a}"}, engine.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := redisstore.New(context.Background(), tc.cfg)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, s)
			if field, ok := strings.CutPrefix(tc.name, "negative "); ok {
				require.ErrorContains(t, err, "Config."+field+" is negative", "the error names the field to fix")
			}
		})
	}
}

// TestNewAdoptsStoredPolicy: the first store on a prefix installs its
// policy; a later one with another policy adopts the stored one, and sees
// cutovers made through the first.
func TestNewAdoptsStoredPolicy(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	p := prefix(t)
	first := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}}, clk)
	second := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 9, Capacity: 100, TokensPerSecond: 100}}, clk)
	require.Equal(t, int64(2), second.Policy().Version)
	d, err := second.Allow(context.Background(), "k", 5)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 2, Limit: 5, ResetAfter: 5 * time.Second}, d)

	require.NoError(t, first.ReplacePolicy(context.Background(), policy.Policy{Version: 3, Capacity: 7, TokensPerSecond: 1}, 2))
	require.Equal(t, int64(2), second.Policy().Version, "not seen before its next call")
	d, err = second.Allow(context.Background(), "k", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: false, RetryAfter: time.Second, Version: 3, Limit: 7, ResetAfter: 7 * time.Second}, d)
	require.Equal(t, int64(3), second.Policy().Version)
	err = second.ReplacePolicy(context.Background(), policy.Policy{Version: 4, Capacity: 7, TokensPerSecond: 1}, 2)
	require.ErrorIs(t, err, engine.ErrStalePolicy)
	require.ErrorContains(t, err, "version in force 3", "the version to retry with, as the engine says it")
	require.Positive(t, second.Stats().Retries)
}

// TestNewAdoptsStoredPolicyOfSameVersion: a later store whose Config.Policy
// has the stored policy's version but another limit adopts the stored one
// too, so two stores never decide one version under two limits.
func TestNewAdoptsStoredPolicyOfSameVersion(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	p := prefix(t)
	newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}}, clk)
	second := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 100}}, clk)
	require.Equal(t, int64(5), second.Policy().Capacity)
	d, err := second.Allow(context.Background(), "k", 5)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 5, ResetAfter: 5 * time.Second}, d)
	_, err = second.Allow(context.Background(), "k", 6)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
}

// TestScriptReloaded: a Redis that lost its scripts and functions (SCRIPT
// FLUSH and FUNCTION FLUSH, as after a restart without persistence) gets
// the script again on the next call. On a server of its own: the flush
// would make other tests' first call meet the script missing.
func TestScriptReloaded(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, startPrivate(t).Addr())
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	_, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	if err := c.FunctionFlush(ctx).Err(); !redis.HasErrorPrefix(err, "unknown command") { // Redis 6 has no FUNCTION
		require.NoError(t, err)
	}
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Remaining)
	require.Zero(t, s.Stats().Failures)
}

// TestContextBeforeCall: a context already done returns its error and sends
// nothing; Close wins over it (ErrClosed comes before the context's error, as
// in the engine's package doc's Errors section).
func TestContextBeforeCall(t *testing.T) {
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clk)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, s.Stats().Decisions)
	require.NoError(t, s.Close())
	_, err = s.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, engine.ErrClosed)
}

// TestOutOfMemoryIsKeyCapacity: a Redis at its maxmemory (noeviction)
// refuses the script's writes; the store answers engine.ErrKeyCapacity, not
// a fail-open admission.
func TestOutOfMemoryIsKeyCapacity(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, FailOpen: true}, clk)
	_, err := s.Allow(ctx, "before", 1)
	require.NoError(t, err)
	outOfMemory(t, c)
	retries := s.Stats().Retries
	_, err = s.Allow(ctx, "after", 1)
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	require.Zero(t, s.Stats().Failures)
	require.False(t, errors.Is(err, redisstore.ErrUnavailable))
	// Redis refuses FCALL out of memory before it runs: the call is sent
	// again as EVALSHA, and Stats.Retries says so (where there is FCALL).
	if noFuncRetries(t, c) == 0 {
		require.Greater(t, s.Stats().Retries, retries, "the FCALL refused for memory, sent again")
	}
}

// TestNewCanceled: New with a canceled context returns its error and no
// store, rather than a store that starts without Redis: the caller asked it
// to stop.
func TestNewCanceled(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := redisstore.New(ctx, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}})
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, s)
}

// TestNewNilClientSaysNil: a typed nil client (a *redis.Client or
// *redis.ClusterClient variable never assigned) is refused as nil, not
// taken for a client that lacks ContextTimeoutEnabled, which a user would
// then go and set to no avail.
func TestNewNilClientSaysNil(t *testing.T) {
	var c *redis.Client
	var cc *redis.ClusterClient
	for _, client := range []redis.UniversalClient{c, cc} {
		s, err := redisstore.New(context.Background(), redisstore.Config{Client: client,
			Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}})
		require.Nil(t, s)
		require.ErrorIs(t, err, engine.ErrInvalidConfig)
		require.ErrorContains(t, err, fmt.Sprintf("Config.Client is a nil %T", client))
		require.NotContains(t, err.Error(), "ContextTimeoutEnabled")
	}
}
