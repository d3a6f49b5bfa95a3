package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseCanceledCallerGivesBack: a caller whose context is canceled
// while it gives a lease back (a Charge's, or every lease at its
// ReplacePolicy) must not make the process give those tokens up: they are
// the process's, not the caller's, and go back exactly. The clock stands
// still, so after Close the bucket holds every token not admitted.
func TestLeaseCanceledCallerGivesBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, a *redisstore.Store) error
	}{
		{"Charge", func(ctx context.Context, a *redisstore.Store) error {
			_, err := a.Charge(ctx, "k", 5)
			return err
		}},
		{"ReplacePolicy", func(ctx context.Context, a *redisstore.Store) error {
			return a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1000, TokensPerSecond: 1}, 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(0)
			p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
			a, b := leasedBeside(t, p, clk)
			held := holding(t, a, b, "k", 100)
			require.Positive(t, held)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var armed atomic.Bool
			armed.Store(true)
			redisstore.SetCombineHook(a, func(point string) {
				if point == redisstore.HookGiveBack && armed.CompareAndSwap(true, false) {
					cancel() // the caller goes away while the lease is on its way back
				}
			})
			err := tc.call(ctx, a)
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, armed.Load(), "no give-back")
			require.NoError(t, a.Close())
			st := a.Stats()
			require.Zero(t, st.ForfeitedTokens, "a canceled caller made the process give its lease up: %+v", st)
			pk, err := b.Peek(context.Background(), "k")
			require.NoError(t, err)
			require.Equal(t, p.Capacity-int64(st.Allowed), pk.Remaining, "%+v", st)
		})
	}
}
