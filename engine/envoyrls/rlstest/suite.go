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
		{"BasicConfig", BasicConfig},
		{"ShadowMode", ShadowMode},
		{"Wildcard", Wildcard},
		{"ShareThreshold", ShareThreshold},
		{"Replaces", Replaces},
		{"FreshKeyAdmitsExactlyTheLimit", FreshKeyAdmitsExactlyTheLimit},
		{"BoundaryBurstRefused", BoundaryBurstRefused},
		{"AllOrNothing", AllOrNothing},
		{"HitsAddend", HitsAddend},
		{"ReloadTopsNobodyUp", ReloadTopsNobodyUp},
		{"Headers", Headers},
		{"KeysDoNotCollide", KeysDoNotCollide},
		{"BadRequests", BadRequests},
		{"ZeroAndUnlimited", ZeroAndUnlimited},
		{"CheckOnlyOverChargesNothing", CheckOnlyOverChargesNothing},
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

// BasicConfig reproduces the answers envoyproxy/ratelimit's TestBasicConfig
// expects for its basic_config.yaml: which descriptor gets which limit.
func BasicConfig(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	k4 := lim(ok, 1, day, 0)
	k4.name = "key4_rate_limit"
	cases := []struct {
		desc []string
		w    want
	}{
		{nil, want{none: true}},
		{[]string{"key1=something"}, want{none: true}},
		{[]string{"key1=value1"}, want{none: true}},
		{[]string{"key2=value2", "subkey=subvalue"}, want{none: true}},
		{[]string{"key5=value5", "subkey5=subvalue"}, want{none: true}},
		{[]string{"key1=value1", "subkey1=something"}, lim(ok, 5, second, 4)},
		{[]string{"key1=value1", "subkey1=subvalue1"}, lim(ok, 10, second, 9)},
		{[]string{"key2=something"}, lim(ok, 20, minute, 19)},
		{[]string{"key2=value2"}, lim(ok, 30, minute, 29)},
		{[]string{"key2=value3"}, want{none: true}},
		{[]string{"key3=foo"}, lim(ok, 1, hour, 0)},
		{[]string{"key4=foo"}, k4},
		{[]string{"key6=foo"}, want{unlimited: true}},
		{[]string{"key7=unspecified_value"}, lim(ok, 70, minute, 69)},
		{[]string{"key5=value5"}, lim(ok, 15, day, 14)},
		{[]string{"key5=value5", "subkey5=subvalue5"}, lim(ok, 25, day, 24)},
		// More entries than the tree has: no limit.
		{[]string{"key3=foo", "extra=x"}, want{none: true}},
	}
	for _, c := range cases {
		resp := h.Ask(Req("test-domain", 0, D(c.desc...)))
		check(t, strings.Join(c.desc, ","), resp.Statuses[0], c.w)
		if resp.OverallCode != ok {
			t.Errorf("%v: overall %v", c.desc, resp.OverallCode)
		}
	}
	// An unknown domain matches nothing.
	resp := h.Ask(Req("foo_domain", 0, D("key3=foo")))
	check(t, "unknown domain", resp.Statuses[0], want{none: true})
	// key3 is 1 an hour, and was spent above; a new value is a new bucket.
	resp = h.Ask(Req("test-domain", 0, D("key3=foo"), D("key2=value3")))
	check(t, "key3 again", resp.Statuses[0], lim(over, 1, hour, 0))
	check(t, "whitelisted", resp.Statuses[1], want{none: true})
	if resp.OverallCode != over {
		t.Errorf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	resp = h.Ask(Req("test-domain", 0, D("key3=bar")))
	check(t, "key3 other value", resp.Statuses[0], lim(ok, 1, hour, 0))
}

// ShadowMode: a shadow descriptor over its limit is reported OK and never
// makes the answer OVER_LIMIT; an enforced one beside it still decides.
func ShadowMode(t *testing.T, f Factory) {
	h := Start(t, f, ShadowModeYAML)
	for i := range 10 {
		resp := h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=subvalue1")))
		check(t, fmt.Sprintf("shadow %d", i), resp.Statuses[0], lim(ok, 10, second, uint32(9-i)))
	}
	resp := h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=subvalue1")))
	check(t, "shadow over", resp.Statuses[0], lim(ok, 10, second, 0))
	if resp.OverallCode != ok {
		t.Errorf("shadow over its limit: overall %v, want OK", resp.OverallCode)
	}
	// key2 (any value) is 20 a minute in shadow mode; key2=value2 is 30,
	// enforced.
	resp = h.Ask(Req("test-domain", 20, D("key2=x")))
	check(t, "key2 shadow", resp.Statuses[0], lim(ok, 20, minute, 0))
	resp = h.Ask(Req("test-domain", 0, D("key2=x"), D("key2=value2")))
	check(t, "key2 shadow over", resp.Statuses[0], lim(ok, 20, minute, 0))
	check(t, "key2=value2", resp.Statuses[1], lim(ok, 30, minute, 29))
	if resp.OverallCode != ok {
		t.Errorf("overall %v, want OK", resp.OverallCode)
	}
	resp = h.Ask(Req("test-domain", 0, DH(30, "key2=value2"), D("key2=y")))
	check(t, "key2=value2 over", resp.Statuses[0], lim(over, 30, minute, 29))
	check(t, "shadow beside", resp.Statuses[1], lim(ok, 20, minute, 19))
	if resp.OverallCode != over {
		t.Errorf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
}

// Wildcard reproduces TestWildcardConfig's matches for wildcard.yaml, and
// shows that without share_threshold each matching value has its own bucket.
func Wildcard(t *testing.T, f Factory) {
	h := Start(t, f, WildcardYAML)
	cases := []struct {
		desc []string
		w    want
	}{
		{[]string{"wild=foo1"}, lim(ok, 20, minute, 19)},
		{[]string{"wild=foo2"}, lim(ok, 20, minute, 19)},
		{[]string{"wild=foo"}, lim(ok, 20, minute, 19)},
		{[]string{"wild=bar"}, want{none: true}},
		{[]string{"noWild=foo1"}, want{none: true}},
		{[]string{"noWild=foo"}, lim(ok, 20, minute, 19)},
		{[]string{"noVal=foo"}, lim(ok, 20, minute, 19)},
		{[]string{"midWild=barb"}, lim(ok, 20, minute, 19)},
		{[]string{"midWild=bar123b"}, lim(ok, 20, minute, 19)},
		{[]string{"midWild=barab"}, lim(ok, 20, minute, 19)},
		{[]string{"midWild=bara"}, want{none: true}},
		{[]string{"midWild=xbarb"}, want{none: true}},
		{[]string{"midWild=bar123"}, want{none: true}},
		{[]string{"midWild=ba"}, want{none: true}},
		{[]string{"multiWild=foo1bar2baz"}, lim(ok, 10, minute, 9)},
		{[]string{"multiWild=foobarbaz"}, lim(ok, 10, minute, 9)},
		{[]string{"multiWild=foo123bar456baz"}, lim(ok, 10, minute, 9)},
		{[]string{"multiWild=foo123baz"}, want{none: true}},
		{[]string{"multiWild=bar456baz"}, want{none: true}},
		{[]string{"multiWild=foobaz"}, want{none: true}},
		{[]string{"multiWild=foobarba"}, want{none: true}},
		{[]string{"nestedWild=val1", "wild=goo2"}, lim(ok, 20, minute, 19)},
		{[]string{"nestedWild=val1", "wild=foo"}, want{none: true}},
		{[]string{"nestedWild=val2", "wild=goo2"}, want{none: true}},
	}
	for _, c := range cases {
		resp := h.Ask(Req("test-domain", 0, D(c.desc...)))
		check(t, strings.Join(c.desc, ","), resp.Statuses[0], c.w)
	}
	// Each value its own bucket: foo1 again is at 18, foo3 fresh.
	resp := h.Ask(Req("test-domain", 0, D("wild=foo1"), D("wild=foo3")))
	check(t, "foo1 again", resp.Statuses[0], lim(ok, 20, minute, 18))
	check(t, "foo3", resp.Statuses[1], lim(ok, 20, minute, 19))
}

// ShareThreshold: with share_threshold, every value a wildcard matches shares
// one bucket; an explicit value still wins over the wildcard.
func ShareThreshold(t *testing.T, f Factory) {
	h := Start(t, f, ShareThresholdYAML)
	resp := h.Ask(Req("test-domain", 60, D("files=files/a")))
	check(t, "files/a", resp.Statuses[0], lim(ok, 100, minute, 40))
	resp = h.Ask(Req("test-domain", 0, D("files=files/b/c")))
	check(t, "files/b/c shares files/a's bucket", resp.Statuses[0], lim(ok, 100, minute, 39))
	resp = h.Ask(Req("test-domain", 0, D("nested=parent", "files=nested/x")))
	check(t, "nested", resp.Statuses[0], lim(ok, 200, minute, 199))
	resp = h.Ask(Req("test-domain", 0, D("files=top/1", "files=nested/2")))
	check(t, "top/nested", resp.Statuses[0], lim(ok, 300, minute, 299))
	resp = h.Ask(Req("test-domain", 0, D("files=top/3", "files=nested/4")))
	check(t, "top/nested shared", resp.Statuses[0], lim(ok, 300, minute, 298))
	resp = h.Ask(Req("test-domain", 0, D("file=test1")))
	check(t, "explicit beats wildcard", resp.Statuses[0], lim(ok, 50, minute, 49))
	resp = h.Ask(Req("test-domain", 0, D("file=test2")))
	check(t, "wildcard", resp.Statuses[0], lim(ok, 100, minute, 99))
	resp = h.Ask(Req("test-domain", 0, D("file=test3")))
	check(t, "wildcard shared", resp.Statuses[0], lim(ok, 100, minute, 98))
	resp = h.Ask(Req("test-domain", 0, D("midpath=/api/x/v1")))
	check(t, "middle wildcard", resp.Statuses[0], lim(ok, 100, minute, 99))
	// path/* shared, file/* not, type per value: each (file, type) its own.
	resp = h.Ask(Req("test-domain", 0, D("path=path/1", "file=file/a", "type=t")))
	check(t, "mixed", resp.Statuses[0], lim(ok, 120, minute, 119))
	resp = h.Ask(Req("test-domain", 0, D("path=path/2", "file=file/a", "type=t")))
	check(t, "mixed, shared path", resp.Statuses[0], lim(ok, 120, minute, 118))
	resp = h.Ask(Req("test-domain", 0, D("path=path/2", "file=file/b", "type=t")))
	check(t, "mixed, other file", resp.Statuses[0], lim(ok, 120, minute, 119))
}

// Replaces: a limit named in another matched limit's replaces is dropped,
// reported as no limit, and not charged.
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
		v := lim(ok, 100, minute, uint32(99-i))
		v.name = "vip"
		check(t, fmt.Sprintf("vip %d", i), resp.Statuses[1], v)
	}
	// api's bucket was not charged by the replaced descriptors.
	resp = h.Ask(Req("replaces", 0, D("api=v1")))
	a.remaining = 8
	check(t, "api after", resp.Statuses[0], a)
}

