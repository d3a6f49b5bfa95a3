package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseKeepsWhatAFailOpenAnswerHeld: a request its lease cannot cover
// takes what the lease holds and asks Redis for the rest; if Redis cannot
// answer and the failure rule admits it (fail open, Degraded), the bucket
// took nothing, so the tokens held stay the process's: "with Redis
// unreachable, a process spends what it holds, then answers by the failure
// rule" (the package doc's Leases).
func TestLeaseKeepsWhatAFailOpenAnswerHeld(t *testing.T) {
	srv := startPrivate(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	// As in TestLeaseFailOpenGrantsNothing: each call to the dead server
	// fails at its one dial, at once.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1, PoolSize: 1 << 16})
	t.Cleanup(func() { _ = c.Close() })
	pfx := prefix(t)
	lz := &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour} // no sweep gives the lease back
	a := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p, Leases: lz, FailOpen: true,
		Timeout: 200 * time.Millisecond}, clk)
	b := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Prefix: pfx, Policy: p}, clk)
	held := holding(t, a, b, "k", 100)
	require.Less(t, held, p.Capacity)
	srv.Kill()
	ctx := context.Background()
	d, err := a.Allow(ctx, "k", held+1) // takes the lease's tokens, and Redis fails
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.True(t, d.Degraded)
	local := a.Stats().Local
	for i := range held {
		d, err := a.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.False(t, d.Degraded, "token %d of the %d held was lost to a fail-open answer", i+1, held)
	}
	require.Equal(t, uint64(held), a.Stats().Local-local)
}

// TestLeaseHeldTokensBackAfterARenewal: a request takes what its lease
// holds to Redis; meanwhile the process meets a cutover that raises the
// capacity, and another request renews the key's lease under it. If Redis
// then denies the first request, its held tokens were taken under the old
// version: they go back (judged, here given up, see the package doc's
// Give-back), and are never spent under the new version, where the bucket
// was converted as it stood. The clock stands still: after the cutover the
// bucket is empty, so nothing more is admitted.
func TestLeaseHeldTokensBackAfterARenewal(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	a, b := leasedBeside(t, p, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 100)
	drain(t, b, "k", -1) // the bucket is empty; a's lease holds held
	var once sync.Once
	redisstore.SetCombineHook(a, func(point string) {
		if point != redisstore.HookAlone {
			return
		}
		once.Do(func() { // the first request is on its way to Redis, with the lease's tokens
			require.NoError(t, a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100_000, TokensPerSecond: 1}, 1))
			d, err := a.Allow(ctx, "k", 1) // renews the key's lease under v2
			require.NoError(t, err)
			require.False(t, d.Allowed)
		})
	})
	d, err := a.Allow(ctx, "k", p.Capacity-1) // more than the lease holds, and no room for a lease beside it
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, int64(2), d.Version)
	for i := range 2 * held {
		d, err := a.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, d.Allowed, "request %d after the cutover admitted: the lease spent v1's %d tokens under v2", i, held)
	}
}
