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

// TestPastDeadlineBeforeTheCallIsTheContexts: a request whose context's
// deadline has passed before the call, its timer not yet fired (a server's
// request deadline, in the instant before Go's timer goroutine runs), never
// goes to Redis: Allow, AllowAll and Charge return context.DeadlineExceeded,
// as for a context already done, not a decision of the failure rule that
// says, falsely, that Redis could not be reached.
func TestPastDeadlineBeforeTheCallIsTheContexts(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	var reported []error
	s := realStores(t, redisAddr(t), 1, redisstore.Config{Policy: p, OnError: func(err error) { reported = append(reported, err) }})[0]
	_, err := s.Allow(context.Background(), "k", 1)
	require.NoError(t, err)
	ctx := lateCtx{context.Background()}

	d, err := s.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Allow: %+v", d)
	d, _, err = s.AllowAll(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}})
	require.ErrorIs(t, err, context.DeadlineExceeded, "AllowAll: %+v", d)
	d, err = s.Charge(ctx, "k", 1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Charge: %+v", d)

	require.Empty(t, reported, "Redis was never unreachable")
	st := s.Stats()
	require.Zero(t, st.Failures)
	got, err := s.Peek(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, int64(9), got.Remaining, "nothing was taken")
}
