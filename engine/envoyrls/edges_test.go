package envoyrls_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

// Rules of the server's answers that the suite's cases do not reach:
// whole-second waits hide rounding, and no case overlaps a wildcard's
// prefix and suffix. The clock stays at 0 throughout (rlstest's Manual
// clock).
const edgesYAML = `domain: k
descriptors:
  - key: a
    value: "ab*ba"
    rate_limit: {unit: minute, requests_per_unit: 1, name: pal}
  - key: s
    rate_limit: {unit: minute, requests_per_unit: 7, name: seven}
  - key: x
    rate_limit: {unit: minute, requests_per_unit: 1, name: x1}
  - key: y
    rate_limit: {unit: minute, requests_per_unit: 1, name: y1}
  - key: p
    rate_limit: {unit: minute, requests_per_unit: 3, name: first}
  - key: q
    rate_limit: {unit: minute, requests_per_unit: 3, name: second}
  - key: z
    rate_limit: {unit: hour, requests_per_unit: 0, name: zero}
`

func hdr(hs []*corev3.HeaderValue, key string) string {
	for _, h := range hs {
		if h.GetKey() == key {
			return h.GetValue()
		}
	}
	return ""
}

// "A '*' in a value is a wildcard matching any run of bytes": "ab*ba"
// needs at least 4 bytes, so "aba" (prefix and suffix overlapping) does not
// match it, and must not crash the server either.
func TestWildcardNeedsPrefixAndSuffix(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("a=aba")))
	if st := resp.Statuses[0]; st.GetCurrentLimit() != nil {
		t.Errorf(`"aba" matched "ab*ba": %v`, st)
	}
	resp = h.Ask(rlstest.Req("k", 0, rlstest.D("a=abba")))
	if st := resp.Statuses[0]; st.GetCurrentLimit().GetName() != "pal" {
		t.Errorf(`"abba" did not match "ab*ba": %v`, st)
	}
}

// the header fields are for "the one with the fewest tokens left; the
// first on a tie".
func TestHeaderFieldsFirstOnATie(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("p=1"), rlstest.D("q=1")))
	if got := hdr(resp.ResponseHeadersToAdd, "RateLimit"); !strings.HasPrefix(got, `"first";`) {
		t.Errorf("RateLimit %q, want the first descriptor's (\"first\") on a tie", got)
	}
}

// Retry-After is "the seconds until every bucket of the request holds
// its cost": 7 a minute refills one token in 8.571 s, so 9, never 8.
func TestRetryAfterRoundsUp(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	for range 7 {
		h.Ask(rlstest.Req("k", 0, rlstest.D("s=u")))
	}
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("s=u")))
	if resp.OverallCode != rlstest.OverLimit {
		t.Fatalf("8th of 7/minute: %v", resp.OverallCode)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "Retry-After"); got != "9" {
		t.Errorf("Retry-After %q, want 9 (ceil of 60/7 s)", got)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "RateLimit"); !strings.HasSuffix(got, ";t=9") {
		t.Errorf("RateLimit %q, want t=9", got)
	}
}

// "for a refused request every descriptor's bucket is judged; those
// whose bucket holds their cost are OK, though nothing was taken". x holds
// exactly its cost (1 of 1); y is empty.
func TestRefusedRequestExactCostIsOK(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	h.Ask(rlstest.Req("k", 0, rlstest.D("y=1"))) // empties y
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("x=1"), rlstest.D("y=1")))
	if resp.OverallCode != rlstest.OverLimit {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	if c := resp.Statuses[0].GetCode(); c != rlstest.OK {
		t.Errorf("x (holds exactly its cost): %v, want OK", c)
	}
	if c := resp.Statuses[1].GetCode(); c != rlstest.OverLimit {
		t.Errorf("y (empty): %v, want OVER_LIMIT", c)
	}
}

// duration_until_reset is "the time until its bucket is full again,
// rounded up to the nanosecond": one token of 7 a minute is ceil(60e9/7) ns.
func TestDurationUntilResetToTheNanosecond(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("s=v")))
	if got, want := resp.Statuses[0].GetDurationUntilReset().AsDuration(), 8571428572*time.Nanosecond; got != want {
		t.Errorf("duration_until_reset %v, want %v", got, want)
	}
}

