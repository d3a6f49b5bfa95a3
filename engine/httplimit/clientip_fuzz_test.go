package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// The fuzz tests build a request the way a chain of proxies does: the
// client sends arbitrary header text, then each trusted proxy appends one
// well-formed entry naming the peer it received the request from, on the
// last line after a comma or on a line of its own, and the server's peer is
// the last proxy. The answer is derived from the chain alone: the client's
// address when it is not trusted, whatever the client wrote.

// fuzzTrusted are the proxies' prefixes; every proxy a fuzz test builds
// has an address in one.
var fuzzTrusted = []netip.Prefix{mustPrefix("10.0.0.0/8"), mustPrefix("2001:db8:ffff::/48")}

// chainBytes hands out the fuzzer's chain description, zeros once it runs
// out, so every input describes some chain.
type chainBytes []byte

func (b *chainBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

// addr reads an arbitrary address: IPv6 (including IPv4-mapped) if the
// flag's low bit is set, else IPv4.
func (b *chainBytes) addr() netip.Addr {
	if b.next()&1 == 0 {
		return netip.AddrFrom4([4]byte{b.next(), b.next(), b.next(), b.next()})
	}
	var a [16]byte
	for i := range a {
		a[i] = b.next()
	}
	return netip.AddrFrom16(a)
}

// proxy reads a trusted proxy's address: in 10.0.0.0/8, or in
// 2001:db8:ffff::/48 when v6.
func (b *chainBytes) proxy(v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 13: b.next(), 14: b.next(), 15: b.next()})
	}
	return netip.AddrFrom4([4]byte{10, b.next(), b.next(), b.next()})
}

// isFuzzTrusted is the reference trust test: a is unmapped, as ClientIP
// compares addresses.
func isFuzzTrusted(a netip.Addr) bool {
	return slices.ContainsFunc(fuzzTrusted, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) })
}

// entry is the well-formed entry a proxy writes for peer a in header h,
// in one of a few forms chosen by form.
func entry(h httplimit.ProxyHeader, a netip.Addr, form byte) string {
	ap := netip.AddrPortFrom(a, 4711).String()
	if h == httplimit.XForwardedFor {
		switch form % 3 {
		case 1:
			return ap
		case 2:
			if a.Is6() {
				return "[" + a.String() + "]"
			}
		}
		return a.String()
	}
	node := a.String()
	if a.Is6() {
		node = `"[` + node + `]"`
	}
	switch form % 4 {
	case 1:
		return `for="` + ap + `"`
	case 2:
		return `proto=https;For=` + node + `;host="example.com"`
	case 3:
		return `by="[2001:db8:ffff::1]";for=` + node
	}
	return "for=" + node
}

// fuzzClientIP builds the request that client (the client's header text;
// each "\n" starts another field line) and chain describe, and checks
// ClientIP's answer against the one the chain determines.
func fuzzClientIP(t *testing.T, h httplimit.ProxyHeader, client string, chain []byte) {
	b := chainBytes(chain)
	mode := b.next()
	var lines []string
	if mode&1 != 0 { // the client sent the header
		lines = strings.Split(client, "\n")
	}
	clientLines := slices.Clone(lines)

	// first is the address the first trusted proxy received the request
	// from: the client, or an untrusted proxy, which may also have written
	// anything. It is trusted only when mode says so.
	var first netip.Addr
	if mode&4 != 0 {
		first = b.proxy(mode&8 != 0)
	} else {
		first = b.addr()
	}
	from, peer := first, netip.Addr{}
	for range 1 + b.next()%4 {
		flags := b.next()
		e := entry(h, from, flags>>2)
		switch {
		case flags&1 != 0 || len(lines) == 0:
			lines = append(lines, e)
		case flags&2 != 0:
			lines[len(lines)-1] += "," + e
		default:
			lines[len(lines)-1] += ", " + e
		}
		peer = b.proxy(flags&0x80 != 0)
		from = peer
	}
	want := first.Unmap()
	if mode&2 != 0 {
		// No trusted proxy in front: the peer is untrusted, and the header,
		// whoever wrote it, is not read.
		peer = netip.AddrFrom4([4]byte{203, 0, 113, b.next()})
		want = peer
	}

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = netip.AddrPortFrom(peer, 443).String()
	for _, line := range lines {
		r.Header.Add(h.String(), line)
	}
	got, err := httplimit.ClientIP(r, h, fuzzTrusted)
	require.NoError(t, err)
	if mode&2 != 0 || !isFuzzTrusted(first) {
		require.Equal(t, want, got, "header %q from %s", lines, r.RemoteAddr)
		return
	}

	// The first proxy received the request from a trusted host, which
	// vouches for what it wrote: the answer is what that host's own request
	// gives, whatever the proxies appended.
	direct := httptest.NewRequest(http.MethodGet, "/", nil)
	direct.RemoteAddr = netip.AddrPortFrom(first, 443).String()
	for _, line := range clientLines {
		direct.Header.Add(h.String(), line)
	}
	wantDirect, err := httplimit.ClientIP(direct, h, fuzzTrusted)
	require.NoError(t, err)
	require.Equal(t, wantDirect, got, "header %q from %s, and %q from %s", lines, r.RemoteAddr, clientLines, direct.RemoteAddr)
}