// FreshKeyAdmitsExactlyTheLimit: a fresh key admits requests_per_unit, the
// remaining counting down to 0, then refuses.
func FreshKeyAdmitsExactlyTheLimit(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	for i := range 5 {
		resp := h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=u")))
		if resp.OverallCode != ok {
			t.Fatalf("request %d: %v", i, resp)
		}
		check(t, fmt.Sprintf("request %d", i), resp.Statuses[0], lim(ok, 5, second, uint32(4-i)))
	}
	resp := h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=u")))
	check(t, "request 5", resp.Statuses[0], lim(over, 5, second, 0))
	if resp.OverallCode != over {
		t.Errorf("request 5: overall %v", resp.OverallCode)
	}
	// Another value of the default entry has a bucket of its own.
	resp = h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=v")))
	check(t, "other value", resp.Statuses[0], lim(ok, 5, second, 4))
	// A fifth of a second refills one.
	h.Clock.Advance(200 * time.Millisecond)
	resp = h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=u")))
	check(t, "after 200ms", resp.Statuses[0], lim(ok, 5, second, 0))
	resp = h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=u")))
	check(t, "after 200ms, again", resp.Statuses[0], lim(over, 5, second, 0))
}

// BoundaryBurstRefused: 20 a minute spent at 0:59 is not available again
// at 1:00, where a fixed window would admit 20 more; it refills at 20 a
// minute, one every 3 s.
func BoundaryBurstRefused(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	h.Clock.Set(int64(59 * time.Second))
	resp := h.Ask(Req("test-domain", 20, D("key2=burst")))
	check(t, "burst at 0:59", resp.Statuses[0], lim(ok, 20, minute, 0))
	h.Clock.Set(int64(60 * time.Second))
	resp = h.Ask(Req("test-domain", 0, D("key2=burst")))
	check(t, "at 1:00", resp.Statuses[0], lim(over, 20, minute, 0))
	h.Clock.Set(int64(62*time.Second - 1))
	resp = h.Ask(Req("test-domain", 0, D("key2=burst")))
	check(t, "just before 1:02", resp.Statuses[0], lim(over, 20, minute, 0))
	h.Clock.Set(int64(62 * time.Second))
	resp = h.Ask(Req("test-domain", 0, D("key2=burst")))
	check(t, "3 s after", resp.Statuses[0], lim(ok, 20, minute, 0))
	// Over the two minutes 0:59 to 1:59, 20 + 20 at most.
	admitted := 21
	for s := 63; s < 119; s++ {
		h.Clock.Set(int64(time.Duration(s) * time.Second))
		for {
			resp = h.Ask(Req("test-domain", 0, D("key2=burst")))
			if resp.OverallCode != ok {
				break
			}
			admitted++
		}
	}
	if admitted > 40 {
		t.Errorf("%d admitted between 0:59 and 1:59, at most 40 possible", admitted)
	}
	if admitted != 39 {
		t.Errorf("%d admitted, want 20 + one every 3 s for 56 s (19)", admitted)
	}
}