// "A descriptor of a request with more than one limited descriptor reports
// its bucket as Peek reads it just after the decision": a check-only shadow
// descriptor of a bucket that a shadow descriptor of the same request
// charges reports the bucket after the charge, as an enforced one does
// (rlstest's CheckOnlyReportsAfterTheCharge), wherever it stands.
func TestShadowCheckOnlyReportsAfterTheCharge(t *testing.T) {
	const yaml = `domain: sh
descriptors:
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: s5}
`
	h := rlstest.Start(t, newEngine, yaml)
	resp := h.Ask(rlstest.Req("sh", 0, rlstest.DH(0, "s=1"), rlstest.DH(2, "s=1")))
	for i, st := range resp.Statuses {
		if st.GetLimitRemaining() != 3 {
			t.Errorf("status %d: limit_remaining %d, want 3 (5 less the 2 charged)", i, st.GetLimitRemaining())
		}
	}
	resp = h.Ask(rlstest.Req("sh", 0, rlstest.DH(2, "s=1"), rlstest.DH(0, "s=1")))
	for i, st := range resp.Statuses {
		if st.GetLimitRemaining() != 1 {
			t.Errorf("second request, status %d: limit_remaining %d, want 1", i, st.GetLimitRemaining())
		}
	}
}

// "the entry with the same key and value": keys and values may hold any
// byte, a NUL too (YAML writes it "\0"), and two entries whose key and
// value join alike around one (key "a\0b" value "c", key "a" value "b\0c")
// are two entries: each descriptor reaches its own, and neither takes the
// other's place in the tree.
func TestEntryKeyAndValueAreNotJoined(t *testing.T) {
	h := rlstest.Start(t, newEngine, `domain: nul
descriptors:
  - key: "a\0b"
    value: c
    rate_limit: {unit: minute, requests_per_unit: 1, name: first}
  - key: a
    value: "b\0c"
    rate_limit: {unit: minute, requests_per_unit: 2, name: second}
`)
	for _, c := range []struct{ key, value, want string }{{"a\x00b", "c", "first"}, {"a", "b\x00c", "second"}} {
		resp := h.Ask(rlstest.Req("nul", 0, rlstest.D(c.key+"="+c.value)))
		if got := resp.Statuses[0].GetCurrentLimit().GetName(); got != c.want {
			t.Errorf("key %q value %q: limit %q, want %q", c.key, c.value, got, c.want)
		}
	}
}

// TestReplacesOncePerEntry: a request whose descriptors all reach one
// entry with a long replaces list reads that list once, not once per
// descriptor: 2,000 descriptors and 50,000 replaces entries were 10^8 map
// writes, seconds of one request, before the limit on a request's limited
// descriptors turned it away.
func TestReplacesOncePerEntry(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: r\ndescriptors:\n  - key: k\n    rate_limit:\n      name: big\n      unit: minute\n      requests_per_unit: 1\n      replaces:\n")
	for i := range 50_000 {
		fmt.Fprintf(&b, "        - name: r%d\n", i)
	}
	h := rlstest.Start(t, newEngine, b.String())
	descs := make([]*rlv3.RateLimitDescriptor, envoyrls.MaxDescriptors)
	for i := range descs {
		descs[i] = rlstest.D("k=" + strconv.Itoa(i))
	}
	start := time.Now()
	_, err := h.Client.ShouldRateLimit(context.Background(), rlstest.Req("r", 0, descs...))
	took := time.Since(start)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d limited descriptors: %v, want InvalidArgument", len(descs), err)
	}
	if took > 3*time.Second { // seconds when each descriptor read the list; tens of ms now
		t.Errorf("one request took %v", took)
	}
}

// "For a limit of 0, which no wait admits, there is no Retry-After and t
// is the seconds of its unit": never t=0, which tells a client to retry
// at once.
func TestZeroLimitHeaderFields(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("z=1")))
	if resp.OverallCode != rlstest.OverLimit {
		t.Fatalf("a limit of 0: %v, want OVER_LIMIT", resp.OverallCode)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "RateLimit"); got != `"zero";r=0;t=3600` {
		t.Errorf("RateLimit %q, want \"zero\";r=0;t=3600", got)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "Retry-After"); got != "" {
		t.Errorf("Retry-After %q for a limit no wait admits", got)
	}
}

