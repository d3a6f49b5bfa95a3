package httplimit

import (
	"strconv"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// quota is what a primary band's name stands for: its capacity and its
// rate, the rate in one form (TokensPerSecond n is n per second), since the
// two ways of writing one rate decide alike.
type quota struct {
	capacity int64
	rate     policy.Rate
}

func quotaOf(l policy.Limit) quota { return quota{l.Capacity, l.Rate()} }

// appendPrimaryName appends, as a structured-field String, the name of the
// primary band of the limit a key resolves to: o's when overridden, else
// the policy's default, whose quota is def. bands are the key's other
// bands, whose names it must not take. The rule, which keeps two different
// quotas from ever sharing a primary name under one policy:
//
//   - The default limit is named by WithPolicyName (P, "default" unless set).
//   - An override with a Name is named by it, unless that Name is another
//     quota's: P while the override's quota is not the default's, or a
//     derived name (below) of a quota other than its own. Then it is named
//     as if it had no Name.
//   - An override without a Name (or with another quota's) is named P when
//     its quota is the default's, and otherwise by its derived name.
//   - The derived name of a quota is "P-<capacity>-<tokens>" for a rate per
//     second ("default-7-2"), and "P-<capacity>-<tokens>/<period>" for any
//     other ("default-10-100/1m"), the period written by appendPeriod.
//   - A name that is one of the key's band names (a band named P, or like
//     a derived name) is not taken: the primary is named by its derived
//     name instead, and if a band has that too, by the derived name and
//     "-1", "-2", ..., the first that no band has.
//
// policy.NewOverrideSet already refuses one Name for two limits and a band
// that has its override's Name, and derived names are distinct for
// distinct quotas, so only these cases remain.
func (f Fields) appendPrimaryName(buf []byte, def quota, o policy.Override, overridden bool, bands *policy.BandSet) []byte {
	var own quota
	var name string
	switch {
	case !overridden:
		own, name = def, f.policyName
	default:
		own = quotaOf(policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill})
		switch {
		case o.Name != "" && f.nameFits(o.Name, own, def):
			name = o.Name
		case own == def:
			name = f.policyName
		}
	}
	if name != "" && bands.Index(name) < 0 {
		return appendSFString(buf, name)
	}

	// The derived name, built raw after buf's end (the policy name may need
	// escaping), then quoted in place of it.
	at := len(buf)
	raw := f.appendDerived(buf, own)
	derivedEnd := len(raw)
	for k := 1; isBand(bands, raw[at:]); k++ { // at most Len()+1 tries
		raw = append(raw[:derivedEnd], '-')
		raw = strconv.AppendInt(raw, int64(k), 10)
	}
	rawLen := len(raw) - at
	// Quoting writes at least as many bytes as it reads, so it must read from
	// a copy: append the quoted form after the raw one and move it down.
	raw = appendSFString(raw, raw[at:at+rawLen])
	n := copy(raw[at:], raw[at+rawLen:])
	return raw[:at+n]
}

// isBand reports whether name is the name of one of bands.
func isBand(bands *policy.BandSet, name []byte) bool {
	for i := range bands.Len() {
		if string(name) == bands.At(i).Name { // compared in place, not converted
			return true
		}
	}
	return false
}

// appendDerived appends the raw derived name of q: P, '-', the capacity,
// '-', the tokens, and for a period other than a second '/' and the period.
func (f Fields) appendDerived(buf []byte, q quota) []byte {
	buf = append(buf, f.policyName...)
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
// first. "us" is a microsecond: a name is ASCII.
var periodUnits = [...]struct {
	suffix string
	ns     time.Duration
}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}, {"us", time.Microsecond}, {"ns", time.Nanosecond}}

// periodUnit returns the index in periodUnits of the largest unit that per
// (>= 1) is a whole number of.
func periodUnit(per time.Duration) int {
	for i, u := range periodUnits {
		if per%u.ns == 0 {
			return i
		}
	}
	return len(periodUnits) - 1 // unreachable: every period is whole ns
}

// appendPeriod writes per as a whole number of the largest unit it is a
// whole number of: "1m", "24h", "3s", "1500ms", "7ns". Each period has
// one such form.
func appendPeriod(buf []byte, per time.Duration) []byte {
	u := periodUnits[periodUnit(per)]
	buf = strconv.AppendInt(buf, int64(per/u.ns), 10)
	return append(buf, u.suffix...)
}

// nameFits reports whether an override whose quota is own may answer under
// its Name: unless the name is P and own is not the default def, or the
// name is derived from a quota other than own.
func (f Fields) nameFits(name string, own, def quota) bool {
	if name == f.policyName {
		return own == def
	}
	if derived, ok := f.parseDerived(name); ok {
		return derived == own
	}
	return true
}

// parseDerived returns the quota that name is the derived name of, as
// appendDerived writes it (every number in canonical decimal, the period
// in its one form), with or without the suffix "-k" appendPrimaryName adds
// when a band has the name, and false when it is not one.
func (f Fields) parseDerived(name string) (quota, bool) {
	if q, ok := f.parseUnsuffixed(name); ok {
		return q, true
	}
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		if _, ok := parsePositive(name[i+1:]); ok {
			return f.parseUnsuffixed(name[:i])
		}
	}
	return quota{}, false
}

// parseUnsuffixed is parseDerived for a name as appendDerived writes it.
func (f Fields) parseUnsuffixed(name string) (quota, bool) {
	p := f.policyName
	if len(name) <= len(p)+1 || name[:len(p)] != p || name[len(p)] != '-' {
		return quota{}, false
	}
	rest := name[len(p)+1:]
	dash := indexByte(rest, '-')
	if dash < 0 {
		return quota{}, false
	}
	c, okC := parsePositive(rest[:dash])
	rate := rest[dash+1:]
	per, period := time.Second, ""
	if slash := indexByte(rate, '/'); slash >= 0 {
		rate, period = rate[:slash], rate[slash+1:]
	}
	n, okN := parsePositive(rate)
	if !okC || !okN {
		return quota{}, false
	}
	if period != "" {
		var ok bool
		if per, ok = parsePeriod(period); !ok || per == time.Second {
			return quota{}, false // a second is written without a period
		}
	}
	return quota{c, policy.Rate{Tokens: n, Per: per}}, true
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
		return per, periodUnit(per) == i // "60s" is "1m"
	}
	return 0, false
}

// parsePositive parses s as strconv.FormatInt writes a positive int64: only
// digits, no leading zero.
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

func indexByte(s string, c byte) int {
	for i := range len(s) {
		if s[i] == c {
			return i
		}
	}
	return -1
}
