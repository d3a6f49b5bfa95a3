package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// A request the lease cannot cover takes what the lease holds and asks
// Redis for the rest; denied, it leaves those tokens to the lease, and its
// Remaining counts them besides the bucket's own: what a request of one
// token would still find in the process, as a Peek's does.
func TestLeaseDenialRemainingCountsHeldTokens(t *testing.T) {
	clk := clock.NewManual(0)
	a, b := leasedBeside(t, policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}, clk)
	holding(t, a, b, "k", 100)
	ctx := context.Background()
	// Empty the bucket, the lease untouched. A top-up still on its way when
	// holding returned (see leaseLanded) may take tokens meanwhile: then b
	// is denied, and reads the bucket again.
	for rest := peek(t, b, "k").Remaining; rest > 0; rest = peek(t, b, "k").Remaining {
		_, err := b.Allow(ctx, "k", rest)
		require.NoError(t, err)
	}
	// A request of the whole capacity: more than any lease holds, so the
	// lease's tokens and Redis's empty bucket cannot cover it. What the
	// lease holds is what a reads beyond b; a top-up that left Redis before
	// the bucket emptied may still land and add to it: read it before and
	// after, each once it has landed, and use a reading the two agree on.
	// Each try asks another cost: a process keeps a denial it met for its
	// cost (see Leases), and would answer the same request again without
	// Redis, by another path than the one under test.
	for try := 0; ; try++ {
		leaseLanded(t, a, b, "k")
		held := peek(t, a, "k").Remaining - peek(t, b, "k").Remaining
		require.Positive(t, held)
		local := a.Stats().Local
		d, err := a.Allow(ctx, "k", int64(1000-try))
		require.NoError(t, err)
		require.Equal(t, local, a.Stats().Local, "decided by Redis, not from a kept denial")
		require.False(t, d.Allowed)
		require.False(t, d.Degraded)
		leaseLanded(t, a, b, "k")
		if after := peek(t, a, "k").Remaining - peek(t, b, "k").Remaining; after != held {
			require.Less(t, try, 10, "a's lease on k kept changing: %d, then %d", held, after)
			continue
		}
		require.Equal(t, held, d.Remaining, "the bucket's 0 and the lease's %d", held)
		// A Peek counts them too, and so admits a request of one token now.
		require.Zero(t, peek(t, b, "k").Remaining)
		require.Equal(t, engine.Decision{Allowed: true, Remaining: held, Limit: 1000, Version: 1, ResetAfter: 1000 * time.Second}, peek(t, a, "k"))
		return
	}
}
