package httplimit

import (
	"iter"
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
// returns the left-most one. The header's field lines are one list, in
// order.
//
// Entries are parsed from the right too, each only as far as its own left
// edge, so nothing a client sends in front of the entry a trusted proxy
// appends, on the same line or not, changes how that entry reads. (Parsed
// from the left, a quote the client leaves open, `for=1.1.1.1;x="`, would
// swallow the proxy's `, for=203.0.113.9` and make the client's own for=
// the right-most one.) The walk ends at the first entry that is not an
// address, or does not parse, and returns the address of the trusted proxy
// that wrote it, the last one a trusted hop vouched for; nothing left of
// that entry is read, since the chain beyond it cannot be checked.
//
// Not an address: garbage, an empty entry, RFC 7239's "unknown", an
// obfuscated identifier, a Forwarded element without for=. An obfuscated
// port does not hide the address before it: for="192.0.2.43:_hidden" is
// 192.0.2.43. A Forwarded element does not parse when it is not
// token=value pairs separated by ";", each value a token or a
// quoted-string with balanced quotes and complete backslash escapes, or
// when it has two for= parameters; an unquoted value may also hold ":",
// "[" and "]", which some proxies leave
// unquoted (for=192.0.2.1:80, for=2001:db8::1). An X-Forwarded-For entry is
// the text between two commas: an address, optionally in brackets or with
// a port.
//
// Addresses are returned without zone, and IPv4-mapped IPv6 addresses (and
// prefixes) are taken as IPv4. It fails with ErrNoClientIP only when
// RemoteAddr holds no address.
func ClientIP(r *http.Request, h ProxyHeader, trusted []netip.Prefix) (netip.Addr, error) {
	peer, ok := parseHop(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, ErrNoClientIP
	}
	if (h != XForwardedFor && h != Forwarded) || !isTrusted(peer, trusted) {
		return peer, nil // the header is not read at all
	}
	return ClientIPFrom(peer, h, r.Header.Values(h.String()), trusted), nil
}

// ClientIPFrom is the walk of ClientIP for a transport other than HTTP/1
// and HTTP/2 requests, such as gRPC metadata: peer is the address of the
// direct peer, and values the field lines of header h, in the order they
// arrived ("x-forwarded-for" metadata for XForwardedFor). It returns
// exactly what ClientIP returns for a request from peer with those lines:
// peer itself when it is not in a trusted prefix (values are then not
// read) or h is neither XForwardedFor nor Forwarded, and otherwise the
// right-most address not in a trusted prefix, with the same rules for
// entries that are not addresses or do not parse.
//
// peer and the result are without zone, and IPv4-mapped IPv6 addresses
// are taken as IPv4. An invalid peer (the zero netip.Addr) is returned as
// it is.
func ClientIPFrom(peer netip.Addr, h ProxyHeader, values []string, trusted []netip.Prefix) netip.Addr {
	if !peer.IsValid() {
		return peer
	}
	peer = peer.WithZone("").Unmap()
	if !isTrusted(peer, trusted) {
		return peer
	}
	var hops iter.Seq[string]
	switch h {
	case XForwardedFor:
		hops = hopsFromRight(values, lastXFFEntry)
	case Forwarded:
		hops = hopsFromRight(values, lastForwardedElement)
	default:
		return peer
	}
	client := peer
	for hop := range hops {
		a, ok := parseHop(hop)
		if !ok {
			return client
		}
		client = a
		if !isTrusted(a, trusted) {
			return a
		}
	}
	return client
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
// "192.0.2.1:443", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:443",
// with optional spaces or tabs around it.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
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

// lastEntry parses the right-most entry of line[:end]. It returns the
// entry's address text (the for= value of a Forwarded element, unquoted),
// whether it parsed, and where the text left of it ends: the entry's
// separating comma is consumed, so next < 0 means the entry began the line.
type lastEntry func(line string, end int) (hop string, ok bool, next int)

// hopsFromRight yields the entries of the field lines, last line first and
// each from its right end, as last parses them; after an entry that does
// not parse it yields "" (which parseHop rejects) and stops, so that
// nothing left of a malformed entry is ever read. An empty line is one
// empty entry.
func hopsFromRight(lines []string, last lastEntry) iter.Seq[string] {
	return func(yield func(string) bool) {
		for i := len(lines) - 1; i >= 0; i-- {
			for end := len(lines[i]); end >= 0; {
				hop, ok, next := last(lines[i], end)
				if !ok {
					yield("")
					return
				}
				if !yield(hop) {
					return
				}
				end = next
			}
		}
	}
}

// lastXFFEntry is the lastEntry of X-Forwarded-For: the text after the
// right-most comma; an address never holds one.
func lastXFFEntry(line string, end int) (string, bool, int) {
	i := strings.LastIndexByte(line[:end], ',')
	return line[i+1 : end], true, i
}

// lastForwardedElement is the lastEntry of RFC 7239's Forwarded:
//
//	element = [ pair ] *( OWS ";" OWS [ pair ] )
//	pair    = token OWS "=" OWS ( value / quoted-string )
//	value   = 1*( tchar / ":" / "[" / "]" )
//
// read from the right end, ending at a comma (with optional whitespace
// before it) or the start of the line. It returns the element's for=
// value, unquoted; an element without one parses, with hop "", which
// parseHop rejects. Two for= parameters, or anything else that does not
// fit the grammar, do not parse.
func lastForwardedElement(line string, end int) (hop string, ok bool, next int) {
	i, hasFor := end, false
	for {
		i = skipOWSLeft(line, i)
		if i == 0 || line[i-1] == ',' {
			return hop, true, i - 1
		}
		if line[i-1] == ';' { // an empty pair
			i--
			continue
		}
		var name, value string
		if name, value, i, ok = lastPair(line, i); !ok {
			return "", false, 0
		}
		if strings.EqualFold(name, "for") {
			if hasFor {
				return "", false, 0
			}
			hop, hasFor = withoutObfuscatedPort(value), true
		}
		i = skipOWSLeft(line, i)
		switch {
		case i == 0 || line[i-1] == ',':
			return hop, true, i - 1
		case line[i-1] != ';':
			return "", false, 0
		}
		i--
	}
}

// withoutObfuscatedPort returns a Forwarded node without its port when
// the port is obfuscated (RFC 7239's obfport, "_" and one or more of
// ALPHA, DIGIT, ".", "_" and "-"), as in "192.0.2.43:_hidden" or
// "[2001:db8::17]:_p": the address is still the one the proxy saw. Any
// other node is returned as it is.
func withoutObfuscatedPort(node string) string {
	i := strings.LastIndexByte(node, ':')
	if i < 0 || len(node) < i+3 || node[i+1] != '_' {
		return node
	}
	for _, c := range []byte(node[i+2:]) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return node
		}
	}
	if name := node[:i]; strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") || !strings.Contains(name, ":") {
		return name
	}
	return node
}

