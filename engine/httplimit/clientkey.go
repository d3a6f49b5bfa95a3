package httplimit

import "net/netip"

// IPv6 grouping bounds and default.
const (
	// DefaultIPv6Prefix is the prefix length that groups IPv6 clients when
	// WithIPv6Prefix is not given. A /64 is one subnet, the block a host
	// picks its addresses from (SLAAC, privacy addresses), so one host can
	// rotate through 2^64 addresses inside it: keyed per address, it would
	// never be limited and would fill the engine's key table.
	DefaultIPv6Prefix = 64
	// MinIPv6Prefix is the shortest prefix WithIPv6Prefix accepts: a /32 is
	// the usual block a registry allocates to one provider, so a shorter
	// one would put several providers' customers in one bucket.
	MinIPv6Prefix = 32
)

// nat64WellKnown is RFC 6052's well-known NAT64 prefix, whose addresses
// embed an IPv4 address in their last 32 bits.
var nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")

// maxClientKey is the longest key ClientKey returns: an uncompressed IPv6
// prefix of 128 bits.
const maxClientKey = len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")

// ClientKey returns the rate-limit key of the client at address a, the key
// the middleware uses by default; it is exported for other transports (a
// gRPC interceptor) that should key clients the same way.
//
//   - An IPv4 address is its own key, in dotted-decimal form: "203.0.113.7".
//   - An IPv4-mapped IPv6 address (::ffff:203.0.113.7) is that IPv4 address,
//     with the same key.
//   - An address in the well-known NAT64 prefix 64:ff9b::/96 (RFC 6052),
//     64:ff9b::203.0.113.7, is the IPv4 client a NAT64 gateway translated
//     for an IPv6-only server, embedded in its last 32 bits, and has that
//     client's key, "203.0.113.7": grouped by its /64 like other IPv6
//     addresses, every IPv4 client behind the gateway would share one
//     bucket. The local-use prefix 64:ff9b:1::/48 (RFC 8215) and
//     network-specific prefixes are not recognized: their operator chooses
//     where the IPv4 address is embedded, so nothing in the address says
//     which bits it is, and they are grouped as any IPv6 address.
//   - An IPv6 address is grouped by its first ipv6Bits bits: the key is the
//     masked prefix as netip.Prefix.String writes it (RFC 5952 text, then
//     "/" and the length), so with 64 bits 2001:db8:1:2:aaaa::1 and
//     2001:db8:1:2:bbbb::2 are both "2001:db8:1:2::/64", and with 128 bits
//     2001:db8::7 is "2001:db8::7/128". The length is always written, so an
//     IPv6 key never equals an IPv4 one. ipv6Bits outside 0..128 is taken
//     as the nearer bound.
//
// A zone (fe80::1%eth0) is dropped. The zero Addr gives "", which the engine
// rejects as a blank key. ClientKey allocates only the returned string.
func ClientKey(a netip.Addr, ipv6Bits int) string {
	a = a.WithZone("").Unmap()
	if nat64WellKnown.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	var buf [maxClientKey]byte // the text is built here and copied once
	switch {
	case !a.IsValid():
		return ""
	case a.Is4():
		return string(a.AppendTo(buf[:0]))
	}
	p, _ := a.Prefix(min(max(ipv6Bits, 0), 128)) // cannot fail: a is IPv6, the length in range
	return string(p.AppendTo(buf[:0]))
}