// "A shadow-mode descriptor is decided and reported but never makes the
// answer OVER_LIMIT": a shadow limit of 0 reports what that limit holds,
// nothing, and no wait; it is never decided against a bucket of the
// admitter's default limit, which the policy gives every key no
// configured limit has (and would report thousands left).
func TestShadowZeroLimitReportsNothingLeft(t *testing.T) {
	const yaml = `domain: sz
descriptors:
  - key: z
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0, name: zero}
`
	h := rlstest.Start(t, newEngine, yaml)
	for i := range 2 {
		resp := h.Ask(rlstest.Req("sz", 0, rlstest.D("z=1")))
		if resp.OverallCode != rlstest.OK {
			t.Errorf("request %d: %v, want OK (shadow)", i, resp.OverallCode)
		}
		st := resp.Statuses[0]
		if st.GetCode() != rlstest.OK || st.GetCurrentLimit().GetName() != "zero" {
			t.Errorf("request %d: status %v, want OK under the limit \"zero\"", i, st)
		}
		if st.GetLimitRemaining() != 0 || st.GetDurationUntilReset() != nil {
			t.Errorf("request %d: limit_remaining %d, duration_until_reset %v; want 0 and none",
				i, st.GetLimitRemaining(), st.GetDurationUntilReset())
		}
	}
}

// "Shadow descriptors give no header fields": a shadow descriptor its
// bucket refuses is reported in its status, but the answer, OK, carries no
// RateLimit fields and above all no Retry-After, which would tell the
// client to wait for a limit that is not enforced.
func TestShadowRefusalGivesNoHeaderFields(t *testing.T) {
	const yaml = `domain: sh1
descriptors:
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: s1}
`
	h := rlstest.Start(t, newEngine, yaml)
	h.Ask(rlstest.Req("sh1", 0, rlstest.D("s=1")))
	resp := h.Ask(rlstest.Req("sh1", 0, rlstest.D("s=1")))
	if resp.OverallCode != rlstest.OK {
		t.Fatalf("shadow refusal: %v, want OK", resp.OverallCode)
	}
	if got := resp.Statuses[0].GetLimitRemaining(); got != 0 {
		t.Errorf("limit_remaining %d, want 0: the shadow bucket is reported", got)
	}
	if hs := resp.ResponseHeadersToAdd; len(hs) != 0 {
		t.Errorf("header fields %v for a shadow descriptor", hs)
	}
}

// "When the request is refused and some wait admits it, Retry-After ...":
// a request with a descriptor no wait admits (a limit of 0) is answered for
// that descriptor, with no Retry-After, even when another descriptor before
// it is over the limit with a finite wait: after that wait the request
// would still be refused.
func TestNeverAdmittedWinsTheHeaderFields(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	h.Ask(rlstest.Req("k", 0, rlstest.D("x=1"))) // x's one token taken
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("x=1"), rlstest.D("z=1")))
	if resp.OverallCode != rlstest.OverLimit {
		t.Fatalf("%v, want OVER_LIMIT", resp.OverallCode)
	}
	if got := resp.Statuses[0].GetCode(); got != rlstest.OverLimit {
		t.Errorf("x: %v, want OVER_LIMIT (its bucket is empty)", got)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "Retry-After"); got != "" {
		t.Errorf("Retry-After %q for a request no wait admits", got)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "RateLimit"); got != `"zero";r=0;t=3600` {
		t.Errorf("RateLimit %q, want \"zero\";r=0;t=3600", got)
	}
}

// keyRecorder is an engine that tells which keys the server spends from,
// so a test can act on a bucket the server chose the key of.
type keyRecorder struct {
	*engine.Engine
	keys chan string
}

func (e keyRecorder) Allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	select {
	case e.keys <- key:
	default:
	}
	return e.Engine.Allow(ctx, key, cost)
}

