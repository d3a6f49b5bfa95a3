package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// routeKey is a per-route key: method, path and the grouped client.
func routeKey(r *http.Request, client string) (string, error) {
	return r.Method + " " + r.URL.Path + " " + client, nil
}

// send runs one request from remote through h and returns its status.
func send(h http.Handler, remote, path string, header ...string) int {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Code
}

// limited is ok behind a middleware on e built from opts.
func limited(t *testing.T, e engine.Admitter, opts ...httplimit.Option) http.Handler {
	t.Helper()
	mw, err := httplimit.New(e, opts...)
	require.NoError(t, err)
	return mw.Handler(ok)
}

func TestClientKey(t *testing.T) {
	for _, c := range []struct {
		addr string
		bits int
		want string
	}{
		{"203.0.113.7", 64, "203.0.113.7"},
		{"203.0.113.7", 128, "203.0.113.7"}, // IPv4 is always per address
		{"::ffff:192.0.2.1", 64, "192.0.2.1"},
		{"::ffff:192.0.2.1", 128, "192.0.2.1"},
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2::1", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:aaaa::1", 48, "2001:db8:1::/48"},
		{"2001:db8:1:2:aaaa::1", 32, "2001:db8::/32"},
		{"2001:db8::7", 128, "2001:db8::7/128"},
		{"fe80::1%eth0", 64, "fe80::/64"}, // the zone is dropped
		{"fe80::1%eth0", 128, "fe80::1/128"},
		{"::1", 64, "::/64"},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 128, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"}, // the longest
		{"2001:db8::7", -5, "::/0"}, // out of range: the nearer bound
		{"2001:db8::7", 200, "2001:db8::7/128"},
		{"64:ff9b::203.0.113.7", 64, "203.0.113.7"}, // well-known NAT64: the embedded IPv4 address
		{"64:ff9b::c000:201", 128, "192.0.2.1"},
		{"64:ff9b::192.0.2.1%eth0", 32, "192.0.2.1"},
		{"64:ff9b:0:0:0:1:c000:201", 64, "64:ff9b::/64"}, // outside the /96
		{"64:ff9b:1::203.0.113.7", 64, "64:ff9b:1::/64"}, // local-use NAT64: grouped as IPv6
		{"64:ff9b:1::203.0.113.7", 128, "64:ff9b:1::cb00:7107/128"},
	} {
		a := netip.MustParseAddr(c.addr)
		got := httplimit.ClientKey(a, c.bits)
		assert.Equal(t, c.want, got, "%s bits %d", c.addr, c.bits)
		if a6 := a.WithZone(""); !a6.Unmap().Is4() && !mustPrefix("64:ff9b::/96").Contains(a6) && c.bits >= 0 && c.bits <= 128 {
			p, err := a6.Prefix(c.bits)
			require.NoError(t, err)
			assert.Equal(t, p.String(), got, "%s bits %d: netip.Prefix.String of the masked prefix", c.addr, c.bits)
		}
	}
	assert.Empty(t, httplimit.ClientKey(netip.Addr{}, 64))
}

// ClientKey allocates only the string it returns.
func TestClientKeyAllocs(t *testing.T) {
	for _, s := range []string{"203.0.113.7", "::ffff:192.0.2.1", "64:ff9b::192.0.2.1", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", "fe80::1%eth0"} {
		a := netip.MustParseAddr(s)
		assert.LessOrEqual(t, testing.AllocsPerRun(100, func() { _ = httplimit.ClientKey(a, 64) }), 1.0, s)
	}
}

func BenchmarkClientKey(b *testing.B) {
	for _, s := range []string{"203.0.113.7", "2001:db8:1:2:aaaa:bbbb:cccc:dddd"} {
		a := netip.MustParseAddr(s)
		name := "family=ipv4"
		if a.Is6() {
			name = "family=ipv6"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = httplimit.ClientKey(a, 64)
			}
		})
	}
}

