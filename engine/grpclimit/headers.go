package grpclimit

import (
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// The metadata keys of WithHeaders: the RateLimit-Policy and RateLimit
// fields of the IETF httpapi draft, lower-case as gRPC metadata keys are.
const (
	PolicyHeader    = "ratelimit-policy"
	RateLimitHeader = "ratelimit"
)

// This file writes the RateLimit fields exactly as package httplimit does
// (its setRateLimit and primary-name rules, which it does not export);
// TestHeadersMatchHTTP holds the two to the same output for the same
// decisions.

// maxSFInteger is the largest Integer a structured field may carry (RFC
// 9651 section 3.3.1: at most 15 digits); larger values are saturated.
const maxSFInteger = 999_999_999_999_999

// sfInteger clamps v to the range of a non-negative structured-field
// Integer.
func sfInteger(v int64) int64 { return min(max(v, 0), maxSFInteger) }

// ceilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// rateLimitMD returns the RateLimit fields of a bucket's decision d on key.
//
// ratelimit-policy lists every band of the limit key resolves to under the
// policy in force, its primary band first, each as name;q=capacity;w=the
// seconds an empty band takes to fill. ratelimit is the band that bound the
// decision: name;r=whole tokens left;t=seconds, t being the time until the
// band is full when admitted, and the retry delay in whole seconds (at
// least 1) when denied.
func (l *Limiter) rateLimitMD(key string, d engine.Decision) metadata.MD {
	p := l.engine.Policy()
	o, overridden := p.Overrides.Lookup(key)
	primary, bands, shapeName := p.Limit(), p.Bands, ""
	if overridden {
		primary = policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill}
		bands, shapeName = o.Bands, o.Name
	}
	t := ceilSeconds(d.ResetAfter)
	if !d.Allowed {
		t = max(ceilSeconds(d.RetryAfter), 1)
	}

	var stack [2048]byte
	buf := stack[:0]
	buf = l.appendPrimaryName(buf, quotaOf(p.Limit()), o, overridden, bands)
	nameEnd := len(buf)
	buf = appendBand(buf, primary.Capacity, primary.Rate())
	for i := range bands.Len() {
		b := bands.At(i)
		buf = append(buf, ", "...)
		buf = appendSFString(buf, b.Name)
		buf = appendBand(buf, b.Capacity, b.Refill)
	}
	policyEnd := len(buf)
	switch {
	case d.Band == "" || d.Band == shapeName:
		buf = append(buf, buf[:nameEnd]...)
	default:
		buf = appendSFString(buf, d.Band)
	}
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, sfInteger(d.Remaining), 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, sfInteger(t), 10)
	fields := string(buf)
	return metadata.MD{PolicyHeader: {fields[:policyEnd]}, RateLimitHeader: {fields[policyEnd:]}}
}

// appendBand appends the parameters of one ratelimit-policy item.
func appendBand(buf []byte, capacity int64, rate policy.Rate) []byte {
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, sfInteger(capacity), 10)
	buf = append(buf, ";w="...)
	return strconv.AppendInt(buf, sfInteger(rate.WindowSeconds(max(capacity, 1))), 10)
}

// appendSFString appends name as a structured-field String: quoted, with
// '"' and '\' escaped.
func appendSFString[S ~string | ~[]byte](buf []byte, name S) []byte {
	buf = append(buf, '"')
	for i := range len(name) {
		if c := name[i]; c == '"' || c == '\\' {
			buf = append(buf, '\\')
		}
		buf = append(buf, name[i])
	}
	return append(buf, '"')
}

// quota is what a primary band's name stands for: its capacity and its
// rate, in one form.
type quota struct {
	capacity int64
	rate     policy.Rate
}

func quotaOf(l policy.Limit) quota { return quota{l.Capacity, l.Rate()} }