// "limit_remaining the whole tokens left in its bucket": a bucket that
// another user of the admitter put into debt (engine.Engine.Charge) has
// none left, and is reported as 0 in the status and in RateLimit's r, not
// as its negative balance wrapped to four billion.
func TestBucketInDebtReportsZeroLeft(t *testing.T) {
	keys := make(chan string, 1)
	h := rlstest.Start(t, func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		return keyRecorder{newEngine(t, p, clk).(*engine.Engine), keys}
	}, edgesYAML)
	h.Ask(rlstest.Req("k", 0, rlstest.D("s=1")))
	var key string
	select {
	case key = <-keys:
	default: // decided another way than by Allow: fail, not hang
		t.Fatal("the descriptor's bucket was not decided by Allow; its key is unknown")
	}
	d, err := h.A.Charge(context.Background(), key, 20)
	if err != nil || d.Remaining >= 0 {
		t.Fatalf("Charge: %+v, %v; want a bucket in debt", d, err)
	}
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("s=1")))
	if resp.OverallCode != rlstest.OverLimit {
		t.Fatalf("%v, want OVER_LIMIT", resp.OverallCode)
	}
	if got := resp.Statuses[0].GetLimitRemaining(); got != 0 {
		t.Errorf("limit_remaining %d, want 0", got)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "RateLimit"); !strings.HasPrefix(got, `"seven";r=0;`) {
		t.Errorf("RateLimit %q, want r=0", got)
	}
}

// "ResourceExhausted for engine.ErrKeyCapacity": an admitter whose key
// table is full fails the request with that code, not Unavailable, so an
// operator tells a bound to raise from a store that is down.
func TestKeyCapacityIsResourceExhausted(t *testing.T) {
	h := rlstest.Start(t, func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		e, err := engine.New(engine.Config{Policy: p, Clock: clk, Shards: 1, MaxKeys: 1})
		if err != nil {
			t.Fatalf("engine.New: %v", err)
		}
		t.Cleanup(func() {
			if err := e.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return e
	}, edgesYAML)
	h.Ask(rlstest.Req("k", 0, rlstest.D("s=1"))) // the one key
	_, err := h.Client.ShouldRateLimit(context.Background(), rlstest.Req("k", 0, rlstest.D("s=2")))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second key at MaxKeys 1: %v, want ResourceExhausted", err)
	}
}

// A descriptor's hits_addend is a uint64; one above math.MaxInt64 is a cost
// above every limit, refused as such (OVER_LIMIT, no Retry-After, nothing
// taken), never turned into a negative cost that the admitter fails.
// (Enforced descriptors' costs are summed with saturation, which would
// hide a negative one; a shadow descriptor's cost goes to the admitter
// as it is.)
func TestHugeHitsAddendIsOverLimit(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	for _, hits := range []uint64{1 << 63, 1<<64 - 1} {
		resp := h.Ask(rlstest.Req("k", 0, rlstest.DH(hits, "s=1")))
		if resp.OverallCode != rlstest.OverLimit || resp.Statuses[0].GetCode() != rlstest.OverLimit {
			t.Errorf("hits_addend %d: %v, want OVER_LIMIT", hits, resp)
		}
		if got := hdr(resp.ResponseHeadersToAdd, "Retry-After"); got != "" {
			t.Errorf("hits_addend %d: Retry-After %q for a cost no wait admits", hits, got)
		}
	}
	resp := h.Ask(rlstest.Req("k", 0, rlstest.D("s=1")))
	if got := resp.Statuses[0].GetLimitRemaining(); got != 6 {
		t.Errorf("after the refusals: limit_remaining %d, want 6 (7 less this request's 1)", got)
	}

	// A shadow descriptor is decided on its own (AllowBatch): the same
	// cost is one its bucket can never hold, an OK answer, not an error.
	sh := rlstest.Start(t, newEngine, `domain: sh
descriptors:
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: s5}
`)
	for _, hits := range []uint64{1 << 63, 1<<64 - 1} {
		if resp := sh.Ask(rlstest.Req("sh", 0, rlstest.DH(hits, "s=1"))); resp.OverallCode != rlstest.OK {
			t.Errorf("shadow, hits_addend %d: %v, want OK", hits, resp.OverallCode)
		}
	}
}

