package redisstore_test

import (
	"context"
	"runtime"
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

// TestLeaseKeepsWhatAFailOpenAnswerHeld: a request its lease cannot cover
// takes what the lease holds and asks Redis for the rest; if Redis cannot
// answer and the failure rule admits it (fail open, Degraded), the bucket
// took nothing, so the tokens held stay the process's: "with Redis
// unreachable, a process spends what it holds, then answers by the failure
// rule" (the package doc's Leases).
func TestLeaseKeepsWhatAFailOpenAnswerHeld(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
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
	// More than any lease of k holds (a top-up still on its way when held
	// was read may land since): takes the lease's tokens, and Redis fails.
	d, err := a.Allow(ctx, "k", p.Capacity/redisstore.DefaultLeaseDivisor+1)
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

// TestLeaseKeepsNoDenialOfAnOlderVersion: a denial Redis gave under a
// version the key's lease no longer holds says nothing of the version in
// force, so the process does not keep it. Here a request is denied under
// v1 and, before its answer reaches the lease, the process meets a
// cutover to a faster refill and another request renews the lease under
// it: once the bucket has refilled the cost under v2, the same cost is
// admitted, where v1's kept denial would still deny it for seconds.
func TestLeaseKeepsNoDenialOfAnOlderVersion(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	a, _ := leasedBeside(t, p, clk)
	ctx := context.Background()
	d, err := a.Allow(ctx, "k", 100) // empties the bucket
	require.NoError(t, err)
	require.True(t, d.Allowed)
	release := make(chan struct{})
	hookErr := make(chan error, 1)
	var once sync.Once
	redisstore.SetCombineHook(a, func(point string) {
		switch point {
		case redisstore.HookAlone:
			<-release
		case redisstore.HookSent: // the request on "k" is decided under v1, not yet answered
			once.Do(func() {
				for _, f := redisstore.Queued(a, "k"); f > 1; _, f = redisstore.Queued(a, "k") {
					runtime.Gosched() // the renewing request below goes alone
				}
				err := a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1000}, 1)
				if err == nil {
					_, err = a.Allow(ctx, "k", 1) // renews the key's lease under v2
				}
				hookErr <- err
			})
		}
	})
	errs := make(chan error, 2)
	for _, key := range []string{"x", "y"} { // two calls in flight: the next request queues
		go func() { _, err := a.Allow(ctx, key, 1); errs <- err }()
	}
	for q, f := redisstore.Queued(a, "k"); q != 0 || f != 2; q, f = redisstore.Queued(a, "k") {
		runtime.Gosched()
	}
	denied := make(chan engine.Decision, 1)
	go func() {
		d, err := a.Allow(ctx, "k", 5)
		errs <- err
		denied <- d
	}()
	for q, _ := redisstore.Queued(a, "k"); q != 1; q, _ = redisstore.Queued(a, "k") {
		runtime.Gosched()
	}
	close(release)
	for range 3 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, <-hookErr)
	d = <-denied
	require.False(t, d.Allowed)
	require.Equal(t, 5*time.Second, d.RetryAfter, "denied under v1")
	clk.Advance(10 * time.Millisecond) // 10 tokens under v2
	d, err = a.Allow(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, d.Allowed, "v1's denial was kept under v2: %+v", d)
	require.Equal(t, int64(2), d.Version)
}

// heldAcrossCutover readies the version tests below: a, a store with
// leases, holds held tokens of k's lease under version 1, with k's bucket
// emptied by b, a store without leases, which then cuts over to version 2
// at capacity cost-1, where cost is more than any lease of k holds. With
// learned, a has first met the empty bucket, and asks no lease beside its
// next request for k.
func heldAcrossCutover(t *testing.T, learned bool) (a, b *redisstore.Store, held, cost int64) {
	t.Helper()
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	a, b = leasedBeside(t, p, clock.NewManual(0))
	ctx := context.Background()
	holding(t, a, b, "k", 100)
	drain(t, b, "k", -1) // a top-up on its way now finds nothing to take
	leaseLanded(t, a, b, "k")
	held = peek(t, a, "k").Remaining
	require.Positive(t, held)
	cost = p.Capacity/redisstore.DefaultLeaseDivisor + 1
	if learned {
		d, err := a.Allow(ctx, "k", cost+1) // denied by the empty bucket
		require.NoError(t, err)
		require.False(t, d.Allowed)
	}
	require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: cost - 1, TokensPerSecond: 1}, 1))
	return a, b, held, cost
}

