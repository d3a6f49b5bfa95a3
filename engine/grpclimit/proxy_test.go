package grpclimit_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// TestServerTrustedProxies: behind a trusted proxy (the loopback client
// plays it, sending x-forwarded-for metadata as an Envoy would), each
// forwarded client has its own bucket of one call, grouped as a peer is
// (two addresses of one /64 share one); an entry the client forged in
// front of its own, on the same value or on an earlier one, is never its
// key; and a peer outside the trusted prefixes is keyed by itself, its
// metadata unread.
func TestServerTrustedProxies(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	conn := serve(t, newLimiter(t, e, grpclimit.WithTrustedProxies(netip.MustParsePrefix("127.0.0.0/8"))), nil)
	hc := healthpb.NewHealthClient(conn)
	check := func(pairs ...string) codes.Code {
		ctx := metadata.NewOutgoingContext(t.Context(), metadata.Pairs(pairs...))
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	const xff = "x-forwarded-for"

	require.Equal(t, codes.OK, check(xff, "198.51.100.7"), "client A")
	require.Equal(t, codes.OK, check(xff, "203.0.113.9"), "client B: a bucket of its own")
	require.Equal(t, codes.ResourceExhausted, check(xff, "198.51.100.7"), "client A again")
	require.Equal(t, codes.ResourceExhausted, check(xff, "6.6.6.6, 198.51.100.7"), "A forging a left-most entry")
	require.Equal(t, codes.ResourceExhausted, check(xff, "6.6.6.6", xff, "198.51.100.7"), "A forging an earlier value")
	require.Equal(t, codes.OK, check(xff, "6.6.6.6"), "the forged address was never charged")
	require.Equal(t, codes.OK, check(xff, "2001:db8:1:2::1"))
	require.Equal(t, codes.ResourceExhausted, check(xff, "[2001:db8:1:2::2]:443"), "one /64, one bucket")
	require.Equal(t, codes.OK, check(xff, "garbage, 192.0.2.1"), "the walk ends at the garbage, after the client")
	require.Equal(t, codes.OK, check(), "no metadata: the proxy itself")

	for _, k := range []string{"198.51.100.7", "203.0.113.9", "6.6.6.6", "2001:db8:1:2::/64", "192.0.2.1", "127.0.0.1"} {
		d, err := e.Peek(t.Context(), k)
		require.NoError(t, err)
		require.Zero(t, d.Remaining, "%s spent", k)
	}
	require.Equal(t, 6, e.KeyCount())

	// A peer that is not a trusted proxy is the client, whatever it sends.
	for _, prefixes := range [][]netip.Prefix{nil, {netip.MustParsePrefix("192.0.2.0/24")}} {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
		conn := serve(t, newLimiter(t, e, grpclimit.WithTrustedProxies(prefixes...)), nil)
		hc = healthpb.NewHealthClient(conn)
		require.Equal(t, codes.OK, check(xff, "198.51.100.7"))
		require.Equal(t, codes.ResourceExhausted, check(xff, "203.0.113.9"), "%v: keyed by the peer", prefixes)
		_, err := e.Peek(t.Context(), "127.0.0.1")
		require.NoError(t, err)
		require.Equal(t, 1, e.KeyCount())
	}
}

// TestTrustedProxiesInvalid: an invalid prefix is refused by New.
func TestTrustedProxiesInvalid(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	_, err := grpclimit.New(e, grpclimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"), netip.Prefix{}))
	require.ErrorIs(t, err, grpclimit.ErrInvalidOption)
}

// TestClientIPFromIsClientIP: httplimit.ClientIPFrom, which reads the gRPC
// metadata, answers as httplimit.ClientIP does for the same peer and
// lines, so HTTP and gRPC find one client by one walk.
func TestClientIPFromIsClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::ffff:192.168.0.0/112")}
	for _, peer := range []string{"10.1.2.3:80", "192.168.7.7:80", "[::ffff:10.0.0.1]:80", "203.0.113.1:80", "[fe80::1%eth0]:80"} {
		for _, lines := range [][]string{
			nil, {""}, {"198.51.100.7"}, {"6.6.6.6, 198.51.100.7"}, {"6.6.6.6", "198.51.100.7, 10.9.9.9"},
			{"198.51.100.7, garbage, 10.0.0.9"}, {"10.0.0.1, 10.0.0.2"}, {"[2001:db8::1]:443"}, {"for=1.1.1.1;x=\"", "10.0.0.3"},
		} {
			for _, h := range []httplimit.ProxyHeader{httplimit.XForwardedFor, httplimit.Forwarded, 0} {
				r := &http.Request{RemoteAddr: peer, Header: http.Header{}}
				for _, l := range lines {
					r.Header.Add(h.String(), l)
				}
				want, err := httplimit.ClientIP(r, h, trusted)
				require.NoError(t, err)
				got := httplimit.ClientIPFrom(netip.MustParseAddrPort(peer).Addr(), h, lines, trusted)
				require.Equal(t, want, got, "peer %s, %v %q", peer, h, lines)
			}
		}
	}
	require.False(t, httplimit.ClientIPFrom(netip.Addr{}, httplimit.XForwardedFor, []string{"1.1.1.1"}, trusted).IsValid())
}
