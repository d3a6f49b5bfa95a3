package httplimit

import (
	"strconv"

	"github.com/tokenshard/tokenshard/policy"
)

// appendQuotaName appends, as a structured-field String, the name of the
// quota a key resolves to: o when overridden, else the policy's default
// limit def. The rule, which keeps two different quotas from ever sharing a
// name under one policy:
//
//   - The default limit is named by WithPolicyName (P, "default" unless set).
//   - An override with a Name is named by it, unless that Name is another
//     quota's: P while the override's limit is not the default's, or a
//     derived name (below) of a limit other than its own. Then it is named
//     as if it had no Name.
//   - An override without a Name (or with another quota's) is named P when
//     its limit is the default's, and otherwise "P-<capacity>-<tokens per
//     second>" ("default-7-2").
//
// policy.NewOverrideSet already refuses one Name for two limits, and derived
// names are distinct for distinct limits, so only these two cases remain.
func (m *Middleware) appendQuotaName(buf []byte, def policy.Limit, o policy.Override, overridden bool) []byte {
	lim := policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond}
	switch {
	case !overridden:
		return append(buf, m.quotedName...)
	case o.Name != "" && m.nameFits(o.Name, lim, def):
		return appendSFString(buf, o.Name)
	case lim == def:
		return append(buf, m.quotedName...)
	}
	// The derived name: P's quoted form with "-capacity-rate" before the
	// closing quote, as digits and '-' need no escaping.
	buf = append(buf, m.quotedName[:len(m.quotedName)-1]...)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, lim.Capacity, 10)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, lim.TokensPerSecond, 10)
	return append(buf, '"')
}

// nameFits reports whether an override whose limit is lim may answer under
// its Name: unless the name is P and lim is not the default def, or the
// name is derived from a limit other than lim.
func (m *Middleware) nameFits(name string, lim, def policy.Limit) bool {
	if name == m.policyName {
		return lim == def
	}
	if derived, ok := m.parseDerived(name); ok {
		return derived == lim
	}
	return true
}

// parseDerived returns the limit that name is the derived name of, as
// appendQuotaName writes it ("P-<capacity>-<tokens per second>", both in
// canonical decimal), and false when it is not one.
func (m *Middleware) parseDerived(name string) (policy.Limit, bool) {
	p := m.policyName
	if len(name) <= len(p)+1 || name[:len(p)] != p || name[len(p)] != '-' {
		return policy.Limit{}, false
	}
	rest := name[len(p)+1:]
	for i := range len(rest) {
		if rest[i] != '-' {
			continue
		}
		c, okC := parsePositive(rest[:i])
		r, okR := parsePositive(rest[i+1:])
		return policy.Limit{Capacity: c, TokensPerSecond: r}, okC && okR
	}
	return policy.Limit{}, false
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
