package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// pushback returns the grpc-retry-pushback-ms values of a trailer.
func pushback(md metadata.MD) []string { return md.Get(grpclimit.PushbackTrailer) }

// TestServerUnary: over a real connection, admitted calls succeed until the
// bucket is empty; the next is ResourceExhausted with a RetryInfo detail and
// a pushback trailer that both say the engine's RetryAfter in milliseconds.
func TestServerUnary(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(2, 4)}) // a token every 250ms
	conn := serve(t, newLimiter(t, e), nil)
	hc := healthpb.NewHealthClient(conn)
	ctx := t.Context()

	for range 2 {
		var md metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
		require.NoError(t, err)
		require.Empty(t, pushback(md), "no pushback on an admitted call")
	}
	var md metadata.MD
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	delay, ok := retryDelay(t, err)
	require.True(t, ok, "RetryInfo detail")
	require.Equal(t, int64(250), delay)
	require.Equal(t, []string{"250"}, pushback(md))

	clk.Advance(100 * time.Millisecond) // 150ms to go
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	delay, _ = retryDelay(t, err)
	require.Equal(t, int64(150), delay)
	require.Equal(t, []string{"150"}, pushback(md))

	clk.Advance(150 * time.Millisecond)
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
}

// TestServerKeyCapacity: a full key table is Unavailable; the refusal
// carries a delay only when the engine sweeps in the background.
func TestServerKeyCapacity(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sweep time.Duration
	}{{"no sweeper", 0}, {"sweeper", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1, SweepEvery: tc.sweep})
			_, err := e.Allow(t.Context(), "someone else", 1)
			require.NoError(t, err)
			conn := serve(t, newLimiter(t, e), nil)
			var md metadata.MD
			_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), "at capacity")
			delay, ok := retryDelay(t, err)
			if tc.sweep == 0 {
				require.False(t, ok, "no sweeper: no delay would be true")
				require.Empty(t, pushback(md))
				return
			}
			require.True(t, ok, "ReclaimAfter's estimate as RetryInfo")
			require.Positive(t, delay)
			require.Equal(t, []string{strconv.FormatInt(delay, 10)}, pushback(md))
		})
	}
}

// attempt is what the recording interceptor saw of one call.
type attempt struct {
	start, end int64  // server clock readings on entry and on return
	previous   string // grpc-previous-rpc-attempts: "" on a first attempt
	delay      int64  // the RetryInfo delay of a refusal, ms; 0 if admitted
}

// TestServerRetryHonoursPushback: a grpc-go client whose retry policy
// retries RESOURCE_EXHAUSTED with a 10ms backoff waits the pushback
// (up to a second) instead before its retry, which the server sees no sooner
// than that after it refused the first attempt, and admits. The engine runs
// on the real clock here, since the client's wait is real; the gap is
// measured with the server's own clock.
func TestServerRetryHonoursPushback(t *testing.T) {
	// A token a second: the bucket must stay empty from the Allow that
	// empties it to the first attempt, which at a token every 200 ms a
	// loaded machine outlasted.
	e, err := engine.New(engine.Config{Policy: pol(5, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	mono := clock.NewMonotonic()
	var mu sync.Mutex
	var seen []attempt
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		a := attempt{start: mono.Now()}
		if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("grpc-previous-rpc-attempts")) > 0 {
			a.previous = md.Get("grpc-previous-rpc-attempts")[0]
		}
		res, err := h(ctx, req)
		if err != nil {
			a.delay, _ = retryDelay(t, err)
		}
		a.end = mono.Now()
		mu.Lock()
		seen = append(seen, a)
		mu.Unlock()
		return res, err
	}
	const serviceConfig = `{"methodConfig": [{
		"name": [{"service": "grpc.health.v1.Health"}],
		"retryPolicy": {
			"maxAttempts": 3,
			"initialBackoff": "0.01s",
			"maxBackoff": "0.01s",
			"backoffMultiplier": 1.0,
			"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]
		}
	}]}`
	conn := serve(t, newLimiter(t, e), []grpc.UnaryServerInterceptor{record}, grpc.WithDefaultServiceConfig(serviceConfig))
	// connected before the bucket is emptied: the dial is not in the window
	conn.Connect()
	ready, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		require.True(t, conn.WaitForStateChange(ready, st), "the client never connected: %v", st)
	}

	_, err = e.Allow(t.Context(), "127.0.0.1", 5) // empty the client's bucket
	require.NoError(t, err)
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "the retry after the pushback is admitted")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2, "one refusal, one admitted retry: %+v", seen)
	first, retry := seen[0], seen[1]
	require.Equal(t, "", first.previous)
	require.Equal(t, "1", retry.previous, "the second call is grpc-go's retry")
	require.Positive(t, first.delay)
	require.LessOrEqual(t, first.delay, int64(1000))
	require.Zero(t, retry.delay)
	gap := time.Duration(retry.start - first.end)
	require.GreaterOrEqual(t, gap, time.Duration(first.delay)*time.Millisecond,
		"the client retried %v after the refusal, before the %dms pushback", gap, first.delay)
}

