package redisstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
)

// A Peek that meets another store's cutover, while this store holds a
// lease taken under the version it replaced, admits nothing and mints
// nothing: the lease ends there, and goes back under the new limit, or is
// given up when the cutover raised the capacity; from then on the stores
// admit exactly what the bucket held after the cutover, plus what went
// back. The clock stands still, so nothing refills.
func TestLeasePeekMeetsCutover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int64 // version 2's
		givenUp  bool  // the lease, taken under a smaller capacity, could top the key up
	}{
		{"raised", 2000, true},
		{"same", 1000, false},
		{"lowered", 500, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(0)
			p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
			a, b := leasedBeside(t, p, clk)
			ctx := context.Background()
			held := holding(t, a, b, "k", 100)
			require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: tc.capacity, TokensPerSecond: 1}, 1))
			bucket := peek(t, b, "k").Remaining // under version 2, without a's lease

			// The lease ends where the Peek meets version 2: it counts no
			// more, since the next request gives it back, or up, first.
			d := peek(t, a, "k")
			require.Equal(t, int64(2), d.Version)
			require.Equal(t, bucket, d.Remaining, "a's Peek counted the lease the cutover ended (%d tokens)", held)

			back := int64(0)
			if !tc.givenUp {
				back = held
			}
			var admitted int64
			for range 2 * tc.capacity {
				d, err := a.Allow(ctx, "k", 1)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
			}
			leaseLanded(t, a, b, "k")
			require.NoError(t, a.Close())
			st := a.Stats()
			left := peek(t, b, "k").Remaining
			want := min(bucket+back, tc.capacity) // a give-back is capped at capacity
			require.Equal(t, want, admitted+left, "admitted %d, left %d: %+v", admitted, left, st)
			if tc.givenUp {
				require.Equal(t, uint64(held), st.ForfeitedTokens, "%+v", st)
			} else {
				require.Zero(t, st.ForfeitedTokens, "%+v", st)
			}
		})
	}
}

// A Refund that meets another store's cutover answers, as a Peek does,
// without the lease taken under the version it replaced: the lease ends
// there, and with the capacity raised it is given up, so counting it would
// report tokens no request can take.
func TestLeaseRefundMeetsCutover(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	a, b := leasedBeside(t, p, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 100)
	require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 2000, TokensPerSecond: 1}, 1))
	d, err := a.Refund(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	require.Equal(t, peek(t, b, "k").Remaining, d.Remaining, "a's Refund counted the lease the cutover ended (%d tokens)", held)
	require.NoError(t, a.Close())
	require.Equal(t, uint64(held), a.Stats().ForfeitedTokens, "%+v", a.Stats())
}
