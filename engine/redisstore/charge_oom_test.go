package redisstore_test

import (
	"context"
	"testing"

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
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	defer c.ConfigSet(ctx, "maxmemory", "0")

	_, err = s.Charge(ctx, "k", 10)
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	require.NotErrorIs(t, err, engine.ErrCostExceedsCapacity)
	_, err = s.Allow(ctx, "k", 10)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "checked before the key bound")
}