// AllOrNothing: when one descriptor is over its limit, the others of the
// request are not charged.
func AllOrNothing(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	two := func() *rlsv3.RateLimitResponse {
		return h.Ask(Req("test-domain", 0, D("key3=a"), D("key2=b")))
	}
	resp := two()
	check(t, "first key3", resp.Statuses[0], lim(ok, 1, hour, 0))
	check(t, "first key2", resp.Statuses[1], lim(ok, 20, minute, 19))
	for i := range 3 {
		resp = two()
		if resp.OverallCode != over {
			t.Fatalf("request %d: overall %v", i, resp.OverallCode)
		}
		check(t, "key3 over", resp.Statuses[0], lim(over, 1, hour, 0))
		check(t, "key2 not charged", resp.Statuses[1], lim(ok, 20, minute, 19))
	}
	resp = h.Ask(Req("test-domain", 0, D("key2=b")))
	check(t, "key2 alone", resp.Statuses[0], lim(ok, 20, minute, 18))
	// Two descriptors of one bucket add up: 15 + 15 is over 20, and
	// neither is charged.
	resp = h.Ask(Req("test-domain", 0, DH(15, "key2=c"), DH(15, "key2=c")))
	if resp.OverallCode != over {
		t.Fatalf("15+15 of 20: overall %v", resp.OverallCode)
	}
	resp = h.Ask(Req("test-domain", 0, DH(10, "key2=c"), DH(10, "key2=c")))
	check(t, "10+10 of 20", resp.Statuses[0], lim(ok, 20, minute, 0))
	check(t, "10+10 of 20, second", resp.Statuses[1], lim(ok, 20, minute, 0))
}

