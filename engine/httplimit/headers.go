package httplimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Header field names. net/http canonicalises them on the wire
// ("Ratelimit-Policy"); field names are case-insensitive, so clients match
// either spelling.
const (
	headerPolicy     = "RateLimit-Policy"
	headerRateLimit  = "RateLimit"
	headerRetryAfter = "Retry-After"
)

// maxSFInteger is the largest Integer a structured field may carry (RFC 9651
// section 3.3.1: at most 15 digits). Larger values are saturated to it, as a
// policy may legally have a capacity up to math.MaxInt64.
const maxSFInteger = 999_999_999_999_999

// sfInteger clamps v to the range of a non-negative structured-field Integer.
func sfInteger(v int64) int64 { return min(max(v, 0), maxSFInteger) }

// ceilSeconds is d in whole seconds, rounded up: 1.2s and 2s are both 2.
// Negative and zero durations are 0.
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

// ceilDiv is ceil(a / b) for a >= 0 and b >= 1, without the overflow of
// (a + b - 1) / b near math.MaxInt64.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// appendSFString appends name as a structured-field String (RFC 9651
// section 4.1.6): quoted, with '"' and '\' escaped. name must be printable
// ASCII, which validPolicyName checks in New and policy.NewOverrideSet for
// an override's Name.
func appendSFString(buf []byte, name string) []byte {
	buf = append(buf, '"')
	for i := range len(name) {
		if c := name[i]; c == '"' || c == '\\' {
			buf = append(buf, '\\')
		}
		buf = append(buf, name[i])
	}
	return append(buf, '"')
}

// validPolicyName reports whether name can be a structured-field String: not
// empty, and only printable ASCII (0x20 to 0x7E).
func validPolicyName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// setRateLimit writes RateLimit-Policy and RateLimit for a decision on key,
// and Retry-After when it is a denial.
//
// The item's name is that of the quota key resolves to (appendQuotaName).
// q is the key's capacity (d.Limit) and w the seconds an empty bucket takes
// to fill: ceil(capacity / rate), with the key's own rate under the policy in
// force. r is d.Remaining. t is ceil(d.ResetAfter) when admitted; when
// denied it is the Retry-After value, because the draft (section 6) says a
// Retry-After SHOULD NOT point earlier than the end of the effective window,
// and until then the client can indeed spend no more than r.
func (m *Middleware) setRateLimit(h http.Header, key string, d engine.Decision) {
	p := m.engine.Policy()
	o, overridden := p.Overrides.Lookup(key) // once per request: the rate and the name
	rate := p.TokensPerSecond
	if overridden {
		rate = o.TokensPerSecond
	}
	w := ceilDiv(max(d.Limit, 0), rate)
	t := ceilSeconds(d.ResetAfter)
	if !d.Allowed {
		t = max(ceilSeconds(d.RetryAfter), 1) // a denial never says "retry now"
		h.Set(headerRetryAfter, strconv.FormatInt(t, 10))
	}

	// One buffer for both fields, which share the name: room for the longest
	// name (an escaped Name, or the policy name and two numbers) and items.
	buf := make([]byte, 0, len(m.quotedName)+2*policy.MaxNameBytes+80)
	buf = m.appendQuotaName(buf, p.Limit(), o, overridden)
	name := len(buf)
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, sfInteger(d.Limit), 10)
	buf = append(buf, ";w="...)
	buf = strconv.AppendInt(buf, sfInteger(w), 10)
	h.Set(headerPolicy, string(buf))

	buf = append(buf[:name], ";r="...)
	buf = strconv.AppendInt(buf, sfInteger(d.Remaining), 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, sfInteger(t), 10)
	h.Set(headerRateLimit, string(buf))
}