// fuzzSeeds are client header texts that once let a client choose its
// key, or near them, with chains that put one proxy or three, on the same
// line or new ones, in front of an untrusted or a trusted client.
func fuzzSeeds(f *testing.F, texts ...string) {
	chains := [][]byte{
		{1, 0, 203, 0, 113, 9, 0, 0},                   // client 203.0.113.9, one proxy appending on its line
		{1, 0, 203, 0, 113, 9, 0, 2},                   // no space after the comma
		{1, 0, 203, 0, 113, 9, 0, 1},                   // the proxy on a line of its own
		{1, 0, 203, 0, 113, 9, 2, 4, 1, 2, 3, 9, 5, 6}, // three proxies, other forms
		{1, 1, 0x20, 1, 0xd, 0xb8, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0x84, 1, 2, 3}, // an IPv6 client, an IPv6 proxy
		{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 203, 0, 113, 9, 0, 8},           // an IPv4-mapped client
		{5, 1, 2, 3, 0, 0, 7, 7, 7},                    // a trusted client, then one proxy
		{13, 1, 2, 3, 1, 0x81, 4, 5, 6, 0x0c, 7, 8, 9}, // a trusted IPv6 client, then two proxies
		{3, 0, 203, 0, 113, 9, 0, 0, 0, 0, 0, 77},      // an untrusted peer
		{0, 0, 203, 0, 113, 9, 1, 0, 3},                // no client header, two proxies
	}
	for _, text := range texts {
		for _, c := range chains {
			f.Add(text, c)
		}
	}
}

// With X-Forwarded-For, the client's text never decides the key when the
// client is not trusted.
func FuzzClientIPXForwardedFor(f *testing.F) {
	fuzzSeeds(f, "", "1.1.1.1", `1.1.1.1"`, `"1.1.1.1`, "6.6.6.6, 1.1.1.1", "1.1.1.1,", ", ,", "[2001:db8::1]:80", "10.0.0.9",
		"1.1.1.1\n2.2.2.2", "1.1.1.1\n", "fe80::1%eth0, 10.0.0.1")
	f.Fuzz(func(t *testing.T, client string, chain []byte) {
		fuzzClientIP(t, httplimit.XForwardedFor, client, chain)
	})
}

// With Forwarded, no quote, escape or separator the client writes can
// make the proxies' elements read otherwise, nor decide the key when the
// client is not trusted.
func FuzzClientIPForwarded(f *testing.F) {
	fuzzSeeds(f, "", `for=1.1.1.1;x="`, `for=1.1.1.1;x="\`, `for="1.1.1.1`, `for=1.1.1.1;x="\"`, `"`, `\`, `for=1.1.1.1;`,
		`for=1.1.1.1,`, `for=1.1.1.1;x="a\"b"`, `for="[2001:db8::1]:80";proto=http`, `for=1.1.1.1;for=2.2.2.2`,
		"for=1.1.1.1;x=\"\nfor=2.2.2.2;y=\"", `for=10.0.0.9`, `for=unknown`, `for=_x, for=1.1.1.1 ;  by=x`)
	f.Fuzz(func(t *testing.T, client string, chain []byte) {
		fuzzClientIP(t, httplimit.Forwarded, client, chain)
	})
}