// One host rotating through its /64 is one client: 1,000 distinct
// addresses make one key, and the bucket's capacity is all they get.
func TestIPv6HostRotatingInItsSlash64(t *testing.T) {
	const capacity, requests = 10, 1000
	e, _ := newEngine(t, engine.Config{Policy: pol(capacity, 1)})
	h := limited(t, e)
	count := map[int]int{}
	for i := range requests {
		remote := fmt.Sprintf("[2001:db8:1:2:%x:%x:%x:%x]:%d", i%7, i, i*31%65536, i*7919%65536, 1024+i)
		count[send(h, remote, "/")]++
	}
	assert.Equal(t, map[int]int{http.StatusOK: capacity, http.StatusTooManyRequests: requests - capacity}, count)
	assert.Equal(t, 1, e.KeyCount())
	assert.Equal(t, int64(0), remaining(t, e, "2001:db8:1:2::/64"))
}

// Ten /64s are ten clients, however many addresses each uses.
func TestIPv6TenSlash64s(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	h := limited(t, e)
	for n := range 10 {
		for host := range 3 {
			require.Equal(t, http.StatusOK, send(h, fmt.Sprintf("[2001:db8:0:%x::%x]:443", n+1, host+1), "/"))
		}
	}
	assert.Equal(t, 10, e.KeyCount())
	for n := range 10 {
		assert.Equal(t, int64(7), remaining(t, e, fmt.Sprintf("2001:db8:0:%x::/64", n+1)))
	}
}

// An IPv4-mapped IPv6 peer (a dual-stack listener's view of an IPv4
// client) is that IPv4 client, with the same key.
func TestIPv4MappedIsIPv4(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(3, 1)})
	h := limited(t, e)
	require.Equal(t, http.StatusOK, send(h, "[::ffff:192.0.2.1]:1234", "/"))
	require.Equal(t, http.StatusOK, send(h, "192.0.2.1:5678", "/"))
	require.Equal(t, http.StatusOK, send(h, "[::ffff:c000:201]:9", "/")) // the same, in hex
	assert.Equal(t, http.StatusTooManyRequests, send(h, "192.0.2.1:5678", "/"))
	assert.Equal(t, 1, e.KeyCount())
	assert.Equal(t, int64(0), remaining(t, e, "192.0.2.1"))
}

// IPv4 clients reaching an IPv6 server through a NAT64 gateway on the
// well-known prefix 64:ff9b::/96 are each their own IPv4 client, with the
// keys they have when they connect over IPv4, not one /64 for all of them.
// The local-use prefix 64:ff9b:1::/48 is grouped as any IPv6 address.
func TestNAT64IsIPv4(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	h := limited(t, e)
	require.Equal(t, http.StatusOK, send(h, "[64:ff9b::192.0.2.1]:1234", "/"))
	require.Equal(t, http.StatusOK, send(h, "[64:ff9b::198.51.100.2]:1234", "/"))
	require.Equal(t, http.StatusOK, send(h, "192.0.2.1:5678", "/")) // the same client over IPv4
	assert.Equal(t, http.StatusTooManyRequests, send(h, "[64:ff9b::c000:201]:9", "/"))
	require.Equal(t, http.StatusOK, send(h, "[64:ff9b:1::192.0.2.1]:1234", "/"))
	require.Equal(t, http.StatusOK, send(h, "[64:ff9b:1::198.51.100.2]:1234", "/"))
	assert.Equal(t, 3, e.KeyCount())
	assert.Equal(t, int64(0), remaining(t, e, "192.0.2.1"))
	assert.Equal(t, int64(1), remaining(t, e, "198.51.100.2"))
	assert.Equal(t, int64(0), remaining(t, e, "64:ff9b:1::/64"))

	a, b := netip.MustParseAddr("64:ff9b::192.0.2.1"), netip.MustParseAddr("64:ff9b::198.51.100.2")
	assert.NotEqual(t, httplimit.ClientKey(a, 64), httplimit.ClientKey(b, 64))
	assert.Equal(t, httplimit.ClientKey(netip.MustParseAddr("192.0.2.1"), 64), httplimit.ClientKey(a, 64))
	assert.Equal(t, httplimit.ClientKey(netip.MustParseAddr("198.51.100.2"), 64), httplimit.ClientKey(b, 64))
}

