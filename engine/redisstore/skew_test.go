package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestCutoverInstantAheadOfServer: a cutover's instant is one server's
// TIME, and the server a bucket lives on may read earlier (a master whose
// clock is behind the one that committed, or a clock that stepped back
// since). Such an instant is in that server's future, and time that has
// not passed there refills nothing: the bucket is converted at the
// server's own reading, not refilled under the old limit up to the
// instant. Two stores on one prefix, each with its own Config.Clock, play
// the two clocks.
func TestCutoverInstantAheadOfServer(t *testing.T) {
	exactBalances(t)
	ctx := context.Background()
	c := client(t, redisAddr(t))
	p := prefix(t)
	pol := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	behind, ahead := clock.NewManual(int64(40*time.Second)), clock.NewManual(int64(100*time.Second))
	sb := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: pol}, behind)
	sa := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: pol}, ahead)

	d, err := sb.Allow(ctx, "k", 10) // drained at 40 s
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, sa.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}, 1)) // instant 100 s

	behind.Advance(time.Second)
	d, err = sb.Allow(ctx, "k", 1)
	require.NoError(t, err)
	// one second refilled since the drain, not the sixty up to the instant
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 10, ResetAfter: 10 * time.Second}, d)
	d, err = sb.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
}

// TestStampAheadOfServerCountsInWaits: a bucket last updated at an instant
// its server's TIME has not reached (written through a master whose clock
// is ahead, before a failover, or before the clock stepped back) refills
// nothing until TIME gets there, so a denial's RetryAfter and ResetAfter
// count that time too: without it Wait asks again and again, each time as
// early as the balance alone says, until the server's clock catches up.
// Both paths of the script, the compact bucket and the general one.
func TestStampAheadOfServerCountsInWaits(t *testing.T) {
	exactBalances(t)
	bands, err := policy.NewBands(policy.Band{Name: "hour", Capacity: 100, Refill: policy.Rate{Tokens: 100, Per: time.Hour}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		pol  policy.Policy
	}{
		{"compact", policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}},
		{"general", policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Bands: bands}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := client(t, redisAddr(t))
			p := prefix(t)
			behind, ahead := clock.NewManual(int64(40*time.Second)), clock.NewManual(int64(100*time.Second))
			sa := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: tc.pol}, ahead)
			sb := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: tc.pol}, behind)

			d, err := sa.Allow(ctx, "k", 10) // drained at 100 s
			require.NoError(t, err)
			require.True(t, d.Allowed)

			d, err = sb.Allow(ctx, "k", 1) // at 40 s: 60 s before the bucket refills at all
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, 61*time.Second, d.RetryAfter)
			require.Equal(t, 70*time.Second, d.ResetAfter)

			d, err = sb.Peek(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, 61*time.Second, d.RetryAfter)
			d, _, err = sb.AllowAll(ctx, []engine.Request{{Key: "k", Cost: 1}})
			require.NoError(t, err)
			require.Equal(t, 61*time.Second, d.RetryAfter)

			// Wait asks once more, when the token is there, not once a second.
			before := sb.Stats().Decisions
			done := make(chan error, 1)
			go func() {
				d, err := sb.Wait(ctx, "k", 1)
				if err == nil && !d.Allowed {
					err = fmt.Errorf("Wait returned a denial %+v", d)
				}
				done <- err
			}()
			for range 61 {
				require.Eventually(t, func() bool { return behind.Waiting() > 0 }, 5*time.Second, time.Millisecond)
				select {
				case err := <-done:
					require.NoError(t, err)
				default:
				}
				behind.Advance(time.Second)
			}
			require.NoError(t, <-done)
			require.Equal(t, before+2, sb.Stats().Decisions)
		})
	}
}
