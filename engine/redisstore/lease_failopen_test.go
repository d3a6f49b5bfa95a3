package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseFailOpenGrantsNothing: with Redis gone and the store failing
// open, the failure rule admits the requests it answers, marked Degraded,
// and a lease asked for meanwhile (with a request, or as a top-up) is
// "admitted" by the same rule; but no bucket gave those tokens, so they
// must not become a lease the process spends as its own. Every answer not
// marked Degraded is a token taken from the bucket: the clock stands still,
// so those answers together never pass the capacity.
func TestLeaseFailOpenGrantsNothing(t *testing.T) {
	srv := startPrivate(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	// Each call to the dead server fails at its one dial, at once. A pool
	// larger than the dials that fail keeps go-redis from starting its
	// background redial loop, which outlives a short test by a second.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1, PoolSize: 1 << 16})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, redisstore.Config{Client: c, Policy: p, Leases: &redisstore.Leases{}, FailOpen: true,
		Timeout: 200 * time.Millisecond}, clk)
	ctx := context.Background()
	admitted := warm(t, s, "k") // admitted by the bucket, directly or by a lease
	srv.Kill()
	var local, degraded int64
	for range 5000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed, "fail open")
		if d.Degraded {
			degraded++
		} else {
			local++
		}
	}
	require.Positive(t, degraded, "the lease never ran out")
	require.LessOrEqual(t, admitted+local, p.Capacity,
		"answers not marked Degraded past what the bucket gave: %d before Redis went, %d after (stats %+v)", admitted, local, s.Stats())
}
