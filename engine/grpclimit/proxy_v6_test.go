package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
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
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// TestServerTrustedProxyIPv6Peer: behind a trusted proxy reached over IPv6
// loopback, a NAT64 client in x-forwarded-for is keyed as its IPv4 address,
// an IPv6 client by its /64, and with no metadata the proxy itself.
func TestServerTrustedProxyIPv6Peer(t *testing.T) {
	lis, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip(err)
	}
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	var keys []string
	l := newLimiter(t, e, grpclimit.WithTrustedProxies(netip.MustParsePrefix("::1/128")),
		grpclimit.WithKey(func(_ context.Context, _, client string) (string, error) {
			keys = append(keys, client)
			return client, nil
		}))
	srv := grpc.NewServer(grpc.UnaryInterceptor(l.Unary))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close(); srv.Stop(); wg.Wait() }()
	hc := healthpb.NewHealthClient(conn)
	check := func(pairs ...string) codes.Code {
		ctx := metadata.NewOutgoingContext(t.Context(), metadata.Pairs(pairs...))
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	require.Equal(t, codes.OK, check("x-forwarded-for", "64:ff9b::203.0.113.9"))
	require.Equal(t, codes.ResourceExhausted, check("x-forwarded-for", "6.6.6.6, 203.0.113.9"))
	require.Equal(t, codes.OK, check("x-forwarded-for", "2001:db8:1:2::1"))
	require.Equal(t, codes.ResourceExhausted, check("x-forwarded-for", "2001:db8:1:2::99"))
	require.Equal(t, codes.OK, check())
	require.Equal(t, []string{"203.0.113.9", "203.0.113.9", "2001:db8:1:2::/64", "2001:db8:1:2::/64", "::/64"}, keys)
}
