package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// A lease asked for under one version and granted under a newer one, whose
// limit another process lowered, goes back, though the key's lease has met
// the newer version meanwhile: it was sized under the old bound, and a
// lease holds at most the key's capacity/Divisor (package doc, Leases).
// Here a's call asks for 600 tokens under v1 (capacity 16,000: 1,000 a
// lease) and is held on its way; a's next calls meet v2 (capacity 1,500:
// 93 a lease), the key's among them, before Redis grants it under v2.
func TestLeaseGrantSizedUnderAnOlderVersionGoesBack(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 16_000, TokensPerSecond: 1}
	pfx := prefix(t)
	c := client(t, redisAddr(t))
	h := holdNextCall(c)
	lz := &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour}
	a := newStore(t, redisstore.Config{Client: c, Policy: p, Prefix: pfx, Leases: lz}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	t.Cleanup(func() { close(h.release) }) // before a's Close, which its cleanup runs
	ctx := context.Background()
	d, err := a.Allow(ctx, "k", 600) // the key's demand: 600
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1500, TokensPerSecond: 1}, 1))
	h.armed.Store(true)
	done := make(chan engine.Decision, 1)
	go func() {
		d, err := a.Allow(ctx, "k", 600) // asks for a lease of 600 with it, under v1: held
		if err != nil {
			t.Error(err)
		}
		done <- d
	}()
	<-h.blocked
	_, err = a.Allow(ctx, "other", 1) // meets v2
	require.NoError(t, err)
	_, err = a.Allow(ctx, "k", 1) // the key's lease meets v2
	require.NoError(t, err)
	h.release <- struct{}{}
	require.True(t, (<-done).Allowed)
	held := peek(t, a, "k").Remaining - peek(t, b, "k").Remaining // a's Peek takes its shard past Redis's answer
	require.Equal(t, uint64(600), a.Stats().LeasedTokens, "no lease was granted")
	require.LessOrEqual(t, held, int64(1500/16), "a holds a lease sized under v1: %+v", a.Stats())
}
