package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// lateCtx is a context whose deadline has passed but whose timer has not
// fired yet, so Err is still nil: the instant in which go-redis, which
// gives its connection the context's deadline, meets an i/o timeout.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestDeadlineMidPassIsTheContexts: a pass whose caller's deadline passes
// during an exchange returns the context's error (EvictFull's documented
// "the count so far with the context's error"; ReplacePolicy's the
// engine's), not ErrUnavailable, even when go-redis's connection deadline
// fires before the context's own timer; and nothing changes.
func TestDeadlineMidPassIsTheContexts(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	for _, addr := range []string{redisAddr(t), clusterAddr(t)} {
		s := realStores(t, addr, 1, redisstore.Config{Policy: p})[0]
		_, err := s.Allow(context.Background(), "k", 1)
		require.NoError(t, err)
		ctx := lateCtx{context.Background()}
		n, err := s.EvictFull(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded, "EvictFull")
		require.NotErrorIs(t, err, redisstore.ErrUnavailable, "EvictFull")
		require.Zero(t, n)
		err = s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1)
		require.ErrorIs(t, err, context.DeadlineExceeded, "ReplacePolicy")
		require.NotErrorIs(t, err, redisstore.ErrUnavailable, "ReplacePolicy")
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		require.NoError(t, s.ReplacePolicy(cctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1), "nothing was left held")
		cancel()
	}
}
