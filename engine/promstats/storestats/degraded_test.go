package storestats_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats/storestats"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

// TestCollectDegradedClosed: with Redis down and the store failing closed,
// each request answered by the failure rule is one decisions_total
// degraded_denied (Allow, each request of an AllowAll and of an AllowBatch),
// a Charge is degraded_allowed (never refused), the AllowAll call is
// refused, and a Peek is an error of kind other.
func TestCollectDegradedClosed(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: rdb, Prefix: freshPrefix(t), Policy: pol(1, 2, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	c, err := storestats.New(s)
	require.NoError(t, err)
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, !d.Allowed && d.Degraded)
	d, _, err = s.AllowAll(ctx, []engine.Request{{Key: "{a}1", Cost: 1}, {Key: "{a}2", Cost: 1}, {Key: "{a}3", Cost: 1}})
	require.NoError(t, err)
	require.True(t, !d.Allowed && d.Degraded, "%+v", d)
	d, err = s.Charge(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, d.Allowed && d.Degraded, "%+v", d)
	out := make([]engine.Result, 2)
	require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "x", Cost: 1}, {Key: "y", Cost: 1}}, out))
	_, err = s.Peek(ctx, "k")
	require.Error(t, err)
	t.Logf("%+v", s.Stats())
	want := fromStats(redisstore.Stats{})
	want[`tokenshard_decisions_total{outcome="degraded_denied"}`] = 1 + 3 + 2
	want[`tokenshard_decisions_total{outcome="degraded_allowed"}`] = 1
	want[`tokenshard_allowall_calls_total{outcome="refused"}`] = 1
	want[`tokenshard_errors_total{kind="other"}`] = 1
	check(t, scrape(t, c), want)
}
