// Package rlstest is the behaviour suite of envoyrls.Server: the same
// requests and expected answers, over gRPC on loopback, against any admitter
// (the engine in envoyrls' own tests, the Redis store in the command's
// module). It starts goroutines: a test package that runs it should check
// for leaks (go.uber.org/goleak).
package rlstest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlv3type "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine/envoyrls"
)

// The two codes, for callers' checks.
const (
	OK        = rlsv3.RateLimitResponse_OK
	OverLimit = rlsv3.RateLimitResponse_OVER_LIMIT

	ok   = OK
	over = OverLimit
)

// Run runs every case of the suite on admitters made by f.
func Run(t *testing.T, f Factory) {
	cases := []struct {
		name string
		run  func(*testing.T, Factory)
	}{
		{"DescriptorTree", DescriptorTree},
		{"ShadowEntries", ShadowEntries},
		{"WildcardValues", WildcardValues},
		{"SharedWildcardBuckets", SharedWildcardBuckets},
		{"Replaces", Replaces},
		{"FreshKeyAdmitsExactlyTheLimit", FreshKeyAdmitsExactlyTheLimit},
		{"BoundaryBurstRefused", BoundaryBurstRefused},
		{"AllOrNothing", AllOrNothing},
		{"HitsAddend", HitsAddend},
		{"ReloadTopsNobodyUp", ReloadTopsNobodyUp},
		{"ReloadThroughZeroTopsNobodyUp", ReloadThroughZeroTopsNobodyUp},
		{"Headers", Headers},
		{"KeysDoNotCollide", KeysDoNotCollide},
		{"BadRequests", BadRequests},
		{"ZeroAndUnlimited", ZeroAndUnlimited},
		{"CheckOnlyOverChargesNothing", CheckOnlyOverChargesNothing},
		{"CheckOnlyReportsAfterTheCharge", CheckOnlyReportsAfterTheCharge},
		{"RetryAfterCoversEveryCost", RetryAfterCoversEveryCost},
		{"ConcurrentAllOrNothing", ConcurrentAllOrNothing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, f) })
	}
}

// want is the expected status of one descriptor: lim nil for no limit.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	rpu       uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	name      string
	remaining uint32
	unlimited bool
	none      bool
}

func check(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, w want) {
	t.Helper()
	switch {
	case w.none:
		if st.GetCode() != ok || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 0 {
			t.Errorf("%s: got %v, want OK with no limit", what, st)
		}
	case w.unlimited:
		if st.GetCode() != ok || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != math.MaxUint32 {
			t.Errorf("%s: got %v, want OK unlimited", what, st)
		}
	default:
		l := st.GetCurrentLimit()
		if st.GetCode() != w.code || l.GetRequestsPerUnit() != w.rpu || l.GetUnit() != w.unit ||
			l.GetName() != w.name || st.GetLimitRemaining() != w.remaining {
			t.Errorf("%s: got %v, want code %v limit %d/%v name %q remaining %d", what, st, w.code, w.rpu, w.unit, w.name, w.remaining)
		}
	}
}

func lim(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32) want {
	return want{code: code, rpu: rpu, unit: unit, remaining: remaining}
}

const (
	second = rlsv3.RateLimitResponse_RateLimit_SECOND
	minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	day    = rlsv3.RateLimitResponse_RateLimit_DAY
)

