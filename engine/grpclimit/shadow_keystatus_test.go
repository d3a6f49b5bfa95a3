package grpclimit_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// TestShadowKeyFuncOwnContextStatus: under WithShadow a call whose key
// function fails goes on to its handler and is counted in
// ShadowStats.Errors, whatever status the key function's error carries:
// a tenant lookup over gRPC that hit its own deadline (DeadlineExceeded)
// or was canceled upstream (Canceled), the call itself alive, is the key
// function failing, not the call's context ending, which alone is still
// answered.
func TestShadowKeyFuncOwnContextStatus(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	for _, c := range []codes.Code{codes.DeadlineExceeded, codes.Canceled} {
		var log errorLog
		l := newLimiter(t, e, grpclimit.WithShadow(), grpclimit.WithOnError(log.record),
			grpclimit.WithKey(func(context.Context, string, string) (string, error) {
				return "", status.Error(c, "tenant lookup")
			}))
		ran, err := call(from("192.0.2.1:1"), l, checkMethod)
		require.NoError(t, err, "%v", c)
		require.True(t, ran, "%v: the handler runs under WithShadow", c)
		require.Equal(t, grpclimit.ShadowStats{Errors: 1}, l.ShadowStats(), "%v", c)
		errs := log.take()
		require.Len(t, errs, 1, "%v", c)
		require.ErrorIs(t, errs[0], grpclimit.ErrKeyFunc, "%v", c)
		require.Equal(t, c, status.Code(errs[0]), "the status it would have been answered with")
	}

	// The call's own context ended: still answered, whatever the key
	// function said, and counted nowhere.
	l := newLimiter(t, e, grpclimit.WithShadow(), grpclimit.WithKey(func(context.Context, string, string) (string, error) {
		return "", status.Error(codes.DeadlineExceeded, "tenant lookup")
	}))
	ctx, cancel := context.WithCancel(from("192.0.2.1:1"))
	cancel()
	ran, err := call(ctx, l, checkMethod)
	require.False(t, ran)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.Equal(t, grpclimit.ShadowStats{}, l.ShadowStats())
}
