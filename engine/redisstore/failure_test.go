package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestFailureCostAboveCapacity: a cost above the key's capacity can never be
// admitted (ErrCostExceedsCapacity, which matches ErrInvalidCost, never a
// finite retry). The store knows the capacity without Redis, so an outage
// does not change that answer into a fail-open admission or a fail-closed
// RetryAfter (found in review).
func TestFailureCostAboveCapacity(t *testing.T) {
	for _, failOpen := range []bool{true, false} {
		srv := startPrivate(t)
		s := realStores(t, srv.Addr(), 1, redisstore.Config{
			Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, FailOpen: failOpen, Timeout: 200 * time.Millisecond,
		})[0]
		_, err := s.Allow(context.Background(), "k", 11)
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
		srv.Kill()
		d, err := s.Allow(context.Background(), "k", 11)
		t.Logf("failOpen=%t, Redis down, cost 11 > capacity 10: %+v, %v", failOpen, d, err)
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	}
}

// TestHungRedis: a Redis that stops answering (CLIENT PAUSE) rather than
// refusing connections: every call returns by its deadline.
func TestHungRedis(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	const timeout = 200 * time.Millisecond
	s := realStores(t, srv.Addr(), 1, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: timeout})[0]
	ctx := context.Background()
	_, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.NoError(t, c.Do(context.Background(), "CLIENT", "PAUSE", "3000", "ALL").Err())
	for _, call := range []struct {
		name string
		f    func() error
	}{
		{"Allow", func() error { _, err := s.Allow(ctx, "k", 1); return err }},
		{"EvictFull", func() error { _, err := s.EvictFull(ctx); return err }},
		{"ReplacePolicy", func() error {
			return s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 30, TokensPerSecond: 1}, 1)
		}},
		{"ReplacePolicy with a 100ms deadline", func() error {
			dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			return s.ReplacePolicy(dctx, policy.Policy{Version: 2, Capacity: 30, TokensPerSecond: 1}, 1)
		}},
	} {
		begin := time.Now()
		err := call.f()
		took := time.Since(begin)
		// Allow answers fail-closed; the others report the outage. Each
		// returns by its deadline, plus slack for a loaded machine (and the
		// lock release ReplacePolicy attempts on its way out).
		if call.name == "Allow" {
			require.NoError(t, err)
		} else {
			require.Error(t, err, call.name)
		}
		require.Less(t, took, 2*timeout+300*time.Millisecond, "%s took %v (%v)", call.name, took, err)
	}
}