// appendPrimaryName appends, quoted, the name of the primary band of the
// limit a key resolves to, by httplimit's rule, which keeps two quotas
// from ever sharing a name under one policy: the default limit is the
// policy name P; an override is its Name unless that is another quota's
// (P, or the derived name of another quota), else P when its quota is the
// default's, else its derived name "P-<capacity>-<tokens>[/<period>]"; a
// name one of the key's bands has is not taken, the derived name (then
// with "-1", "-2"...) is used instead.
func (l *Limiter) appendPrimaryName(buf []byte, def quota, o policy.Override, overridden bool, bands *policy.BandSet) []byte {
	var own quota
	var name string
	switch {
	case !overridden:
		own, name = def, l.policyName
	default:
		own = quotaOf(policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill})
		switch {
		case o.Name != "" && l.nameFits(o.Name, own, def):
			name = o.Name
		case own == def:
			name = l.policyName
		}
	}
	if name != "" && bands.Index(name) < 0 {
		return appendSFString(buf, name)
	}
	at := len(buf)
	raw := l.appendDerived(buf, own)
	derivedEnd := len(raw)
	for k := 1; isBand(bands, raw[at:]); k++ {
		raw = append(raw[:derivedEnd], '-')
		raw = strconv.AppendInt(raw, int64(k), 10)
	}
	rawLen := len(raw) - at
	raw = appendSFString(raw, raw[at:at+rawLen])
	n := copy(raw[at:], raw[at+rawLen:])
	return raw[:at+n]
}

// isBand reports whether name is the name of one of bands.
func isBand(bands *policy.BandSet, name []byte) bool {
	for i := range bands.Len() {
		if string(name) == bands.At(i).Name {
			return true
		}
	}
	return false
}

// appendDerived appends the raw derived name of q.
func (l *Limiter) appendDerived(buf []byte, q quota) []byte {
	buf = append(buf, l.policyName...)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, q.capacity, 10)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, q.rate.Tokens, 10)
	if q.rate.Per != time.Second {
		buf = append(buf, '/')
		buf = appendPeriod(buf, q.rate.Per)
	}
	return buf
}

// periodUnits are the units a derived name writes a period in, largest
// first.
var periodUnits = [...]struct {
	suffix string
	ns     time.Duration
}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}, {"us", time.Microsecond}, {"ns", time.Nanosecond}}

// periodUnit returns the index of the largest unit per is a whole number of.
func periodUnit(per time.Duration) int {
	for i, u := range periodUnits {
		if per%u.ns == 0 {
			return i
		}
	}
	return len(periodUnits) - 1
}

// appendPeriod writes per in the largest unit it is a whole number of.
func appendPeriod(buf []byte, per time.Duration) []byte {
	u := periodUnits[periodUnit(per)]
	buf = strconv.AppendInt(buf, int64(per/u.ns), 10)
	return append(buf, u.suffix...)
}

// nameFits reports whether an override whose quota is own may answer
// under name.
func (l *Limiter) nameFits(name string, own, def quota) bool {
	if name == l.policyName {
		return own == def
	}
	if derived, ok := l.parseDerived(name); ok {
		return derived == own
	}
	return true
}

// parseDerived returns the quota name is the derived name of, if it is one.
func (l *Limiter) parseDerived(name string) (quota, bool) {
	p := l.policyName
	if len(name) <= len(p)+1 || name[:len(p)] != p || name[len(p)] != '-' {
		return quota{}, false
	}
	rest := name[len(p)+1:]
	capText, rate, ok := cut(rest, '-')
	if !ok {
		return quota{}, false
	}
	c, okC := parsePositive(capText)
	per, period := time.Second, ""
	if r, pd, ok := cut(rate, '/'); ok {
		rate, period = r, pd
	}
	n, okN := parsePositive(rate)
	if !okC || !okN {
		return quota{}, false
	}
	if period != "" {
		var ok bool
		if per, ok = parsePeriod(period); !ok || per == time.Second {
			return quota{}, false
		}
	}
	return quota{c, policy.Rate{Tokens: n, Per: per}}, true
}

// cut splits s at its first c.
func cut(s string, c byte) (before, after string, found bool) {
	for i := range len(s) {
		if s[i] == c {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// parsePeriod parses a period as appendPeriod writes it, and only so.
func parsePeriod(s string) (time.Duration, bool) {
	digits := 0
	for digits < len(s) && s[digits] >= '0' && s[digits] <= '9' {
		digits++
	}
	v, ok := parsePositive(s[:digits])
	if !ok {
		return 0, false
	}
	for i, u := range periodUnits {
		if s[digits:] != u.suffix {
			continue
		}
		if v > int64(time.Duration(1<<63-1)/u.ns) {
			return 0, false
		}
		per := time.Duration(v) * u.ns
		return per, periodUnit(per) == i
	}
	return 0, false
}

// parsePositive parses s as strconv.FormatInt writes a positive int64.
func parsePositive(s string) (int64, bool) {
	if s == "" || s[0] < '1' || s[0] > '9' {
		return 0, false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}