// HitsAddend: the request's hits_addend is every descriptor's cost, a
// descriptor's own overrides it, and a descriptor's 0 checks without
// charging.
func HitsAddend(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	resp := h.Ask(Req("test-domain", 3, D("key1=value1", "subkey1=h")))
	check(t, "3 of 5", resp.Statuses[0], lim(ok, 5, second, 2))
	resp = h.Ask(Req("test-domain", 3, D("key1=value1", "subkey1=h")))
	check(t, "3 more", resp.Statuses[0], lim(over, 5, second, 2))
	resp = h.Ask(Req("test-domain", 3, DH(2, "key1=value1", "subkey1=h")))
	check(t, "own 2", resp.Statuses[0], lim(ok, 5, second, 0))
	resp = h.Ask(Req("test-domain", 0, DH(0, "key1=value1", "subkey1=h")))
	check(t, "check only, empty", resp.Statuses[0], lim(over, 5, second, 0))
	resp = h.Ask(Req("test-domain", 0, DH(0, "key1=value1", "subkey1=i")))
	check(t, "check only, full", resp.Statuses[0], lim(ok, 5, second, 5))
	resp = h.Ask(Req("test-domain", 0, DH(0, "key1=value1", "subkey1=i")))
	check(t, "check only charges nothing", resp.Statuses[0], lim(ok, 5, second, 5))
	// A cost above the limit never passes and charges nothing.
	resp = h.Ask(Req("test-domain", 6, D("key1=value1", "subkey1=i")))
	check(t, "6 of 5", resp.Statuses[0], lim(over, 5, second, 5))
	if hv := header(resp.ResponseHeadersToAdd, "Retry-After"); hv != "" {
		t.Errorf("Retry-After %q for a cost no wait admits", hv)
	}
}

