package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// ProxyHeader names the request header that trusted reverse proxies use to
// report the address of the peer they received a request from. Only the
// header your proxies write may be read: a header they pass through
// untouched is whatever the client wanted it to be. The zero value is not a
// header; ClientIP then ignores headers.
type ProxyHeader int

// The headers a ProxyHeader can name.
const (
	// XForwardedFor is the de facto X-Forwarded-For: a comma-separated list
	// of addresses, each proxy appending the peer it saw.
	XForwardedFor ProxyHeader = iota + 1
	// Forwarded is RFC 7239's Forwarded header; its for= parameters are
	// read, in element order, each proxy appending one element.
	Forwarded
)

// String returns the header's name.
func (h ProxyHeader) String() string {
	switch h {
	case XForwardedFor:
		return "X-Forwarded-For"
	case Forwarded:
		return "Forwarded"
	}
	return "ProxyHeader(invalid)"
}

// ClientIP returns the address of the client that sent r.
//
// With no trusted prefixes, or when the direct peer (r.RemoteAddr) is not
// in one, it is the peer's address and no header is read: a client can
// write any header it likes, so trusting one by default would let every
// client choose its own rate-limit key.
//
// When the peer is a trusted proxy, ClientIP walks header h from right to
// left (the right-most entry was appended by the nearest proxy) and returns
// the first address that is not in a trusted prefix, so entries a client
// wrote in front of its own are never used. If every entry is trusted it
// returns the left-most one. An entry that is not an address (garbage,
// RFC 7239's "unknown" or an obfuscated identifier) ends the walk at the
// trusted proxy that wrote it, whose address is returned: the chain beyond
// it cannot be checked.
//
// Addresses are returned without zone, and IPv4-mapped IPv6 addresses (and
// prefixes) are taken as IPv4. It fails with ErrNoClientIP only when RemoteAddr holds no address.
func ClientIP(r *http.Request, h ProxyHeader, trusted []netip.Prefix) (netip.Addr, error) {
	peer, ok := parseHop(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, ErrNoClientIP
	}
	if !isTrusted(peer, trusted) {
		return peer, nil
	}
	var hops []string
	switch h {
	case XForwardedFor:
		hops = xffHops(r.Header.Values("X-Forwarded-For"))
	case Forwarded:
		hops = forwardedHops(r.Header.Values("Forwarded"))
	default:
		return peer, nil
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			return client, nil
		}
		client = a
		if !isTrusted(a, trusted) {
			return a, nil
		}
	}
	return client, nil
}

// isTrusted reports whether a is in one of the prefixes; an IPv4-mapped
// IPv6 prefix is taken as the IPv4 prefix it maps.
func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Addr().Is4In6() {
			p = normalizePrefix(p)
		}
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHop parses one address as proxies write it: "192.0.2.1",
// "192.0.2.1:443", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:443".
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(s); err == nil {
		a = ap.Addr()
	} else if inner, ok := strings.CutPrefix(s, "["); ok && strings.HasSuffix(inner, "]") {
		if a, err = netip.ParseAddr(inner[:len(inner)-1]); err != nil {
			return netip.Addr{}, false
		}
	} else if a, err = netip.ParseAddr(s); err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// normalizePrefix masks p and rewrites an IPv4-mapped IPv6 prefix as IPv4,
// since ClientIP compares unmapped addresses.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// xffHops splits X-Forwarded-For field lines into entries, in order.
func xffHops(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for hop := range strings.SplitSeq(line, ",") {
			hops = append(hops, hop)
		}
	}
	return hops
}

// forwardedHops returns the for= value of each RFC 7239 element, in order,
// unquoted; an element without one gives "", which parseHop rejects.
func forwardedHops(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, elem := range splitQuoted(line, ',') {
			node := ""
			for _, pair := range splitQuoted(elem, ';') {
				name, value, ok := strings.Cut(pair, "=")
				if ok && strings.EqualFold(strings.TrimSpace(name), "for") {
					node = unquote(strings.TrimSpace(value))
					break
				}
			}
			hops = append(hops, node)
		}
	}
	return hops
}

// splitQuoted splits s at sep outside quoted strings.
func splitQuoted(s string, sep byte) []string {
	var parts []string
	quoted, escaped, start := false, false, 0
	for i := range len(s) {
		switch c := s[i]; {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// unquote undoes an RFC 7230 quoted-string; a token is returned as it is.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