// WithIPv6Prefix(48) groups a whole /48 (a site) as one client, and 128
// keys each address alone.
func TestWithIPv6Prefix(t *testing.T) {
	t.Run("48", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(20, 1)})
		h := limited(t, e, httplimit.WithIPv6Prefix(48))
		for n := range 10 {
			require.Equal(t, http.StatusOK, send(h, fmt.Sprintf("[2001:db8:1:%x::1]:443", n*4099%65536), "/"))
		}
		require.Equal(t, http.StatusOK, send(h, "[2001:db8:2::1]:443", "/"))
		assert.Equal(t, 2, e.KeyCount())
		assert.Equal(t, int64(10), remaining(t, e, "2001:db8:1::/48"))
		assert.Equal(t, int64(19), remaining(t, e, "2001:db8:2::/48"))
	})
	t.Run("128", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(20, 1)})
		h := limited(t, e, httplimit.WithIPv6Prefix(128))
		require.Equal(t, http.StatusOK, send(h, "[2001:db8::1]:443", "/"))
		require.Equal(t, http.StatusOK, send(h, "[2001:db8::2]:443", "/"))
		require.Equal(t, http.StatusOK, send(h, "192.0.2.1:443", "/"))
		assert.Equal(t, 3, e.KeyCount())
		assert.Equal(t, int64(19), remaining(t, e, "2001:db8::1/128"))
		assert.Equal(t, int64(19), remaining(t, e, "192.0.2.1"))
	})
}

// Behind a trusted proxy, WithClientKey is given the forwarded client,
// grouped: a per-route key over the client's /64, which the addresses a
// client forges in front of its own cannot change.
func TestClientKeyBehindProxy(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	var seen []string
	h := limited(t, e,
		httplimit.WithClientKey(func(r *http.Request, client string) (string, error) {
			seen = append(seen, client)
			return routeKey(r, client)
		}),
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, mustPrefix("10.0.0.0/8")))
	const lb = "10.0.0.5:52000"

	assert.Equal(t, http.StatusOK, send(h, lb, "/search", "X-Forwarded-For", "2001:db8:1:2::a"))
	assert.Equal(t, http.StatusOK, send(h, lb, "/search", "X-Forwarded-For", "6.6.6.6, 2001:db8:1:2::b"))          // forged, then real
	assert.Equal(t, http.StatusTooManyRequests, send(h, lb, "/search", "X-Forwarded-For", "2001:db8:1:2:ffff::1")) // the same /64
	assert.Equal(t, http.StatusOK, send(h, lb, "/export", "X-Forwarded-For", "2001:db8:1:2::a"))                   // another route
	assert.Equal(t, http.StatusOK, send(h, "[2001:db8:9::1]:443", "/search", "X-Forwarded-For", "203.0.113.7"))    // untrusted peer: header ignored

	assert.Equal(t, []string{"2001:db8:1:2::/64", "2001:db8:1:2::/64", "2001:db8:1:2::/64", "2001:db8:1:2::/64", "2001:db8:9::/64"}, seen)
	assert.Equal(t, int64(0), remaining(t, e, "GET /search 2001:db8:1:2::/64"))
	assert.Equal(t, int64(1), remaining(t, e, "GET /export 2001:db8:1:2::/64"))
	assert.Equal(t, int64(1), remaining(t, e, "GET /search 2001:db8:9::/64"))
	assert.Equal(t, 3, e.KeyCount())

	// No address in RemoteAddr: the function is called with client "" and
	// decides; this one keys by the route alone.
	seen = nil
	assert.Equal(t, http.StatusOK, send(h, "@", "/search"))
	assert.Equal(t, []string{""}, seen)
	assert.Equal(t, int64(1), remaining(t, e, "GET /search "))
}

// WithKey sees only the request, so the proxies and the grouping, which
// shape the client, leave its keys alone.
func TestKeyWithTrustedProxies(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	h := limited(t, e, httplimit.WithKey(userKey), httplimit.WithIPv6Prefix(48),
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, mustPrefix("10.0.0.0/8")))
	assert.Equal(t, http.StatusOK, send(h, "10.0.0.5:1", "/", "X-User", "alice", "X-Forwarded-For", "203.0.113.7"))
	assert.Equal(t, http.StatusOK, send(h, "[2001:db8::1]:1", "/", "X-User", "alice"))
	assert.Equal(t, http.StatusTooManyRequests, send(h, "192.0.2.1:1", "/", "X-User", "alice"))
	assert.Equal(t, 1, e.KeyCount())
	assert.Equal(t, int64(0), remaining(t, e, "alice"))
}
