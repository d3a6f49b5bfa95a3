package grpclimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// TestKeyFuncContextEnded: a key function that fails because the call's
// own context ended (a tenant lookup made with the call's context when the
// client went away) is the call's context ending, codes.Canceled, not the
// server failing to derive a key (codes.Internal, ErrKeyFunc). A key
// function's own deadline passing while the call lives is still the latter.
func TestKeyFuncContextEnded(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	run := func(ctx context.Context, f func(ctx context.Context) error) (error, error) {
		var got error
		l := newLimiter(t, e,
			grpclimit.WithKey(func(ctx context.Context, _, _ string) (string, error) { return "k", f(ctx) }),
			grpclimit.WithOnError(func(_ context.Context, _ string, err error) { got = err }))
		ran, err := call(ctx, l, checkMethod)
		require.False(t, ran)
		return err, got
	}

	ctx, cancel := context.WithCancel(from("192.0.2.1:1"))
	cancel()
	err, got := run(ctx, func(ctx context.Context) error { return fmt.Errorf("lookup: %w", ctx.Err()) })
	assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	assert.ErrorIs(t, got, context.Canceled)
	assert.NotErrorIs(t, got, grpclimit.ErrKeyFunc)
	// A lookup over gRPC under the call's context gets a status, which
	// wraps no context error: the same.
	err, got = run(ctx, func(ctx context.Context) error { return status.FromContextError(ctx.Err()).Err() })
	assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	assert.NotErrorIs(t, got, grpclimit.ErrKeyFunc)

	// A call whose deadline has passed: its own ending, as a status, is
	// DeadlineExceeded; a key function's own Canceled status is not that
	// ending, and passes through as the key function's refusal.
	past, stop := context.WithDeadline(from("192.0.2.1:1"), time.Unix(0, 0))
	defer stop()
	err, got = run(past, func(ctx context.Context) error { return status.FromContextError(ctx.Err()).Err() })
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.NotErrorIs(t, got, grpclimit.ErrKeyFunc)
	err, got = run(past, func(context.Context) error { return status.Error(codes.Canceled, "upstream") })
	assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	assert.ErrorIs(t, got, grpclimit.ErrKeyFunc)

	err, got = run(from("192.0.2.1:1"), func(context.Context) error { return context.DeadlineExceeded })
	assert.Equal(t, codes.Internal, status.Code(err), "the lookup's own deadline, the call alive: %v", err)
	assert.ErrorIs(t, got, grpclimit.ErrKeyFunc)
	err, got = run(from("192.0.2.1:1"), func(context.Context) error { return status.Error(codes.Canceled, "upstream") })
	assert.Equal(t, codes.Canceled, status.Code(err), "a key function's own status, the call alive, passes through: %v", err)
	assert.ErrorIs(t, got, grpclimit.ErrKeyFunc)
}
