package httplimit_test

import (
	"context"
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

var netipPrefixZero netip.Prefix

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// remaining peeks at key's whole tokens without spending any; a key not
// tracked reports a full bucket.
func remaining(t *testing.T, e *engine.Engine, key string) int64 {
	t.Helper()
	d, err := e.Peek(context.Background(), key)
	require.NoError(t, err)
	return d.Remaining
}

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{mustPrefix("10.0.0.0/8"), mustPrefix("2001:db8:ffff::/48"), mustPrefix("::ffff:192.168.0.0/112")}
	xff, fwd := httplimit.XForwardedFor, httplimit.Forwarded
	cases := []struct {
		name    string
		remote  string
		h       httplimit.ProxyHeader
		trusted []netip.Prefix
		header  []string // name, value pairs, in order
		want    string
	}{
		{"peer only", "192.0.2.1:1234", xff, proxies, nil, "192.0.2.1"},
		{"untrusted peer ignores XFF", "192.0.2.1:1234", xff, proxies, []string{"X-Forwarded-For", "203.0.113.7"}, "192.0.2.1"},
		{"no trusted prefixes ignores XFF", "10.0.0.1:1234", xff, nil, []string{"X-Forwarded-For", "203.0.113.7"}, "10.0.0.1"},
		{"zero header ignores XFF", "10.0.0.1:1234", 0, proxies, []string{"X-Forwarded-For", "203.0.113.7"}, "10.0.0.1"},
		{"trusted peer, one hop", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "203.0.113.7"}, "203.0.113.7"},
		{"spoofed entries left of the client", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "6.6.6.6, 10.9.9.9, 203.0.113.7"}, "203.0.113.7"},
		{"two trusted hops", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "6.6.6.6, 203.0.113.7, 10.0.0.2"}, "203.0.113.7"},
		{"several field lines", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "203.0.113.7,10.0.0.2"}, "203.0.113.7"},
		{"all trusted: left-most", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"trusted peer, no header", "10.0.0.1:1234", xff, proxies, nil, "10.0.0.1"},
		{"garbage stops at the proxy that wrote it", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "203.0.113.7, nonsense, 10.0.0.2"}, "10.0.0.2"},
		{"empty entry stops", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "203.0.113.7,"}, "10.0.0.1"},
		{"ports and brackets", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "[2001:db8::7]:443, 10.0.0.2:80"}, "2001:db8::7"},
		{"unclosed bracket stops", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "[2001:db8::17, 10.0.0.2"}, "10.0.0.2"},
		{"bare IPv6 and a zone", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "fe80::1%eth0"}, "fe80::1"},
		{"IPv4-mapped client", "10.0.0.1:1234", xff, proxies, []string{"X-Forwarded-For", "::ffff:203.0.113.7"}, "203.0.113.7"},
		{"IPv6 trusted peer", "[2001:db8:ffff::1]:1234", xff, proxies, []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"IPv4-mapped prefix trusts IPv4", "192.168.0.9:1234", xff, proxies, []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"IPv4-mapped /96 trusts every IPv4", "192.0.2.1:1234", xff, []netip.Prefix{mustPrefix("::ffff:0.0.0.0/96")}, []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"XFF mode ignores Forwarded", "10.0.0.1:1234", xff, proxies, []string{"Forwarded", "for=203.0.113.7"}, "10.0.0.1"},
		{"Forwarded mode ignores XFF", "10.0.0.1:1234", fwd, proxies, []string{"X-Forwarded-For", "203.0.113.7"}, "10.0.0.1"},
		{"Forwarded one hop", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", "for=203.0.113.7;proto=https;by=10.0.0.1"}, "203.0.113.7"},
		{"Forwarded spoofed left", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", `for=6.6.6.6, For="203.0.113.7:4711", for=10.0.0.2`}, "203.0.113.7"},
		{"Forwarded quoted IPv6", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", `for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded unquoted bracketed IPv6", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", `for=[2001:db8:cafe::17]`}, "2001:db8:cafe::17"},
		{"Forwarded quoted comma", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", `for=203.0.113.7;ext="a,b", for=10.0.0.2`}, "203.0.113.7"},
		{"Forwarded unknown stops", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", "for=203.0.113.7, for=unknown, for=10.0.0.2"}, "10.0.0.2"},
		{"Forwarded obfuscated stops", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", "for=_hidden"}, "10.0.0.1"},
		{"Forwarded element without for stops", "10.0.0.1:1234", fwd, proxies, []string{"Forwarded", "for=203.0.113.7, proto=http"}, "10.0.0.1"},
		{"RemoteAddr without port", "192.0.2.1", xff, nil, nil, "192.0.2.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = c.remote
			for i := 0; i+1 < len(c.header); i += 2 {
				r.Header.Add(c.header[i], c.header[i+1])
			}
			got, err := httplimit.ClientIP(r, c.h, c.trusted)
			require.NoError(t, err)
			assert.Equal(t, c.want, got.String())
		})
	}

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "@"
	_, err := httplimit.ClientIP(r, xff, proxies)
	assert.ErrorIs(t, err, httplimit.ErrNoClientIP)
}

// By default no forwarded header is believed: two requests from one peer
// with different X-Forwarded-For and Forwarded values share one bucket.
func TestForwardedHeadersIgnoredByDefault(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	srv := serve(t, e, ok)

	assert.Equal(t, http.StatusOK, get(t, srv, "X-Forwarded-For", "203.0.113.7").status)
	assert.Equal(t, http.StatusOK, get(t, srv, "Forwarded", "for=203.0.113.8").status)
	res := get(t, srv, "X-Forwarded-For", "203.0.113.9", "Forwarded", "for=203.0.113.9")
	assert.Equal(t, http.StatusTooManyRequests, res.status)
	assert.Equal(t, 1, e.KeyCount())
	assert.Equal(t, int64(0), remaining(t, e, loopback))
}

// Behind a trusted proxy the client is the right-most untrusted address of
// the header the proxy writes; what the client wrote in front of it, and
// any other header, is ignored.
func TestTrustedProxies(t *testing.T) {
	t.Run("X-Forwarded-For", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
		srv := serve(t, e, ok, httplimit.WithTrustedProxies(httplimit.XForwardedFor, mustPrefix("127.0.0.0/8"), mustPrefix("10.0.0.0/8")))

		assert.Equal(t, http.StatusOK, get(t, srv, "X-Forwarded-For", "203.0.113.7").status)
		assert.Equal(t, http.StatusOK, get(t, srv, "X-Forwarded-For", "203.0.113.8").status) // its own bucket
		// A client claiming to be someone else in front of its real address.
		res := get(t, srv, "X-Forwarded-For", "6.6.6.6, 203.0.113.7, 10.0.0.2")
		assert.Equal(t, http.StatusTooManyRequests, res.status)
		assert.Equal(t, int64(1), remaining(t, e, "6.6.6.6"))
		// A header the proxies do not write is not read.
		assert.Equal(t, http.StatusOK, get(t, srv, "Forwarded", "for=203.0.113.7").status)
		assert.Equal(t, int64(0), remaining(t, e, loopback))
		assert.Equal(t, 3, e.KeyCount())
	})
	t.Run("Forwarded", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
		srv := serve(t, e, ok, httplimit.WithTrustedProxies(httplimit.Forwarded, mustPrefix("127.0.0.1/32")))

		assert.Equal(t, http.StatusOK, get(t, srv, "Forwarded", `for="[2001:db8::7]:4711";proto=https`).status)
		res := get(t, srv, "Forwarded", "for=6.6.6.6, for=2001:db8::7")
		assert.Equal(t, http.StatusTooManyRequests, res.status)
		assert.Equal(t, int64(0), remaining(t, e, "2001:db8::/64")) // IPv6 clients are keyed per /64
		assert.Equal(t, int64(1), remaining(t, e, "6.6.6.6"))
		assert.Equal(t, http.StatusOK, get(t, srv, "X-Forwarded-For", "2001:db8::7").status) // keyed by the peer
		assert.Equal(t, 2, e.KeyCount())
	})
}

// A client's unbalanced quote or dangling escape in Forwarded cannot
// swallow the element a trusted proxy appends after it, on the same line
// or the next: the proxy's element is read first, from the right, and
// names the client. A malformed element further left, reached only through
// trusted hops, ends the walk at the last address a trusted hop wrote.
func TestClientIPMalformedLeftOfTrustedElement(t *testing.T) {
	lb := []netip.Prefix{mustPrefix("127.0.0.1/32")}
	proxies := []netip.Prefix{mustPrefix("127.0.0.1/32"), mustPrefix("10.0.0.0/8")}
	xff, fwd := httplimit.XForwardedFor, httplimit.Forwarded
	cases := []struct {
		name    string
		h       httplimit.ProxyHeader
		trusted []netip.Prefix
		lines   []string
		want    string
	}{
		{"open quote", fwd, lb, []string{`for=1.1.1.1;x=", for=203.0.113.9`}, "203.0.113.9"},
		{"escaped quote", fwd, lb, []string{`for=1.1.1.1;x="\", for=203.0.113.9`}, "203.0.113.9"},
		{"open quote in for", fwd, lb, []string{`for="1.1.1.1, for=203.0.113.9`}, "203.0.113.9"},
		{"no space after the comma", fwd, lb, []string{`for=1.1.1.1;x=",for=203.0.113.9`}, "203.0.113.9"},
		{"quoted proxy element", fwd, lb, []string{`for="1.1.1.1, for="203.0.113.9:4711"`}, "203.0.113.9"},
		{"proxy on the next line", fwd, lb, []string{`for=1.1.1.1;x="`, `for=203.0.113.9`}, "203.0.113.9"},
		{"quote closed on the next line", fwd, lb, []string{`for=1.1.1.1;x="`, `", for=203.0.113.9`}, "203.0.113.9"},
		{"open quote behind a trusted hop", fwd, proxies, []string{`for=1.1.1.1;x=", for=10.0.0.2`}, "10.0.0.2"},
		{"dangling escape behind a trusted hop", fwd, proxies, []string{`for="1.1.1.1\`, `for=10.0.0.2`}, "10.0.0.2"},
		{"stray quote behind a trusted hop", fwd, proxies, []string{`for=1.1.1.1;x="a"b", for=10.0.0.2`}, "10.0.0.2"},
		{"two for behind a trusted hop", fwd, proxies, []string{`for=203.0.113.7;for=1.1.1.1, for=10.0.0.2`}, "10.0.0.2"},
		{"empty value behind a trusted hop", fwd, proxies, []string{`for=1.1.1.1;x=, for=10.0.0.2`}, "10.0.0.2"},
		{"no separator behind a trusted hop", fwd, proxies, []string{`for=1.1.1.1 for=203.0.113.7, for=10.0.0.2`}, "10.0.0.2"},
		{"stray byte between pairs behind a trusted hop", fwd, proxies, []string{`for=203.0.113.7/proto=http, for=10.0.0.2`}, "10.0.0.2"},
		{"escaped control byte behind a trusted hop", fwd, proxies, []string{"for=203.0.113.7;x=\"\\\x01\", for=10.0.0.2"}, "10.0.0.2"},
		{"balanced escapes still read", fwd, proxies, []string{`for=203.0.113.7;ext="a\"b,\\", for=10.0.0.2`}, "203.0.113.7"},
		{"escaped address", fwd, proxies, []string{`for="203.0.113.\7", for=10.0.0.2`}, "203.0.113.7"},
		{"spaces around separators", fwd, proxies, []string{`proto=http ; for = 203.0.113.7 ;; by=x ,for=10.0.0.2`}, "203.0.113.7"},
		{"XFF quoted entry stops", xff, proxies, []string{`203.0.113.7, "1.1.1.1", 10.0.0.2`}, "10.0.0.2"},
		{"XFF open quote cannot swallow", xff, lb, []string{`1.1.1.1"`, `203.0.113.9`}, "203.0.113.9"},
		{"XFF empty line stops", xff, proxies, []string{`203.0.113.7`, ``, `10.0.0.2`}, "10.0.0.2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = "127.0.0.1:1"
			for _, line := range c.lines {
				r.Header.Add(c.h.String(), line)
			}
			got, err := httplimit.ClientIP(r, c.h, c.trusted)
			require.NoError(t, err)
			assert.Equal(t, c.want, got.String())
		})
	}
}

// Through a real server, one client rotating the for= it writes in front
// of an unbalanced quote, which the trusted proxy's appended element
// follows, is one client: capacity 3 admits 3 of 50 requests.
func TestForwardedOpenQuoteRotatingClient(t *testing.T) {
	const capacity, requests = 3, 50
	e, _ := newEngine(t, engine.Config{Policy: pol(capacity, 1)})
	srv := serve(t, e, ok, httplimit.WithTrustedProxies(httplimit.Forwarded, mustPrefix("127.0.0.1/32")))
	forms := []string{`for=%s;x=", for=203.0.113.9`, `for=%s;x="\", for=203.0.113.9`, `for="%s, for=203.0.113.9`}
	count := map[int]int{}
	for i := range requests {
		forged := fmt.Sprintf("198.51.100.%d", i+1)
		count[get(t, srv, "Forwarded", fmt.Sprintf(forms[i%len(forms)], forged)).status]++
	}
	assert.Equal(t, map[int]int{http.StatusOK: capacity, http.StatusTooManyRequests: requests - capacity}, count)
	assert.Equal(t, 1, e.KeyCount())
	assert.Equal(t, int64(0), remaining(t, e, "203.0.113.9"))
}

// ClientIPFrom, as ClientIP, reads the proxy header only when the direct
// peer is trusted: an untrusted peer's lines are the client's own words,
// and the peer itself is the client.
func TestClientIPFromUntrustedPeer(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	untrusted, proxy := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("10.1.2.3")
	for _, tc := range []struct {
		h      httplimit.ProxyHeader
		values []string
	}{
		{httplimit.XForwardedFor, []string{"198.51.100.1"}},
		{httplimit.Forwarded, []string{"for=198.51.100.1"}},
	} {
		if got := httplimit.ClientIPFrom(untrusted, tc.h, tc.values, trusted); got != untrusted {
			t.Errorf("header %v from an untrusted peer: %v, want the peer %v", tc.h, got, untrusted)
		}
		if got, want := httplimit.ClientIPFrom(proxy, tc.h, tc.values, trusted), netip.MustParseAddr("198.51.100.1"); got != want {
			t.Errorf("header %v from a trusted proxy: %v, want %v", tc.h, got, want)
		}
	}
}

// TestForwardedObfuscatedPort: RFC 7239 lets a proxy hide the port of a
// node it names by address ("192.0.2.43:_hidden", node-port = obfport).
// The address is still the one the trusted proxy saw, so it is the
// client; only an obfuscated node name is not an address. Read as a
// malformed entry, every client of such a proxy would share its key.
func TestForwardedObfuscatedPort(t *testing.T) {
	trusted := []netip.Prefix{mustPrefix("127.0.0.1/32"), mustPrefix("10.0.0.0/8")}
	for _, c := range []struct{ line, want string }{
		{`for="192.0.2.43:_hidden"`, "192.0.2.43"},
		{`for=192.0.2.43:_hidden`, "192.0.2.43"},
		{`for="[2001:db8:cafe::17]:_p.1-x"`, "2001:db8:cafe::17"},
		{`for=6.6.6.6, for="192.0.2.43:_a", for="10.0.0.2:_b"`, "192.0.2.43"},
		{`for="192.0.2.43:_"`, "127.0.0.1"},    // obfport needs a character after "_"
		{`for="192.0.2.43:_a b"`, "127.0.0.1"}, // and only these characters
		{`for="_hidden:_port"`, "127.0.0.1"},   // an obfuscated node is no address
		{`for="2001:db8::17:_p"`, "127.0.0.1"}, // an IPv6 node with a port is bracketed
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "127.0.0.1:1"
		r.Header.Set("Forwarded", c.line)
		got, err := httplimit.ClientIP(r, httplimit.Forwarded, trusted)
		require.NoError(t, err)
		assert.Equal(t, c.want, got.String(), c.line)
	}
}
