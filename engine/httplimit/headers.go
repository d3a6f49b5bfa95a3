package httplimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Header field names, as net/http.Header keys them (CanonicalHeaderKey of
// the draft's "RateLimit-Policy" and "RateLimit"), so they can be stored
// without Header.Set canonicalising them again, which allocates. They go on
// the wire so spelled; field names are case-insensitive, so clients match
// either spelling.
const (
	headerPolicy     = "Ratelimit-Policy"
	headerRateLimit  = "Ratelimit"
	headerRetryAfter = "Retry-After"
)

// maxSFInteger is the largest Integer a structured field may carry (RFC 9651
// section 3.3.1: at most 15 digits). Larger values are saturated to it, as a
// policy may legally have a capacity up to math.MaxInt64.
const maxSFInteger = 999_999_999_999_999

// sfInteger clamps v to the range of a non-negative structured-field Integer.
func sfInteger(v int64) int64 { return min(max(v, 0), maxSFInteger) }

// ceilSeconds is d in whole seconds, rounded up: 1.2s and 2s are both 2.
// Negative and zero durations are 0, and none is above the longest
// Duration's whole seconds: a client that multiplies a Retry-After by a
// second (time.Duration(n) * time.Second) would overflow to a wait below
// 0, and retry at once.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 && s < math.MaxInt64/int64(time.Second) {
		s++
	}
	return s
}

// appendSFString appends name as a structured-field String (RFC 9651
// section 4.1.6): quoted, with '"' and '\' escaped. name must be printable
// ASCII, which validPolicyName checks in New and policy.NewOverrideSet for
// an override's Name.
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

// setRateLimit writes RateLimit-Policy and RateLimit for a decision on key
// (Fields.Append says what they hold), and Retry-After when it is a denial:
// the t of RateLimit.
//
// Under WithShadow there is no Retry-After, and the items are added to any
// the fields already have (see WithShadow).
//
// The fields are built in one stack buffer and stored as one string and one
// slice of values, set under their canonical keys (which net/http.Header.Set
// would compute, allocating): two allocations per request, at any number of
// bands.
func (m *Middleware) setRateLimit(h http.Header, key string, d engine.Decision) {
	// Room for a primary name and every band's item, each name up to
	// MaxNameBytes escaped; a longer policy name grows buf on the heap.
	var stack [2048]byte
	buf, policyEnd := m.fields.Append(stack[:0], m.engine.Policy(), key, d)
	limitEnd := len(buf)
	if !d.Allowed {
		buf = strconv.AppendInt(buf, fieldT(d), 10)
	}

	if m.shadow {
		// Never a Retry-After: nothing is refused. The items join any an
		// outer middleware set, as one List each.
		h[headerPolicy] = []string{joinList(h[headerPolicy], buf[:policyEnd])}
		h[headerRateLimit] = []string{joinList(h[headerRateLimit], buf[policyEnd:limitEnd])}
		return
	}
	fields := string(buf)
	n := 2
	if !d.Allowed {
		n = 3
	}
	vals := make([]string, n)
	vals[0], vals[1] = fields[:policyEnd], fields[policyEnd:limitEnd]
	h[headerPolicy] = vals[0:1:1]
	h[headerRateLimit] = vals[1:2:2]
	if !d.Allowed {
		vals[2] = fields[limitEnd:]
		h[headerRetryAfter] = vals[2:3:3]
	}
}

// joinList is the List of the field lines have, then items, as one line:
// RFC 9651 section 4.2 parses several lines of a List as the lines joined
// with commas, and one line keeps Header.Get, which reads only the first,
// seeing every item.
func joinList(have []string, items []byte) string {
	n := len(items)
	for _, l := range have {
		n += len(l) + len(", ")
	}
	out := make([]byte, 0, n)
	for _, l := range have {
		if strings.TrimSpace(l) == "" {
			continue
		}
		out = append(out, l...)
		out = append(out, ", "...)
	}
	return string(append(out, items...))
}

// appendBand appends the parameters of one RateLimit-Policy item: q the
// band's capacity, w the seconds it takes to fill at rate.
func appendBand(buf []byte, capacity int64, rate policy.Rate) []byte {
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, sfInteger(capacity), 10)
	buf = append(buf, ";w="...)
	return strconv.AppendInt(buf, sfInteger(rate.WindowSeconds(max(capacity, 1))), 10)
}
