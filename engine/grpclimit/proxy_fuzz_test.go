package grpclimit_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// keyRecorder admits every call and records the key it was asked about;
// the Limiter calls nothing else of it here.
type keyRecorder struct {
	engine.Admitter
	keys []string
}

func (r *keyRecorder) Allow(_ context.Context, key string, _ int64) (engine.Decision, error) {
	r.keys = append(r.keys, key)
	return engine.Decision{Allowed: true}, nil
}

// FuzzTrustedProxiesKey: the key of a unary call whose peer and
// "x-forwarded-for" metadata the fuzzer chooses is the key httplimit's
// middleware gives an HTTP request from that peer with those
// X-Forwarded-For lines (httplimit.ClientKey of httplimit.ClientIP, at
// the same IPv6 grouping), as WithTrustedProxies promises; and from a peer
// outside the trusted prefixes it is the peer's own key, whatever the
// metadata says.
func FuzzTrustedProxiesKey(f *testing.F) {
	for _, p := range []string{"10.1.2.3", "203.0.113.1", "::ffff:10.0.0.1", "fe80::1%eth0", "2001:db8:ffff::9", "64:ff9b::a00:1"} {
		for _, v := range []string{"", "198.51.100.7", "6.6.6.6, 198.51.100.7", "6.6.6.6\n198.51.100.7, 10.9.9.9",
			"garbage, 10.0.0.9", "[2001:db8::1]:443", "::ffff:10.0.0.5", "64:ff9b::c633:6407", "fe80::2%lo, 10.0.0.1"} {
			f.Add(p, v, uint8(64))
		}
	}
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48"), netip.MustParsePrefix("::ffff:192.168.0.0/112")}
	f.Fuzz(func(t *testing.T, peerText, values string, bits uint8) {
		a, err := netip.ParseAddr(peerText)
		if err != nil {
			return
		}
		ipv6Bits := httplimit.MinIPv6Prefix + int(bits)%(129-httplimit.MinIPv6Prefix)
		rec := &keyRecorder{}
		l, err := grpclimit.New(rec, grpclimit.WithTrustedProxies(trusted...), grpclimit.WithIPv6Prefix(ipv6Bits))
		require.NoError(t, err)

		lines := strings.Split(values, "\n")
		md := metadata.MD{}
		for _, v := range lines {
			md.Append("x-forwarded-for", v)
		}
		tcp := &net.TCPAddr{IP: a.AsSlice(), Port: 443, Zone: a.Zone()}
		ctx := peer.NewContext(metadata.NewIncomingContext(t.Context(), md), &peer.Peer{Addr: tcp})
		_, err = l.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/s/M"}, func(context.Context, any) (any, error) { return nil, nil })
		require.NoError(t, err)
		require.Len(t, rec.keys, 1)

		r := &http.Request{RemoteAddr: netip.AddrPortFrom(a, 443).String(), Header: http.Header{}}
		for _, v := range lines {
			r.Header.Add("X-Forwarded-For", v)
		}
		client, err := httplimit.ClientIP(r, httplimit.XForwardedFor, trusted)
		require.NoError(t, err)
		require.Equal(t, httplimit.ClientKey(client, ipv6Bits), rec.keys[0], "peer %s, x-forwarded-for %q", a, lines)

		self := a.WithZone("").Unmap()
		if !self.Is4() && !trusted[1].Contains(self) || self.Is4() && !trusted[0].Contains(self) && !netip.MustParsePrefix("192.168.0.0/16").Contains(self) {
			require.Equal(t, httplimit.ClientKey(self, ipv6Bits), rec.keys[0], "an untrusted peer %s is its own key, x-forwarded-for %q", a, lines)
		}
	})
}
