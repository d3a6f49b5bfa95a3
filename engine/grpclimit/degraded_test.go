package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
)

// degradedAdmitter answers every Allow with d, as a store's failure rule
// would; the embedded Admitter (nil) is never called.
type degradedAdmitter struct {
	engine.Admitter
	d engine.Decision
}

func (a degradedAdmitter) Allow(context.Context, string, int64) (engine.Decision, error) {
	return a.d, nil
}

// TestServerDegraded: over a real connection, a denial by a store's failure
// rule is Unavailable (the server's outage, not ResourceExhausted), with
// RetryInfo and pushback saying its RetryAfter in milliseconds, for a call
// and for a stream; a degraded admission runs the handler. The same denial without Degraded is ResourceExhausted, so the
// code comes from Degraded alone.
func TestServerDegraded(t *testing.T) {
	ctx := t.Context()
	closed := degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: 1500 * time.Millisecond, Version: 1, Limit: 5}}
	conn := serve(t, newLimiter(t, closed), nil)
	var md metadata.MD
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "cannot reach its store")
	delay, ok := retryDelay(t, err)
	require.True(t, ok, "RetryInfo detail")
	require.Equal(t, int64(1500), delay)
	require.Equal(t, []string{"1500"}, pushback(md))

	// a stream decided when it starts
	stream, err := testgrpc.NewTestServiceClient(conn).FullDuplexCall(ctx)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	open := degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 5}}
	conn = serve(t, newLimiter(t, open), nil)
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
	require.NoError(t, err)
	require.Empty(t, pushback(md))

	limited := degradedAdmitter{d: engine.Decision{RetryAfter: 1500 * time.Millisecond, Version: 1, Limit: 5}}
	conn = serve(t, newLimiter(t, limited), nil)
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}
