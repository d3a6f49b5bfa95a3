package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// A Charge that Redis refuses for want of memory is answered
// ErrKeyCapacity, whatever its size: a charge may pass the capacity, so it
// is never ErrCostExceedsCapacity (an Allow of that cost would be).
func TestChargeOutOfMemoryAboveCapacity(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clock.NewManual(0))
	_, err := s.Charge(ctx, "k", 1) // the script loaded, the bucket written
	require.NoError(t, err)
	outOfMemory(t, c)

	_, err = s.Charge(ctx, "k", 10)
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	require.NotErrorIs(t, err, engine.ErrCostExceedsCapacity)
	_, err = s.Allow(ctx, "k", 10)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "checked before the key bound")
}

// A Refund that Redis refuses for want of memory is answered
// ErrKeyCapacity, counted so, and credits nothing: Redis answered, so it is
// not an error wrapping ErrUnavailable, as when Redis cannot answer.
func TestRefundOutOfMemory(t *testing.T) {
	exactBalances(t)
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clock.NewManual(0))
	_, err := s.Allow(ctx, "k", 2)
	require.NoError(t, err)
	outOfMemory(t, c)

	_, err = s.Refund(ctx, "k", 1)
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	require.NotErrorIs(t, err, redisstore.ErrUnavailable)
	require.Equal(t, engine.Errors{KeyCapacity: 1}, s.Stats().Errors)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	d, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Remaining, "nothing credited")
}

// outOfMemory has the private server c refuse every write for want of
// memory (maxmemory 1, noeviction) until the test ends.
func outOfMemory(t *testing.T, c *redis.Client) {
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { c.ConfigSet(ctx, "maxmemory", "0") })
}