// DescriptorTree: which descriptor of TreeYAML gets which limit, as the
// reference server answers them: the most specific entry at each level, a
// limit only where the descriptor's last entry lands on one, none for an
// unknown domain or for more entries than the tree has.
func DescriptorTree(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	signup := lim(ok, 1, day, 0)
	signup.name = "signup_daily"
	cases := []struct {
		desc []string
		w    want
	}{
		{nil, want{none: true}},
		{[]string{"tenant=globex"}, want{none: true}},
		{[]string{"tenant=acme"}, want{none: true}},
		{[]string{"region=eu-west", "zone=b"}, want{none: true}},
		{[]string{"plan=gold", "feature=billing"}, want{none: true}},
		{[]string{"tenant=acme", "client=web"}, lim(ok, 4, second, 3)},
		{[]string{"tenant=acme", "client=mobile"}, lim(ok, 8, second, 7)},
		{[]string{"region=us-east"}, lim(ok, 12, minute, 11)},
		{[]string{"region=eu-west"}, lim(ok, 24, minute, 23)},
		{[]string{"region=internal"}, want{none: true}},
		{[]string{"export=csv"}, lim(ok, 1, hour, 0)},
		{[]string{"signup=web-form"}, signup},
		{[]string{"healthcheck=lb-7"}, want{unlimited: true}},
		{[]string{"search=any-query"}, lim(ok, 90, minute, 89)},
		{[]string{"plan=gold"}, lim(ok, 40, day, 39)},
		{[]string{"plan=gold", "feature=reports"}, lim(ok, 64, day, 63)},
		// More entries than the tree has: no limit.
		{[]string{"export=csv", "format=gz"}, want{none: true}},
	}
	for _, c := range cases {
		resp := h.Ask(Req("storefront", 0, D(c.desc...)))
		check(t, strings.Join(c.desc, ","), resp.Statuses[0], c.w)
		if resp.OverallCode != ok {
			t.Errorf("%v: overall %v", c.desc, resp.OverallCode)
		}
	}
	// An unknown domain matches nothing.
	resp := h.Ask(Req("backoffice", 0, D("export=csv")))
	check(t, "unknown domain", resp.Statuses[0], want{none: true})
	// export is 1 an hour, and was spent above; a new value is a new bucket.
	resp = h.Ask(Req("storefront", 0, D("export=csv"), D("region=internal")))
	check(t, "export again", resp.Statuses[0], lim(over, 1, hour, 0))
	check(t, "exempt region", resp.Statuses[1], want{none: true})
	if resp.OverallCode != over {
		t.Errorf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	resp = h.Ask(Req("storefront", 0, D("export=pdf")))
	check(t, "export other value", resp.Statuses[0], lim(ok, 1, hour, 0))
}

// ShadowEntries: a shadow descriptor over its limit is reported OK and never
// makes the answer OVER_LIMIT; an enforced one beside it still decides.
func ShadowEntries(t *testing.T, f Factory) {
	h := Start(t, f, ShadowYAML)
	for i := range 6 {
		resp := h.Ask(Req("checkout", 0, D("cart=c1", "item=giftcard")))
		check(t, fmt.Sprintf("shadow %d", i), resp.Statuses[0], lim(ok, 6, second, uint32(5-i)))
	}
	resp := h.Ask(Req("checkout", 0, D("cart=c1", "item=giftcard")))
	check(t, "shadow over", resp.Statuses[0], lim(ok, 6, second, 0))
	if resp.OverallCode != ok {
		t.Errorf("shadow over its limit: overall %v, want OK", resp.OverallCode)
	}
	// coupon (any value) is 14 a minute in shadow mode; coupon=spring is
	// 27, enforced.
	resp = h.Ask(Req("checkout", 14, D("coupon=c-1")))
	check(t, "coupon shadow", resp.Statuses[0], lim(ok, 14, minute, 0))
	resp = h.Ask(Req("checkout", 0, D("coupon=c-1"), D("coupon=spring")))
	check(t, "coupon shadow over", resp.Statuses[0], lim(ok, 14, minute, 0))
	check(t, "coupon=spring", resp.Statuses[1], lim(ok, 27, minute, 26))
	if resp.OverallCode != ok {
		t.Errorf("overall %v, want OK", resp.OverallCode)
	}
	resp = h.Ask(Req("checkout", 0, DH(27, "coupon=spring"), D("coupon=c-2")))
	check(t, "coupon=spring over", resp.Statuses[0], lim(over, 27, minute, 26))
	check(t, "shadow beside", resp.Statuses[1], lim(ok, 14, minute, 13))
	if resp.OverallCode != over {
		t.Errorf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
}

// WildcardValues: which values each '*' pattern of WildcardValuesYAML
// matches, as the reference server matches them ('*' stands for any run of
// bytes, the empty one included), and that without share_threshold each
// matching value has its own bucket.
func WildcardValues(t *testing.T, f Factory) {
	h := Start(t, f, WildcardValuesYAML)
	cases := []struct {
		desc []string
		w    want
	}{
		{[]string{"lang=en-GB"}, lim(ok, 18, minute, 17)},
		{[]string{"lang=en-US"}, lim(ok, 18, minute, 17)},
		{[]string{"lang=en"}, lim(ok, 18, minute, 17)},
		{[]string{"lang=de"}, want{none: true}},
		{[]string{"locale=en-GB"}, want{none: true}},
		{[]string{"locale=en"}, lim(ok, 16, minute, 15)},
		{[]string{"currency=eur"}, lim(ok, 14, minute, 13)},
		{[]string{"object=imgpng"}, lim(ok, 22, minute, 21)},
		{[]string{"object=img123png"}, lim(ok, 22, minute, 21)},
		{[]string{"object=img-apng"}, lim(ok, 22, minute, 21)},
		{[]string{"object=img-a"}, want{none: true}},
		{[]string{"object=ximgpng"}, want{none: true}},
		{[]string{"object=img123"}, want{none: true}},
		{[]string{"object=im"}, want{none: true}},
		{[]string{"route=/api/v1/users/7/orders"}, lim(ok, 7, minute, 6)},
		{[]string{"route=/api/users/orders"}, lim(ok, 7, minute, 6)},
		{[]string{"route=/api-v2/users-x/orders"}, lim(ok, 7, minute, 6)},
		{[]string{"route=/api/v1/orders"}, want{none: true}},
		{[]string{"route=/users/7/orders"}, want{none: true}},
		{[]string{"route=/api/orders"}, want{none: true}},
		{[]string{"route=/api/users/order"}, want{none: true}},
		{[]string{"host=shop.example.org"}, lim(ok, 11, minute, 10)},
		{[]string{"host=.example.org"}, lim(ok, 11, minute, 10)},
		{[]string{"host=example.org"}, want{none: true}},
		{[]string{"host=shop.example.org.test"}, want{none: true}},
		{[]string{"app=shop", "lang=fr-CA"}, lim(ok, 26, minute, 25)},
		{[]string{"app=shop", "lang=en"}, want{none: true}},
		{[]string{"app=blog", "lang=fr-CA"}, want{none: true}},
	}
	for _, c := range cases {
		resp := h.Ask(Req("catalog", 0, D(c.desc...)))
		check(t, strings.Join(c.desc, ","), resp.Statuses[0], c.w)
	}
	// Each value its own bucket: en-GB again is at 16, en-AU fresh.
	resp := h.Ask(Req("catalog", 0, D("lang=en-GB"), D("lang=en-AU")))
	check(t, "en-GB again", resp.Statuses[0], lim(ok, 18, minute, 16))
	check(t, "en-AU", resp.Statuses[1], lim(ok, 18, minute, 17))
}

// SharedWildcardBuckets: with share_threshold, every value a wildcard
// matches shares one bucket; an explicit value still wins over the wildcard.
func SharedWildcardBuckets(t *testing.T, f Factory) {
	h := Start(t, f, SharedBucketsYAML)
	resp := h.Ask(Req("media", 30, D("asset=img/a")))
	check(t, "img/a", resp.Statuses[0], lim(ok, 45, minute, 15))
	resp = h.Ask(Req("media", 0, D("asset=img/b/c")))
	check(t, "img/b/c shares img/a's bucket", resp.Statuses[0], lim(ok, 45, minute, 14))
	resp = h.Ask(Req("media", 0, D("album=summer", "asset=thumbs/x")))
	check(t, "nested", resp.Statuses[0], lim(ok, 72, minute, 71))
	resp = h.Ask(Req("media", 0, D("asset=raw/1", "asset=crops/2")))
	check(t, "raw/crops", resp.Statuses[0], lim(ok, 90, minute, 89))
	resp = h.Ask(Req("media", 0, D("asset=raw/3", "asset=crops/4")))
	check(t, "raw/crops shared", resp.Statuses[0], lim(ok, 90, minute, 88))
	resp = h.Ask(Req("media", 0, D("sku=A100")))
	check(t, "explicit beats wildcard", resp.Statuses[0], lim(ok, 32, minute, 31))
	resp = h.Ask(Req("media", 0, D("sku=A200")))
	check(t, "wildcard", resp.Statuses[0], lim(ok, 66, minute, 65))
	resp = h.Ask(Req("media", 0, D("sku=A300")))
	check(t, "wildcard shared", resp.Statuses[0], lim(ok, 66, minute, 64))
	resp = h.Ask(Req("media", 0, D("docpath=/docs/x/index")))
	check(t, "middle wildcard", resp.Statuses[0], lim(ok, 75, minute, 74))
	// org-* shared, proj-* not, kind per value: each (project, kind) its own.
	resp = h.Ask(Req("media", 0, D("org=org-1", "project=proj-a", "kind=k")))
	check(t, "mixed", resp.Statuses[0], lim(ok, 48, minute, 47))
	resp = h.Ask(Req("media", 0, D("org=org-2", "project=proj-a", "kind=k")))
	check(t, "mixed, shared org", resp.Statuses[0], lim(ok, 48, minute, 46))
	resp = h.Ask(Req("media", 0, D("org=org-2", "project=proj-b", "kind=k")))
	check(t, "mixed, other project", resp.Statuses[0], lim(ok, 48, minute, 47))
}

// Replaces: a limit named in another matched limit's replaces is dropped,
// reported as no limit, and not charged; an unlimited descriptor so named
// stays unlimited.
func Replaces(t *testing.T, f Factory) {
	h := Start(t, f, ReplacesYAML)
	resp := h.Ask(Req("replaces", 0, D("api=v1"), D("user=u1")))
	a := lim(ok, 10, minute, 9)
	a.name = "api"
	check(t, "api alone", resp.Statuses[0], a)
	u := lim(ok, 3, minute, 2)
	u.name = "user"
	check(t, "user alone", resp.Statuses[1], u)
	// The vip entry replaces "api": the request is decided by vip alone.
	for i := range 5 {
		resp = h.Ask(Req("replaces", 0, D("api=v1"), D("vip=gold")))
		check(t, fmt.Sprintf("replaced %d", i), resp.Statuses[0], want{none: true})
		v := lim(ok, 96, minute, uint32(95-i))
		v.name = "vip"
		check(t, fmt.Sprintf("vip %d", i), resp.Statuses[1], v)
	}
	// api's bucket was not charged by the replaced descriptors.
	resp = h.Ask(Req("replaces", 0, D("api=v1")))
	a.remaining = 8
	check(t, "api after", resp.Statuses[0], a)
	// vip names free too, but an unlimited descriptor stays unlimited.
	resp = h.Ask(Req("replaces", 0, D("free=z"), D("vip=gold")))
	check(t, "free, named by vip", resp.Statuses[0], want{unlimited: true})
}

// FreshKeyAdmitsExactlyTheLimit: a fresh key admits requests_per_unit, the
// remaining counting down to 0, then refuses.
func FreshKeyAdmitsExactlyTheLimit(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	for i := range 4 {
		resp := h.Ask(Req("storefront", 0, D("tenant=acme", "client=cli")))
		if resp.OverallCode != ok {
			t.Fatalf("request %d: %v", i, resp)
		}
		check(t, fmt.Sprintf("request %d", i), resp.Statuses[0], lim(ok, 4, second, uint32(3-i)))
	}
	resp := h.Ask(Req("storefront", 0, D("tenant=acme", "client=cli")))
	check(t, "request 4", resp.Statuses[0], lim(over, 4, second, 0))
	if resp.OverallCode != over {
		t.Errorf("request 4: overall %v", resp.OverallCode)
	}
	// Another value of the default entry has a bucket of its own.
	resp = h.Ask(Req("storefront", 0, D("tenant=acme", "client=desktop")))
	check(t, "other value", resp.Statuses[0], lim(ok, 4, second, 3))
	// A quarter of a second refills one.
	h.Clock.Advance(250 * time.Millisecond)
	resp = h.Ask(Req("storefront", 0, D("tenant=acme", "client=cli")))
	check(t, "after 250ms", resp.Statuses[0], lim(ok, 4, second, 0))
	resp = h.Ask(Req("storefront", 0, D("tenant=acme", "client=cli")))
	check(t, "after 250ms, again", resp.Statuses[0], lim(over, 4, second, 0))
}

// BoundaryBurstRefused: 12 a minute spent at 0:59 is not available again
// at 1:00, where a fixed window would admit 12 more; it refills at 12 a
// minute, one every 5 s.
func BoundaryBurstRefused(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	h.Clock.Set(int64(59 * time.Second))
	resp := h.Ask(Req("storefront", 12, D("region=burst")))
	check(t, "burst at 0:59", resp.Statuses[0], lim(ok, 12, minute, 0))
	h.Clock.Set(int64(60 * time.Second))
	resp = h.Ask(Req("storefront", 0, D("region=burst")))
	check(t, "at 1:00", resp.Statuses[0], lim(over, 12, minute, 0))
	h.Clock.Set(int64(64*time.Second - 1))
	resp = h.Ask(Req("storefront", 0, D("region=burst")))
	check(t, "just before 1:04", resp.Statuses[0], lim(over, 12, minute, 0))
	h.Clock.Set(int64(64 * time.Second))
	resp = h.Ask(Req("storefront", 0, D("region=burst")))
	check(t, "5 s after", resp.Statuses[0], lim(ok, 12, minute, 0))
	// Over the two minutes 0:59 to 1:59, 12 + 12 at most.
	admitted := 13
	for s := 65; s < 119; s++ {
		h.Clock.Set(int64(time.Duration(s) * time.Second))
		for {
			resp = h.Ask(Req("storefront", 0, D("region=burst")))
			if resp.OverallCode != ok {
				break
			}
			admitted++
		}
	}
	if admitted > 24 {
		t.Errorf("%d admitted between 0:59 and 1:59, at most 24 possible", admitted)
	}
	if admitted != 23 {
		t.Errorf("%d admitted, want 12 + one every 5 s from 1:04 to 1:54 (11)", admitted)
	}
}

// AllOrNothing: when one descriptor is over its limit, the others of the
// request are not charged.
func AllOrNothing(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	two := func() *rlsv3.RateLimitResponse {
		return h.Ask(Req("storefront", 0, D("export=a"), D("region=b")))
	}
	resp := two()
	check(t, "first export", resp.Statuses[0], lim(ok, 1, hour, 0))
	check(t, "first region", resp.Statuses[1], lim(ok, 12, minute, 11))
	for i := range 3 {
		resp = two()
		if resp.OverallCode != over {
			t.Fatalf("request %d: overall %v", i, resp.OverallCode)
		}
		check(t, "export over", resp.Statuses[0], lim(over, 1, hour, 0))
		check(t, "region not charged", resp.Statuses[1], lim(ok, 12, minute, 11))
	}
	resp = h.Ask(Req("storefront", 0, D("region=b")))
	check(t, "region alone", resp.Statuses[0], lim(ok, 12, minute, 10))
	// Two descriptors of one bucket add up: 7 + 7 is over 12, and
	// neither is charged.
	resp = h.Ask(Req("storefront", 0, DH(7, "region=c"), DH(7, "region=c")))
	if resp.OverallCode != over {
		t.Fatalf("7+7 of 12: overall %v", resp.OverallCode)
	}
	resp = h.Ask(Req("storefront", 0, DH(6, "region=c"), DH(6, "region=c")))
	check(t, "6+6 of 12", resp.Statuses[0], lim(ok, 12, minute, 0))
	check(t, "6+6 of 12, second", resp.Statuses[1], lim(ok, 12, minute, 0))
}

// HitsAddend: the request's hits_addend is every descriptor's cost, a
// descriptor's own overrides it, and a descriptor's 0 checks without
// charging.
func HitsAddend(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	resp := h.Ask(Req("storefront", 2, D("tenant=acme", "client=h")))
	check(t, "2 of 4", resp.Statuses[0], lim(ok, 4, second, 2))
	resp = h.Ask(Req("storefront", 3, D("tenant=acme", "client=h")))
	check(t, "3 more", resp.Statuses[0], lim(over, 4, second, 2))
	resp = h.Ask(Req("storefront", 3, DH(2, "tenant=acme", "client=h")))
	check(t, "own 2", resp.Statuses[0], lim(ok, 4, second, 0))
	resp = h.Ask(Req("storefront", 0, DH(0, "tenant=acme", "client=h")))
	check(t, "check only, empty", resp.Statuses[0], lim(over, 4, second, 0))
	resp = h.Ask(Req("storefront", 0, DH(0, "tenant=acme", "client=i")))
	check(t, "check only, full", resp.Statuses[0], lim(ok, 4, second, 4))
	resp = h.Ask(Req("storefront", 0, DH(0, "tenant=acme", "client=i")))
	check(t, "check only charges nothing", resp.Statuses[0], lim(ok, 4, second, 4))
	// A cost above the limit never passes and charges nothing.
	resp = h.Ask(Req("storefront", 5, D("tenant=acme", "client=i")))
	check(t, "5 of 4", resp.Statuses[0], lim(over, 4, second, 4))
	if hv := header(resp.ResponseHeadersToAdd, "Retry-After"); hv != "" {
		t.Errorf("Retry-After %q for a cost no wait admits", hv)
	}
}

// ReloadTopsNobodyUp: raising a limit keeps a spent bucket spent; it then
// refills at the new rate.
func ReloadTopsNobodyUp(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	resp := h.Ask(Req("storefront", 4, D("tenant=acme", "client=r")))
	check(t, "spent", resp.Statuses[0], lim(ok, 4, second, 0))
	raised := strings.Replace(TreeYAML, "unit: second\n          requests_per_unit: 4\n", "unit: second\n          requests_per_unit: 40\n", 1)
	if raised == TreeYAML {
		t.Fatal("the replacement did not apply")
	}
	before := h.A.Policy().Version
	if err := h.Server.Reload(context.Background(), Parse(t, raised)...); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if v := h.A.Policy().Version; v != before+1 {
		t.Errorf("version %d after reload, want %d", v, before+1)
	}
	resp = h.Ask(Req("storefront", 0, D("tenant=acme", "client=r")))
	check(t, "after raise", resp.Statuses[0], lim(over, 40, second, 0))
	resp = h.Ask(Req("storefront", 0, D("tenant=acme", "client=fresh")))
	check(t, "fresh key under the new limit", resp.Statuses[0], lim(ok, 40, second, 39))
	h.Clock.Advance(25 * time.Millisecond) // one token at 40 a second
	resp = h.Ask(Req("storefront", 0, D("tenant=acme", "client=r")))
	check(t, "refilled at the new rate", resp.Statuses[0], lim(ok, 40, second, 0))
	// Reloading the same configuration installs nothing.
	v := h.A.Policy().Version
	if err := h.Server.Reload(context.Background(), Parse(t, raised)...); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := h.A.Policy().Version; got != v {
		t.Errorf("an unchanged reload moved the version from %d to %d", v, got)
	}
	// An invalid configuration never reaches Reload: ParseConfig refuses it
	// with its line.
	if _, err := envoyrls.ParseConfig([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n")); err == nil ||
		!strings.Contains(err.Error(), "line 5") {
		t.Errorf("ParseConfig of an unknown unit: %v, want an error naming line 5", err)
	}
}

// ReloadThroughZeroTopsNobodyUp: a limit taken to 0 (every request refused)
// and then back keeps a spent bucket spent, however long it was at 0 and
// whatever sweeps ran meanwhile: at 0 a key earns nothing worth a token.
// Before, the entry's keys fell to the never-denying default while at 0 and
// came back full.
func ReloadThroughZeroTopsNobodyUp(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	resp := h.Ask(Req("storefront", 4, D("tenant=acme", "client=r")))
	check(t, "spent", resp.Statuses[0], lim(ok, 4, second, 0))
	limit := "unit: second\n          requests_per_unit: 4\n"
	zero := strings.Replace(TreeYAML, limit, "unit: second\n          requests_per_unit: 0\n", 1)
	if zero == TreeYAML {
		t.Fatal("the replacement did not apply")
	}
	if err := h.Server.Reload(context.Background(), Parse(t, zero)...); err != nil {
		t.Fatalf("Reload to 0: %v", err)
	}
	resp = h.Ask(Req("storefront", 1, D("tenant=acme", "client=r")))
	check(t, "at 0", resp.Statuses[0], lim(over, 0, second, 0))
	h.Clock.Advance(time.Hour) // what refills 4 at 4 a second, many times over
	if _, err := h.A.EvictFull(context.Background()); err != nil {
		t.Fatalf("EvictFull at 0: %v", err)
	}
	if err := h.Server.Reload(context.Background(), Parse(t, TreeYAML)...); err != nil {
		t.Fatalf("Reload back to 4: %v", err)
	}
	resp = h.Ask(Req("storefront", 1, D("tenant=acme", "client=r")))
	check(t, "back at 4", resp.Statuses[0], lim(over, 4, second, 0))
	h.Clock.Advance(250 * time.Millisecond) // one token at 4 a second
	resp = h.Ask(Req("storefront", 1, D("tenant=acme", "client=r")))
	check(t, "refilled at 4 a second", resp.Statuses[0], lim(ok, 4, second, 0))
}

// Headers: the RateLimit fields of the binding descriptor, and Retry-After
// when over.
func Headers(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	resp := h.Ask(Req("storefront", 0, D("region=h"), D("signup=x")))
	if got := header(resp.ResponseHeadersToAdd, "RateLimit-Policy"); got != `"signup_daily";q=1;w=86400` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "RateLimit"); got != `"signup_daily";r=0;t=86400` {
		t.Errorf("RateLimit %q", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "" {
		t.Errorf("Retry-After %q on an admitted request", got)
	}
	resp = h.Ask(Req("storefront", 0, D("region=h"), D("signup=x")))
	if resp.OverallCode != over {
		t.Fatalf("overall %v", resp.OverallCode)
	}
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "86400" {
		t.Errorf("Retry-After %q, want 86400", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "RateLimit"); got != `"signup_daily";r=0;t=86400` {
		t.Errorf("RateLimit %q", got)
	}
	resp = h.Ask(Req("storefront", 0, D("region=h")))
	if got := header(resp.ResponseHeadersToAdd, "RateLimit-Policy"); got != `"12-per-minute";q=12;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "RateLimit"); got != `"12-per-minute";r=10;t=10` {
		t.Errorf("RateLimit %q", got)
	}
	if d := resp.Statuses[0].GetDurationUntilReset().AsDuration(); d != 10*time.Second {
		t.Errorf("duration_until_reset %v, want 10s (2 tokens at 12 a minute)", d)
	}
}

// KeysDoNotCollide: values holding the key layout's separators, and values
// too long for a key, still give each distinct descriptor its own bucket.
func KeysDoNotCollide(t *testing.T, f Factory) {
	h := Start(t, f, CollideYAML)
	pairs := [][2][]string{
		{{"a=x|b", "b=y"}, {"a=x", "b=b|y"}},
		{{"a=x/b~", "b=y"}, {"a=x", "b=/b~y"}},
		{{"a=%41", "b=y"}, {"a=A", "b=y"}},
		{{"a=" + strings.Repeat("v", 300), "b=1"}, {"a=" + strings.Repeat("v", 300), "b=2"}},
		{{"a=" + strings.Repeat("w", 300) + "1", "b=1"}, {"a=" + strings.Repeat("w", 300) + "2", "b=1"}},
	}
	for _, p := range pairs {
		resp := h.Ask(Req("collide", 2, D(p[0]...)))
		check(t, fmt.Sprint(p[0]), resp.Statuses[0], lim(ok, 2, minute, 0))
		resp = h.Ask(Req("collide", 0, D(p[1]...)))
		check(t, fmt.Sprint(p[1], " after ", p[0]), resp.Statuses[0], lim(ok, 2, minute, 1))
		resp = h.Ask(Req("collide", 0, D(p[0]...)))
		check(t, fmt.Sprint(p[0], " again"), resp.Statuses[0], lim(over, 2, minute, 0))
	}
	// A long domain and path still fit.
	long := strings.Repeat("d", 200)
	h2 := Start(t, f, "domain: "+long+"\ndescriptors:\n  - key: "+strings.Repeat("k", 200)+"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	resp := h2.Ask(Req(long, 0, D(strings.Repeat("k", 200)+"="+strings.Repeat("v", 500))))
	check(t, "long", resp.Statuses[0], lim(ok, 1, minute, 0))
	resp = h2.Ask(Req(long, 0, D(strings.Repeat("k", 200)+"="+strings.Repeat("v", 500))))
	check(t, "long again", resp.Statuses[0], lim(over, 1, minute, 0))
}

// BadRequests: what the server refuses, as gRPC errors.
func BadRequests(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	many, manyChecks := Req("storefront", 0), Req("storefront", 0)
	for i := range 65 {
		many.Descriptors = append(many.Descriptors, D(fmt.Sprintf("region=%d", i)))
		// each a Peek of its own: limited descriptors, though they charge nothing
		manyChecks.Descriptors = append(manyChecks.Descriptors, DH(0, fmt.Sprintf("region=%d", i)))
	}
	overridden := D("region=x")
	overridden.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: rlv3type.RateLimitUnit_SECOND}
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
	}{
		{Req("", 0, D("region=x")), codes.InvalidArgument},
		{Req("storefront", 0), codes.InvalidArgument},
		{many, codes.InvalidArgument},
		{manyChecks, codes.InvalidArgument},
		{Req("storefront", 0, overridden), codes.Unimplemented},
	} {
		if _, err := h.Client.ShouldRateLimit(context.Background(), c.req); status.Code(err) != c.code {
			t.Errorf("%.80v: %v, want %v", c.req, err, c.code)
		}
	}
	// Nothing was charged by the refused requests.
	resp := h.Ask(Req("storefront", 0, D("region=x"), D("region=0")))
	check(t, "region=x", resp.Statuses[0], lim(ok, 12, minute, 11))
	check(t, "region=0", resp.Statuses[1], lim(ok, 12, minute, 11))
}

// ZeroAndUnlimited: a limit of 0 refuses every request, and the request's
// other descriptors are not charged; an unlimited descriptor beside a limited
// one changes nothing.
func ZeroAndUnlimited(t *testing.T, f Factory) {
	h := Start(t, f, ZeroYAML)
	resp := h.Ask(Req("zero", 0, D("closed=x"), D("open=y"), D("free=z")))
	if resp.OverallCode != over {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	check(t, "closed", resp.Statuses[0], lim(over, 0, minute, 0))
	check(t, "open, not charged", resp.Statuses[1], lim(ok, 3, minute, 3))
	check(t, "free", resp.Statuses[2], want{unlimited: true})
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "" {
		t.Errorf("Retry-After %q for a limit of 0", got)
	}
	resp = h.Ask(Req("zero", 0, D("open=y"), D("free=z")))
	check(t, "open", resp.Statuses[0], lim(ok, 3, minute, 2))
	check(t, "free", resp.Statuses[1], want{unlimited: true})
	if resp.OverallCode != ok {
		t.Errorf("overall %v, want OK", resp.OverallCode)
	}
}

// CheckOnlyOverChargesNothing: a descriptor with hits_addend 0 whose bucket
// is empty refuses the request, and the others are not charged.
func CheckOnlyOverChargesNothing(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	h.Ask(Req("storefront", 0, D("export=c")))
	resp := h.Ask(Req("storefront", 0, DH(0, "export=c"), D("region=c")))
	if resp.OverallCode != over {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	check(t, "check only", resp.Statuses[0], lim(over, 1, hour, 0))
	check(t, "not charged", resp.Statuses[1], lim(ok, 12, minute, 12))
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "3600" {
		t.Errorf("Retry-After %q, want 3600", got)
	}
}

// CheckOnlyReportsAfterTheCharge: a check-only descriptor of a bucket the
// same request charges reports the bucket after the charge, as every
// descriptor of the request does.
func CheckOnlyReportsAfterTheCharge(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	resp := h.Ask(Req("storefront", 0, DH(0, "region=q"), DH(3, "region=q")))
	if resp.OverallCode != ok {
		t.Fatalf("overall %v, want OK", resp.OverallCode)
	}
	check(t, "check only", resp.Statuses[0], lim(ok, 12, minute, 9))
	check(t, "charged", resp.Statuses[1], lim(ok, 12, minute, 9))
}

// RetryAfterCoversEveryCost: a request refused is told to come back once
// every bucket holds its cost, however it was refused: by a check-only
// descriptor over the limit (nothing is decided then) or by a bucket short
// of its cost.
func RetryAfterCoversEveryCost(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	h.Ask(Req("storefront", 4, D("tenant=acme", "client=k"))) // empty: a token every 250 ms
	h.Ask(Req("storefront", 12, D("region=k")))               // empty: a token every 5 s
	for _, first := range []uint64{0, 1} {
		// The client's bucket needs 1 token (250 ms), the region's 10 (50 s).
		resp := h.Ask(Req("storefront", 0, DH(first, "tenant=acme", "client=k"), DH(10, "region=k")))
		if resp.OverallCode != over {
			t.Fatalf("hits_addend %d first: overall %v, want OVER_LIMIT", first, resp.OverallCode)
		}
		check(t, fmt.Sprintf("hits_addend %d: region", first), resp.Statuses[1], lim(over, 12, minute, 0))
		if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "50" {
			t.Errorf("hits_addend %d first: Retry-After %q, want 50", first, got)
		}
		if got := header(resp.ResponseHeadersToAdd, "RateLimit"); !strings.HasSuffix(got, ";t=50") {
			t.Errorf("hits_addend %d first: RateLimit %q, want t=50", first, got)
		}
	}
}

// ConcurrentAllOrNothing: clients racing on two descriptors of limits 4 and
// 12 (the clock still) get exactly 4 admissions, and the bucket of 12 is
// charged for exactly those 4.
func ConcurrentAllOrNothing(t *testing.T, f Factory) {
	h := Start(t, f, TreeYAML)
	const clients, each = 8, 6
	var wg sync.WaitGroup
	admitted := make(chan int, clients)
	for range clients {
		wg.Go(func() {
			n := 0
			for range each {
				resp, err := h.Client.ShouldRateLimit(context.Background(),
					Req("storefront", 0, D("tenant=acme", "client=race"), D("region=race")))
				if err != nil {
					t.Errorf("ShouldRateLimit: %v", err)
					return
				}
				if resp.OverallCode == ok {
					n++
				}
			}
			admitted <- n
		})
	}
	wg.Wait()
	close(admitted)
	total := 0
	for n := range admitted {
		total += n
	}
	if total != 4 {
		t.Errorf("%d admitted, want exactly 4", total)
	}
	resp := h.Ask(Req("storefront", 0, D("region=race")))
	check(t, "region after the race", resp.Statuses[0], lim(ok, 12, minute, 7))
}

func header(hs []*corev3.HeaderValue, key string) string {
	for _, h := range hs {
		if h.GetKey() == key {
			return h.GetValue()
		}
	}
	return ""
}