// ReloadTopsNobodyUp: raising a limit keeps a spent bucket spent; it then
// refills at the new rate.
func ReloadTopsNobodyUp(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	resp := h.Ask(Req("test-domain", 5, D("key1=value1", "subkey1=r")))
	check(t, "spent", resp.Statuses[0], lim(ok, 5, second, 0))
	raised := strings.Replace(BasicConfigYAML, "unit: second\n          requests_per_unit: 5", "unit: second\n          requests_per_unit: 50", 1)
	if raised == BasicConfigYAML {
		t.Fatal("the replacement did not apply")
	}
	before := h.A.Policy().Version
	if err := h.Server.Reload(context.Background(), Parse(t, raised)...); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if v := h.A.Policy().Version; v != before+1 {
		t.Errorf("version %d after reload, want %d", v, before+1)
	}
	resp = h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=r")))
	check(t, "after raise", resp.Statuses[0], lim(over, 50, second, 0))
	resp = h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=fresh")))
	check(t, "fresh key under the new limit", resp.Statuses[0], lim(ok, 50, second, 49))
	h.Clock.Advance(20 * time.Millisecond) // one token at 50 a second
	resp = h.Ask(Req("test-domain", 0, D("key1=value1", "subkey1=r")))
	check(t, "refilled at the new rate", resp.Statuses[0], lim(ok, 50, second, 0))
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

// Headers: the RateLimit fields of the binding descriptor, and Retry-After
// when over.
func Headers(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	resp := h.Ask(Req("test-domain", 0, D("key2=h"), D("key4=x")))
	if got := header(resp.ResponseHeadersToAdd, "RateLimit-Policy"); got != `"key4_rate_limit";q=1;w=86400` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "RateLimit"); got != `"key4_rate_limit";r=0;t=86400` {
		t.Errorf("RateLimit %q", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "" {
		t.Errorf("Retry-After %q on an admitted request", got)
	}
	resp = h.Ask(Req("test-domain", 0, D("key2=h"), D("key4=x")))
	if resp.OverallCode != over {
		t.Fatalf("overall %v", resp.OverallCode)
	}
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "86400" {
		t.Errorf("Retry-After %q, want 86400", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "RateLimit"); got != `"key4_rate_limit";r=0;t=86400` {
		t.Errorf("RateLimit %q", got)
	}
	resp = h.Ask(Req("test-domain", 0, D("key2=h")))
	if got := header(resp.ResponseHeadersToAdd, "RateLimit-Policy"); got != `"20-per-minute";q=20;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := header(resp.ResponseHeadersToAdd, "RateLimit"); got != `"20-per-minute";r=18;t=6` {
		t.Errorf("RateLimit %q", got)
	}
	if d := resp.Statuses[0].GetDurationUntilReset().AsDuration(); d != 6*time.Second {
		t.Errorf("duration_until_reset %v, want 6s (2 tokens at 20 a minute)", d)
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
	h := Start(t, f, BasicConfigYAML)
	many := Req("test-domain", 0)
	for i := range 65 {
		many.Descriptors = append(many.Descriptors, D(fmt.Sprintf("key2=%d", i)))
	}
	overridden := D("key2=x")
	overridden.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: rlv3type.RateLimitUnit_SECOND}
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
	}{
		{Req("", 0, D("key2=x")), codes.InvalidArgument},
		{Req("test-domain", 0), codes.InvalidArgument},
		{many, codes.InvalidArgument},
		{Req("test-domain", 0, overridden), codes.Unimplemented},
	} {
		if _, err := h.Client.ShouldRateLimit(context.Background(), c.req); status.Code(err) != c.code {
			t.Errorf("%.80v: %v, want %v", c.req, err, c.code)
		}
	}
	// Nothing was charged by the refused requests.
	resp := h.Ask(Req("test-domain", 0, D("key2=x"), D("key2=0")))
	check(t, "key2=x", resp.Statuses[0], lim(ok, 20, minute, 19))
	check(t, "key2=0", resp.Statuses[1], lim(ok, 20, minute, 19))
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
	h := Start(t, f, BasicConfigYAML)
	h.Ask(Req("test-domain", 0, D("key3=c")))
	resp := h.Ask(Req("test-domain", 0, DH(0, "key3=c"), D("key2=c")))
	if resp.OverallCode != over {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	check(t, "check only", resp.Statuses[0], lim(over, 1, hour, 0))
	check(t, "not charged", resp.Statuses[1], lim(ok, 20, minute, 20))
	if got := header(resp.ResponseHeadersToAdd, "Retry-After"); got != "3600" {
		t.Errorf("Retry-After %q, want 3600", got)
	}
}

// ConcurrentAllOrNothing: clients racing on two descriptors of limits 5 and
// 20 (the clock still) get exactly 5 admissions, and the bucket of 20 is
// charged for exactly those 5.
func ConcurrentAllOrNothing(t *testing.T, f Factory) {
	h := Start(t, f, BasicConfigYAML)
	const clients, each = 8, 6
	var wg sync.WaitGroup
	admitted := make(chan int, clients)
	for range clients {
		wg.Go(func() {
			n := 0
			for range each {
				resp, err := h.Client.ShouldRateLimit(context.Background(),
					Req("test-domain", 0, D("key1=value1", "subkey1=race"), D("key2=race")))
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
	if total != 5 {
		t.Errorf("%d admitted, want exactly 5", total)
	}
	resp := h.Ask(Req("test-domain", 0, D("key2=race")))
	check(t, "key2 after the race", resp.Statuses[0], lim(ok, 20, minute, 14))
}

func header(hs []*corev3.HeaderValue, key string) string {
	for _, h := range hs {
		if h.GetKey() == key {
			return h.GetValue()
		}
	}
	return ""
}
