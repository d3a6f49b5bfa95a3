package grpclimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/policy"
)

// TestMain fails the package if any test leaves a goroutine behind: no
// ignores, because stopped servers, closed client connections and closed
// engines own none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pol builds a policy without field names cluttering every call.
func pol(capacity, rate int64) policy.Policy {
	return policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate}
}

// newEngine starts an engine on a Manual clock at 0 (unless cfg has a clock)
// and closes it when the test ends.
func newEngine(t testing.TB, cfg engine.Config) (*engine.Engine, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(0)
	if cfg.Clock == nil {
		cfg.Clock = clk
	}
	e, err := engine.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, clk
}

// retryDelay returns the RetryInfo delay of err's status in milliseconds,
// and whether it has one.
func retryDelay(t *testing.T, err error) (int64, bool) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			d := ri.GetRetryDelay() // read by field: AsDuration saturates at 292 years
			return d.GetSeconds()*1000 + int64(d.GetNanos())/1e6, true
		}
	}
	return 0, false
}

// testService is the tiny service the network tests call besides health:
// EmptyCall answers, FullDuplexCall echoes every message until the client
// closes its side, StreamingInputCall reads every message and then
// answers once (or returns the first error).
type testService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (testService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (testService) StreamingInputCall(s grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	for {
		if _, err := s.Recv(); errors.Is(err, io.EOF) {
			return s.SendAndClose(&testgrpc.StreamingInputCallResponse{})
		} else if err != nil {
			return err
		}
	}
}

func (testService) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}

// serve runs a gRPC server on a loopback listener with the health and test
// services behind l's interceptors (after any given first), and returns a
// client connection to it made with dialOpts. The server is stopped and
// the connection closed when the test ends.
func serve(t *testing.T, l *grpclimit.Limiter, first []grpc.UnaryServerInterceptor, dialOpts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return serveWith(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(append(first, l.Unary)...), grpc.StreamInterceptor(l.Stream)},
		testService{}, dialOpts...)
}

// serveWith runs a gRPC server made with opts on a loopback listener, with
// the health service and svc as the test service, and returns a client
// connection to it made with dialOpts; both end with the test.
func serveWith(t *testing.T, opts []grpc.ServerOption, svc testgrpc.TestServiceServer, dialOpts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	testgrpc.RegisterTestServiceServer(srv, svc)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		wg.Wait()
	})
	return conn
}

// retrying is the service config of a client whose retry policy makes up
// to attempts attempts of every call to service, 1 ms apart unless a
// pushback says otherwise, when it ends with one of codes.
func retrying(service string, attempts int, codes ...string) grpc.DialOption {
	retryable, _ := json.Marshal(codes) // strings: never fails
	return grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"methodConfig": [{"name": [{"service": %q}],
		"retryPolicy": {"maxAttempts": %d, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
		"backoffMultiplier": 1.0, "retryableStatusCodes": %s}}]}`, service, attempts, retryable))
}

// newLimiter is grpclimit.New that fails the test on an error.
func newLimiter(t testing.TB, e engine.Admitter, opts ...grpclimit.Option) *grpclimit.Limiter {
	t.Helper()
	l, err := grpclimit.New(e, opts...)
	require.NoError(t, err)
	return l
}

// mustAddrPort parses "ip:port" or "[ip%zone]:port".
func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
