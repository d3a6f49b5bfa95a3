package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestChargeExpiryCoversDebt: with the server's TIME, a bucket left in
// debt by a charge expires no earlier than the instant it has repaid its
// debt and refilled to full, on both bucket formats; EvictFull keeps it.
func TestChargeExpiryCoversDebt(t *testing.T) {
	c := client(t, redisAddr(t))
	ctx := context.Background()
	for _, l := range []policy.Limit{
		{Capacity: 10, TokensPerSecond: 2},
		{Capacity: 1, TokensPerSecond: 3},
		{Capacity: 1000, TokensPerSecond: 1_000_000},
		{Capacity: 1 << 40, TokensPerSecond: 7},
		{Capacity: 1 << 53, TokensPerSecond: 1 << 20}, // the general path
		{Capacity: math.MaxInt64, TokensPerSecond: math.MaxInt64},
	} {
		p := prefix(t)
		s := realStores(t, redisAddr(t), 1, redisstore.Config{Client: c, Prefix: p,
			Policy: policy.Policy{Version: 1, Capacity: l.Capacity, TokensPerSecond: l.TokensPerSecond}})[0]
		for _, tokens := range []int64{1, max(1, l.Capacity/2), l.Capacity, l.Capacity + min(max(1, l.Capacity/2), math.MaxInt64-l.Capacity), math.MaxInt64} {
			key := fmt.Sprint("k", tokens)
			allowed := s.Stats().Allowed
			d, err := s.Charge(ctx, key, tokens)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			st := s.Stats()
			require.Equal(t, allowed+1, st.Allowed, "a charge counts as allowed")
			require.Equal(t, st.Allowed+st.Denied, st.Decisions, "and as a decision Redis made")
			require.GreaterOrEqual(t, d.Remaining, -l.Capacity, "%+v: the floor", l)
			if tokens > l.Capacity && l.TokensPerSecond < 1e6 {
				require.Negative(t, d.Remaining, "%+v, charged %d: in debt", l, tokens)
			}
			b := readBucket(t, c, redisstore.BucketKey(p, key))
			b.checkExpiry(t, fmt.Sprintf("%+v charged %d", l, tokens))
			// Still in debt, and for long: a key of capacity 1 at 3 a second
			// repays and refills within 0.67 s, which a loaded machine's
			// EvictFull (a SCAN of the shared server) can take.
			if b.units != nil && b.units.Sign() < 0 && l.TokensPerSecond < 1e6 && l.Capacity >= l.TokensPerSecond {
				_, err := s.EvictFull(ctx)
				require.NoError(t, err)
				n, err := c.Exists(ctx, redisstore.BucketKey(p, key)).Result()
				require.NoError(t, err)
				require.Equal(t, int64(1), n, "%+v charged %d: a bucket in debt evicted", l, tokens)
			}
		}
	}
}

// TestChargeFailure: a charge Redis cannot answer is not an error: it is
// answered allowed (a charge is never denied), with nothing Remaining,
// marked Degraded, under either failure rule; OnError is told and Stats
// counts it as a degraded admission, and only as that.
func TestChargeFailure(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	for _, failOpen := range []bool{true, false} {
		srv := startPrivate(t)
		var told atomic.Int64
		pol := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
		s := realStores(t, srv.Addr(), 1, redisstore.Config{Policy: pol, FailOpen: failOpen, Timeout: slowMachine,
			OnError: func(error) { told.Add(1) }})[0]
		d, err := s.Charge(context.Background(), "k", 12)
		require.NoError(t, err)
		require.Equal(t, engine.Decision{Allowed: true, Remaining: -2, Version: 1, Limit: 10, ResetAfter: 12 * time.Second}, d)
		srv.Kill()
		before := s.Stats()
		d, err = s.Charge(context.Background(), "k", 3)
		require.NoError(t, err)
		require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 10, Degraded: true}, d, "failOpen=%t", failOpen)
		require.Positive(t, told.Load(), "OnError not told")
		after := s.Stats()
		require.Equal(t, before.Failures+1, after.Failures)
		require.Equal(t, before.DegradedAllowed+1, after.DegradedAllowed)
		require.Equal(t, before.Allowed, after.Allowed, "counted once, as a failure")
		_, err = s.Charge(context.Background(), "k", 0)
		require.ErrorIs(t, err, engine.ErrInvalidCost, "checked before Redis")
		require.Equal(t, after.Errors.InvalidCost+1, s.Stats().Errors.InvalidCost)
	}
}
