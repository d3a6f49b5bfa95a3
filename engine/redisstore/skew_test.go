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