// TestLeaseHeldTokensStayUnderTheirVersion: a request its lease cannot
// cover takes what the lease holds and asks Redis for the rest. When
// another process has lowered the limit meanwhile, Redis must not decide
// that rest under the new version: the request would be admitted with
// the old version's tokens, at a cost above the capacity in force, which
// the engine and a store without leases refuse. The request is asked
// again once the lease has ended, and the lease's tokens are not lost on
// the way: the bucket, emptied before the cutover, holds them after it.
// Twice: with a lease asked for in the same call (the process has not
// seen the bucket emptied), and alone (it has).
func TestLeaseHeldTokensStayUnderTheirVersion(t *testing.T) {
	for _, alone := range []bool{false, true} {
		t.Run(map[bool]string{false: "with a lease asked", true: "alone"}[alone], func(t *testing.T) {
			a, b, held, cost := heldAcrossCutover(t, alone)
			ctx := context.Background()
			returned := a.Stats().ReturnedTokens
			d, err := a.Allow(ctx, "k", cost) // its rest, cost - held, fits in the new capacity
			require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "cost %d, the lease holding %d: %+v", cost, held, d)
			require.Equal(t, uint64(held), a.Stats().ReturnedTokens-returned, "the lease went back whole")
			require.Equal(t, held, peek(t, b, "k").Remaining, "the bucket holds the lease's tokens, and not one more")
			d, err = a.Allow(ctx, "k", held)
			require.NoError(t, err)
			require.True(t, d.Allowed, "%+v", d)
			require.Equal(t, int64(2), d.Version)
			d, err = a.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.False(t, d.Allowed, "%+v", d)
			require.LessOrEqual(t, d.Remaining, d.Limit)
		})
	}
}

// TestLeaseHeldTokensStayUnderTheirVersionCombined: the same, for a
// request that waits in the combiner behind two calls in flight and goes
// with a drainer's call: the version it may be decided under goes with it.
func TestLeaseHeldTokensStayUnderTheirVersionCombined(t *testing.T) {
	// a has met the empty bucket: the request below asks for no lease
	// beside it, and goes through the combiner.
	a, b, held, cost := heldAcrossCutover(t, true)
	ctx := context.Background()

	release := make(chan struct{})
	redisstore.SetCombineHook(a, func(point string) {
		if point == redisstore.HookAlone {
			<-release
		}
	})
	errs := make(chan error, 2)
	for _, key := range []string{"x", "y"} { // new keys: Redis decides them, each in a call of its own
		go func() { _, err := a.Allow(ctx, key, 1); errs <- err }()
	}
	for q, f := redisstore.Queued(a, "k"); q != 0 || f != 2; q, f = redisstore.Queued(a, "k") {
		runtime.Gosched() // polling the combiner until both calls are in flight
	}
	type answer struct {
		d   engine.Decision
		err error
	}
	answered := make(chan answer, 1)
	go func() { d, err := a.Allow(ctx, "k", cost); answered <- answer{d, err} }()
	for q, _ := redisstore.Queued(a, "k"); q != 1; q, _ = redisstore.Queued(a, "k") {
		runtime.Gosched()
	}
	close(release)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	got := <-answered
	redisstore.SetCombineHook(a, nil)
	require.ErrorIs(t, got.err, engine.ErrCostExceedsCapacity, "cost %d, the lease holding %d: %+v", cost, held, got.d)
	require.Equal(t, held, peek(t, b, "k").Remaining, "the bucket holds the lease's tokens, and not one more")
}
