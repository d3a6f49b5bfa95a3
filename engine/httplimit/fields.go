package httplimit

import (
	"fmt"
	"strconv"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Fields writes the RateLimit-Policy and RateLimit fields of a decision
// exactly as the middleware does, for a transport other than net/http's
// headers (package grpclimit sends them as gRPC metadata). Make one with
// NewFields; a Fields is immutable, safe for concurrent use, and may be
// copied.
type Fields struct {
	policyName string // the default limit's quota name
}

// NewFields returns the Fields of a limiter whose default limit's quota is
// named policyName, as WithPolicyName names it ("" means
// DefaultPolicyName). Errors: ErrInvalidOption for a name WithPolicyName
// refuses.
func NewFields(policyName string) (Fields, error) {
	if policyName == "" {
		policyName = DefaultPolicyName
	}
	if !validPolicyName(policyName) {
		return Fields{}, fmt.Errorf("%w: policy name %q: want non-empty printable ASCII", ErrInvalidOption, policyName)
	}
	return Fields{policyName: policyName}, nil
}

// Append appends to buf the value of the RateLimit-Policy field for the
// decision d on key under p, the policy in force, then the value of the
// RateLimit field, and returns buf and where the first ends.
//
// RateLimit-Policy lists every band of the limit key resolves to under p:
// first its primary band, named by the naming rule of the package
// documentation, then each band of its BandSet under the band's Name. An
// item's q is the band's capacity and w the seconds an empty band takes to
// fill at its rate, rounded up (policy.Rate.WindowSeconds).
//
// RateLimit is one item, for the band that bound the decision (d.Band, ""
// or the override's Name for the primary), under the name it has in
// RateLimit-Policy. r is d.Remaining, that band's whole tokens left: 0 for
// a band in debt (a negative Remaining: see engine.Engine.Charge), and at
// most the largest integer a structured field holds. t is
// ceil(d.ResetAfter), the time until that band is full, when admitted; when
// denied it is the Retry-After value (ceil(d.RetryAfter), at least 1),
// because the draft says a Retry-After SHOULD NOT point earlier than the
// end of the effective window, and until then the client can indeed spend
// no more than r.
func (f Fields) Append(buf []byte, p policy.Policy, key string, d engine.Decision) ([]byte, int) {
	o, overridden := p.Overrides.Lookup(key) // once per request: the limit and the name
	primary, bands, shapeName := p.Limit(), p.Bands, ""
	if overridden {
		primary = policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill}
		bands, shapeName = o.Bands, o.Name
	}
	nameStart := len(buf)
	buf = f.appendPrimaryName(buf, quotaOf(p.Limit()), o, overridden, bands)
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
		buf = append(buf, buf[nameStart:nameEnd]...)
	default:
		// A band of the key's limit; or, when a cutover came between the
		// decision and Policy, the band that decided, by its name.
		buf = appendSFString(buf, d.Band)
	}
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, sfInteger(d.Remaining), 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, sfInteger(fieldT(d)), 10)
	return buf, policyEnd
}

// fieldT is RateLimit's t for d, and Retry-After's value when d is a
// denial: a denial never says "retry now".
func fieldT(d engine.Decision) int64 {
	if !d.Allowed {
		return max(ceilSeconds(d.RetryAfter), 1)
	}
	return ceilSeconds(d.ResetAfter)
}
