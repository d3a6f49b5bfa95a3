package grpclimit_test

import (
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
)

// TestServeHTTPPeer: a gRPC server run as an http.Handler
// (grpc.Server.ServeHTTP, to share a port with HTTP) has the peer's
// address from Request.RemoteAddr, which a middleware in front of it may
// have set to the bare IP of the client its proxy reports, without a port
// (as chi's RealIP and gorilla's ProxyHeaders do). That peer has an IP
// address, and is keyed by it, as httplimit keys such a request; it is not
// a call without a key (codes.Internal).
func TestServeHTTPPeer(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	l := newLimiter(t, e)
	srv := grpc.NewServer(grpc.UnaryInterceptor(l.Unary))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	realIP := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = r.Header.Get("X-Test-Remote") // what the proxy reported
		srv.ServeHTTP(w, r)
	})
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true) // gRPC's h2c, with prior knowledge
	hs := &http.Server{Handler: realIP, Protocols: &protocols}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { _ = hs.Serve(lis) })
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		_ = hs.Close()
		wg.Wait()
		srv.Stop()
	})

	for _, c := range []struct{ remote, key string }{
		{"203.0.113.7:41000", "203.0.113.7"},
		{"203.0.113.8", "203.0.113.8"},
		{"2001:db8:1:2::7", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::7]", "2001:db8:1:3::/64"},
		{"[::ffff:203.0.113.9]", "203.0.113.9"},
	} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-test-remote", c.remote)
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err, c.remote)
		d, err := e.Peek(t.Context(), c.key)
		require.NoError(t, err)
		require.Equal(t, int64(4), d.Remaining, "%s spent from key %s", c.remote, c.key)
	}
	for _, remote := range []string{"[203.0.113.10", "203.0.113.10]", "not an address"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-test-remote", remote)
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.Equal(t, codes.Internal, status.Code(err), "%s: %v", remote, err)
	}
	require.Equal(t, 5, e.KeyCount())
}
