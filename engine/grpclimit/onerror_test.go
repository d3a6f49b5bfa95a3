package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// errorLog records what the function of WithOnError is given.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) record(_ context.Context, method string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if method != "/grpc.health.v1.Health/Check" {
		err = errors.New("wrong method " + method)
	}
	l.errs = append(l.errs, err)
}

// take returns the errors recorded so far and forgets them.
func (l *errorLog) take() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := l.errs
	l.errs = nil
	return errs
}

// TestServerOnError: over a real connection, the function of WithOnError is
// given every call answered with an error but a limit's, once, with the
// status the client got and the cause: a degraded denial, a closed engine,
// a full key table, a cost above capacity, a failing key function and a
// cost below 1. Admitted calls and a bucket's denial are not errors.
func TestServerOnError(t *testing.T) {
	ctx := t.Context()
	keyErr := errors.New("no tenant")
	keyStatus := status.Error(codes.Unauthenticated, "who is the tenant?")
	for _, tc := range []struct {
		name  string
		admit func(t *testing.T) engine.Admitter
		opts  []grpclimit.Option
		code  codes.Code
		cause error
	}{
		{"degraded denial", func(*testing.T) engine.Admitter {
			return degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 5}}
		}, nil, codes.Unavailable, grpclimit.ErrDegraded},
		{"closed engine", func(t *testing.T) engine.Admitter {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			require.NoError(t, e.Close())
			return e
		}, nil, codes.Unavailable, engine.ErrClosed},
		{"full key table", func(t *testing.T) engine.Admitter {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
			_, err := e.Allow(t.Context(), "someone else", 1)
			require.NoError(t, err)
			return e
		}, nil, codes.Unavailable, engine.ErrKeyCapacity},
		{"cost above capacity", func(t *testing.T) engine.Admitter {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			return e
		}, []grpclimit.Option{grpclimit.WithCost(func(context.Context, string) int64 { return 6 })}, codes.InvalidArgument, engine.ErrInvalidCost},
		{"key function", func(t *testing.T) engine.Admitter {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			return e
		}, []grpclimit.Option{grpclimit.WithKey(func(context.Context, string, string) (string, error) { return "", keyErr })}, codes.Internal, keyErr},
		{"key function's own status", func(t *testing.T) engine.Admitter {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			return e
		}, []grpclimit.Option{grpclimit.WithKey(func(context.Context, string, string) (string, error) {
			return "", fmt.Errorf("tenant lookup: %w", keyStatus)
		})}, codes.Unauthenticated, keyStatus},
		{"cost below 1", func(t *testing.T) engine.Admitter {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			return e
		}, []grpclimit.Option{grpclimit.WithCost(func(context.Context, string) int64 { return 0 })}, codes.Internal, grpclimit.ErrCostFunc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log errorLog
			conn := serve(t, newLimiter(t, tc.admit(t), append(tc.opts, grpclimit.WithOnError(log.record))...), nil)
			_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			errs := log.take()
			require.Len(t, errs, 1)
			require.Equal(t, tc.code, status.Code(errs[0]), "the status answered: %v", errs[0])
			require.Equal(t, status.Convert(err).Message(), status.Convert(errs[0]).Message())
			require.ErrorIs(t, errs[0], tc.cause)
			if tc.cause == keyErr || tc.cause == keyStatus {
				require.ErrorIs(t, errs[0], grpclimit.ErrKeyFunc)
			}
		})
	}

	t.Run("limits are not errors", func(t *testing.T) {
		var log errorLog
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
		conn := serve(t, newLimiter(t, e, grpclimit.WithOnError(log.record)), nil)
		hc := healthpb.NewHealthClient(conn)
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
		require.Equal(t, codes.ResourceExhausted, status.Code(err))
		require.Empty(t, log.take())
	})

	t.Run("no peer address", func(t *testing.T) {
		var log errorLog
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
		l := newLimiter(t, e, grpclimit.WithOnError(log.record))
		// A context without a peer, as a call over a Unix socket has no IP.
		_, err := l.Unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"},
			func(context.Context, any) (any, error) { return nil, nil })
		require.Equal(t, codes.Internal, status.Code(err))
		errs := log.take()
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], grpclimit.ErrNoPeerIP)
	})
}

// TestOnErrorNil: WithOnError(nil) is refused.
func TestOnErrorNil(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	_, err := grpclimit.New(e, grpclimit.WithOnError(nil))
	require.ErrorIs(t, err, grpclimit.ErrInvalidOption)
}