// duplex opens a FullDuplexCall stream and returns it.
func duplex(t *testing.T, conn *grpc.ClientConn) grpc.BidiStreamingClient[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse] {
	t.Helper()
	s, err := testgrpc.NewTestServiceClient(conn).FullDuplexCall(t.Context())
	require.NoError(t, err)
	return s
}

// echo sends n messages on s and receives their echoes, returning the
// first error.
func echo(s grpc.BidiStreamingClient[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse], n int) error {
	for range n {
		if err := s.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil && !errors.Is(err, io.EOF) {
			return err // io.EOF: the stream has ended, and Recv says why
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
	return nil
}

// finish closes the client side of s and returns the stream's end: nil
// for a clean one.
func finish(s grpc.BidiStreamingClient[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// TestServerStreamPerStream: by default a stream spends once, when it
// starts, however many messages it carries; a stream that finds the bucket
// empty is refused before its handler runs, with RetryInfo and pushback.
func TestServerStreamPerStream(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	conn := serve(t, newLimiter(t, e), nil)
	for range 2 {
		s := duplex(t, conn)
		require.NoError(t, echo(s, 5))
		require.NoError(t, finish(s))
	}
	d, err := e.Peek(t.Context(), "127.0.0.1")
	require.NoError(t, err)
	require.Zero(t, d.Remaining, "two streams of five messages spent two tokens")

	s := duplex(t, conn)
	err = echo(s, 1)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	delay, ok := retryDelay(t, err)
	require.True(t, ok)
	require.Equal(t, int64(1000), delay)
	require.Equal(t, []string{"1000"}, pushback(s.Trailer()))
}

// TestServerStreamPerMessage: with WithPerMessage each received message
// spends; the one the bucket cannot pay for ends the stream with
// ResourceExhausted and a delay, and the end of the client's side charges
// nothing.
func TestServerStreamPerMessage(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(3, 2)})
	conn := serve(t, newLimiter(t, e, grpclimit.WithPerMessage()), nil)

	s := duplex(t, conn)
	require.NoError(t, echo(s, 2))
	require.NoError(t, finish(s))
	d, err := e.Peek(t.Context(), "127.0.0.1")
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Remaining, "two messages spent two tokens; opening and closing none")

	s = duplex(t, conn)
	require.NoError(t, echo(s, 1))
	err = echo(s, 1)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	delay, ok := retryDelay(t, err)
	require.True(t, ok)
	require.Equal(t, int64(500), delay)
	require.Equal(t, []string{"500"}, pushback(s.Trailer()))

	clk.Advance(500 * time.Millisecond)
	s = duplex(t, conn)
	require.NoError(t, echo(s, 1))
	require.NoError(t, finish(s))
}

// TestServerExempt: exempt methods are never charged nor refused, unary or
// stream, while the others are limited as usual.
func TestServerExempt(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	l := newLimiter(t, e, grpclimit.WithExempt(
		"/grpc.health.v1.Health/Check",
		"/grpc.testing.TestService/FullDuplexCall",
	))
	conn := serve(t, l, nil)
	hc := healthpb.NewHealthClient(conn)
	for range 5 {
		_, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		s := duplex(t, conn)
		require.NoError(t, echo(s, 2))
		require.NoError(t, finish(s))
	}
	require.Zero(t, e.KeyCount(), "exempt calls are not charged")

	tc := testgrpc.NewTestServiceClient(conn)
	_, err := tc.EmptyCall(t.Context(), &testgrpc.Empty{})
	require.NoError(t, err)
	_, err = tc.EmptyCall(t.Context(), &testgrpc.Empty{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	_, err = hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "an exempt method is not refused when the client's bucket is empty")
}