// "each part escaped so that no two descriptor paths, and no two entries,
// share a key; long parts are replaced by hashes": request values that
// differ in one escaped byte, or that split the same bytes differently
// between two entries of a key too long to keep, have buckets of their
// own. A limit of 1 admits the first request of each: a shared bucket
// would refuse the second.
func TestDistinctValuesHaveDistinctBuckets(t *testing.T) {
	const yaml = `domain: inj
descriptors:
  - key: v
    rate_limit: {unit: minute, requests_per_unit: 1, name: v1}
  - key: p
    descriptors:
      - key: q
        rate_limit: {unit: minute, requests_per_unit: 1, name: pq1}
`
	h := rlstest.Start(t, newEngine, yaml)
	long := strings.Repeat("x", 300) // past MaxKeyBytes: the values are hashed
	descs := []*rlv3.RateLimitDescriptor{
		rlstest.D("v=a b"), rlstest.D(`v=a"b`), rlstest.D("v=a!b"),
		rlstest.D("v=a\x00b"), rlstest.D("v=a\x01b"), rlstest.D("v=a\x10b"),
		rlstest.D("p="+long+"y", "q=z"), rlstest.D("p="+long, "q=yz"),
		rlstest.D("p="+long+":y", "q=z"), rlstest.D("p="+long, "q=y:z"),
	}
	for i, d := range descs {
		if resp := h.Ask(rlstest.Req("inj", 0, d)); resp.OverallCode != rlstest.OK {
			t.Errorf("descriptor %d (%q), the first of its bucket: %v, want OK", i, d.GetEntries(), resp.OverallCode)
		}
	}
}

// "t=seconds until full, rounded up" and Retry-After "the seconds until
// every bucket of the request holds its cost" are at most 9223372036, the
// longest time.Duration's whole seconds, as engine/httplimit writes them:
// an admitter running another policy than the configurations' (see
// Server.CheckPolicy), here one token per math.MaxInt64 ns, reports waits
// of up to math.MaxInt64 ns, and rounding those up must not wrap to a
// negative t or to a Retry-After of 1.
func TestLongestWaitsAreClamped(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	cur := h.A.Policy()
	ovs := cur.Overrides.Overrides()
	for i := range ovs {
		if ovs[i].Capacity == 7 { // "seven", key s
			ovs[i].TokensPerSecond, ovs[i].Refill = 0, policy.Rate{Tokens: 1, Per: math.MaxInt64}
		}
	}
	set, err := policy.NewOverrideSet(ovs...)
	if err != nil {
		t.Fatal(err)
	}
	next := cur
	next.Version, next.Overrides = cur.Version+1, set
	if err := h.A.ReplacePolicy(context.Background(), next, cur.Version); err != nil {
		t.Fatal(err)
	}
	const longest = "9223372036" // math.MaxInt64 ns in whole seconds
	for _, c := range []struct {
		hits             uint32
		rateLimit, retry string
	}{
		{1, `"seven";r=6;t=` + longest, ""},
		{6, `"seven";r=0;t=` + longest, ""},
		{1, `"seven";r=0;t=` + longest, longest},
	} {
		resp := h.Ask(rlstest.Req("k", c.hits, rlstest.D("s=1")))
		if got := hdr(resp.ResponseHeadersToAdd, "RateLimit"); got != c.rateLimit {
			t.Errorf("hits %d: RateLimit %q, want %q", c.hits, got, c.rateLimit)
		}
		if got := hdr(resp.ResponseHeadersToAdd, "Retry-After"); got != c.retry {
			t.Errorf("hits %d: Retry-After %q, want %q", c.hits, got, c.retry)
		}
	}
}

// "A request with more than MaxDescriptors descriptors is a gRPC
// InvalidArgument error": a descriptor is two bytes on the wire and the
// server's work and answer for it a hundred or more, so a request of
// empty descriptors is refused at the bound, unmatched as they are.
func TestDescriptorsAreBounded(t *testing.T) {
	h := rlstest.Start(t, newEngine, edgesYAML)
	descs := make([]*rlv3.RateLimitDescriptor, envoyrls.MaxDescriptors+1)
	for i := range descs {
		descs[i] = &rlv3.RateLimitDescriptor{}
	}
	resp, err := h.Client.ShouldRateLimit(context.Background(), rlstest.Req("k", 0, descs[:envoyrls.MaxDescriptors]...))
	if err != nil || len(resp.GetStatuses()) != envoyrls.MaxDescriptors {
		t.Fatalf("%d descriptors: %d statuses, %v; want one each", envoyrls.MaxDescriptors, len(resp.GetStatuses()), err)
	}
	_, err = h.Client.ShouldRateLimit(context.Background(), rlstest.Req("k", 0, descs...))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d descriptors: %v, want InvalidArgument", len(descs), err)
	}
}
