package grpclimit_test

import (
	"context"
	"errors"
	"io"
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
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/policy"
)

// degradedAdmitter answers every Allow with d, as a store's failure rule
// would, under a policy of 5 tokens at 1 a second (so a Limiter that wrongly
// wrote RateLimit fields for a degraded answer fails an assertion rather
// than crashing the test binary); the embedded Admitter (nil) is never
// called.
type degradedAdmitter struct {
	engine.Admitter
	d engine.Decision
}

func (a degradedAdmitter) Allow(context.Context, string, int64) (engine.Decision, error) {
	return a.d, nil
}

func (degradedAdmitter) Policy() policy.Policy { return pol(5, 1) }

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

// TestServerDegradedInsideEnforcing: a degraded denial by a Limiter
// chained inside another that admitted the call carries no RateLimit
// fields, the outer one's included, as httplimit removes an outer
// middleware's: they describe a quota that did not answer. For a call and
// for a stream; the pushback stays.
func TestServerDegradedInsideEnforcing(t *testing.T) {
	ctx := t.Context()
	e, _ := newEngine(t, engine.Config{Policy: pol(4, 1)})
	outer := newLimiter(t, e, grpclimit.WithHeaders())
	inner := newLimiter(t, degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: 1500 * time.Millisecond, Version: 1, Limit: 5}},
		grpclimit.WithHeaders())
	conn := serveWith(t, []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(outer.Unary, inner.Unary),
		grpc.ChainStreamInterceptor(outer.Stream, inner.Stream),
	}, testService{})

	var header, trailer metadata.MD
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Empty(t, rateLimit(header))
	require.Empty(t, rateLimit(trailer))
	require.Equal(t, []string{"1500"}, pushback(trailer))

	stream, err := testgrpc.NewTestServiceClient(conn).FullDuplexCall(ctx)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	header, err = stream.Header()
	require.NoError(t, err)
	require.Empty(t, rateLimit(header))
	require.Empty(t, rateLimit(stream.Trailer()))
	require.Equal(t, []string{"1500"}, pushback(stream.Trailer()))
}

// TestPerMessageRefusalInsideEnforcing: a WithPerMessage Limiter chained
// inside an enforcing one that admitted the stream, each with WithHeaders,
// answers a refused message with its own fields only, and an error (its key
// function fails) with none: the outer Limiter's held fields are dropped,
// as httplimit's middleware replaces or removes an outer middleware's, since
// they describe a quota that did not refuse. The refusal stays
// trailers-only, with its pushback.
func TestPerMessageRefusalInsideEnforcing(t *testing.T) {
	ctx := t.Context()
	outerEngine, _ := newEngine(t, engine.Config{Policy: pol(4, 1)})
	outer := newLimiter(t, outerEngine, grpclimit.WithHeaders(), grpclimit.WithPolicyName("api"))

	innerEngine, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	inner := newLimiter(t, innerEngine, grpclimit.WithHeaders(), grpclimit.WithPolicyName("messages"), grpclimit.WithPerMessage())
	conn := serveWith(t, []grpc.ServerOption{grpc.ChainStreamInterceptor(outer.Stream, inner.Stream)}, testService{})
	cs, err := testgrpc.NewTestServiceClient(conn).StreamingInputCall(ctx)
	require.NoError(t, err)
	for range 2 { // the first message is admitted, the second refused
		if err := cs.Send(&testgrpc.StreamingInputCallRequest{}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	_, err = cs.CloseAndRecv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	header, err := cs.Header()
	require.NoError(t, err)
	require.Empty(t, rateLimit(header), "trailers-only")
	require.Equal(t, []string{`"messages";q=1;w=1`, `"messages";r=0;t=1`}, rateLimit(cs.Trailer()), "the refusing Limiter's fields alone")
	require.Equal(t, []string{"1000"}, pushback(cs.Trailer()))

	failing := newLimiter(t, innerEngine, grpclimit.WithHeaders(), grpclimit.WithPerMessage(),
		grpclimit.WithKey(func(context.Context, string, string) (string, error) { return "", errors.New("no tenant") }))
	conn = serveWith(t, []grpc.ServerOption{grpc.ChainStreamInterceptor(outer.Stream, failing.Stream)}, testService{})
	cs, err = testgrpc.NewTestServiceClient(conn).StreamingInputCall(ctx)
	require.NoError(t, err)
	_, err = cs.CloseAndRecv()
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	header, err = cs.Header()
	require.NoError(t, err)
	require.Empty(t, rateLimit(header), "an error carries no fields")
	require.Empty(t, rateLimit(cs.Trailer()), "an error carries no fields, the outer Limiter's included")
}