// lastPair parses the pair that ends at line[end-1], right to left: its
// value (unquoted), then "=", then its name. It returns the name, the value
// and where the pair starts.
func lastPair(line string, end int) (name, value string, start int, ok bool) {
	i := end
	if line[i-1] == '"' {
		if value, i, ok = lastQuoted(line, i); !ok {
			return "", "", 0, false
		}
	} else {
		for i > 0 && isValueChar(line[i-1]) {
			i--
		}
		if i == end {
			return "", "", 0, false
		}
		value = line[i:end]
	}
	i = skipOWSLeft(line, i)
	if i == 0 || line[i-1] != '=' {
		return "", "", 0, false
	}
	i = skipOWSLeft(line, i-1)
	nameEnd := i
	for i > 0 && isTChar(line[i-1]) {
		i--
	}
	if i == nameEnd {
		return "", "", 0, false
	}
	return line[i:nameEnd], value, i, true
}

// lastQuoted parses the quoted-string that ends at line[end-1], a '"'. Its
// opening quote is the nearest '"' to the left preceded by an even number of
// backslashes, which no escaped quote is; the text between them must then
// read, left to right, as qdtext and complete quoted-pairs. It returns the
// unescaped content and the opening quote's index.
func lastQuoted(line string, end int) (content string, start int, ok bool) {
	closing := end - 1
	open := -1
	for j := closing - 1; j >= 0 && open < 0; j-- {
		if line[j] != '"' {
			continue
		}
		k := j
		for k > 0 && line[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 {
			open = j
		}
	}
	if open < 0 {
		return "", 0, false
	}
	raw := line[open+1 : closing]
	escapes := 0
	for j := 0; j < len(raw); j++ {
		if c := raw[j]; c == '\\' {
			if j++; j == len(raw) || !isQuotedPairChar(raw[j]) {
				return "", 0, false
			}
			escapes++
		} else if c == '"' || !isQuotedPairChar(c) {
			return "", 0, false
		}
	}
	if escapes == 0 {
		return raw, open, true
	}
	b := make([]byte, 0, len(raw)-escapes)
	for j := 0; j < len(raw); j++ {
		if raw[j] == '\\' {
			j++
		}
		b = append(b, raw[j])
	}
	return string(b), open, true
}

// skipOWSLeft returns i moved left past spaces and tabs.
func skipOWSLeft(s string, i int) int {
	for i > 0 && (s[i-1] == ' ' || s[i-1] == '\t') {
		i--
	}
	return i
}

// isTChar reports whether c may appear in an RFC 9110 token.
func isTChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isValueChar reports whether c may appear in an unquoted Forwarded value:
// a token, or the ":" and brackets of an address and port that some
// proxies leave unquoted.
func isValueChar(c byte) bool {
	return isTChar(c) || c == ':' || c == '[' || c == ']'
}

// isQuotedPairChar reports whether c may follow a backslash in an RFC 9110
// quoted-string: a tab, a space, a visible character or obs-text. Every
// qdtext character is one, except '"' and the backslash itself.
func isQuotedPairChar(c byte) bool {
	return c == '\t' || c == ' ' || ('!' <= c && c <= '~') || c >= 0x80
}
