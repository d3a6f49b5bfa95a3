package envoyrls_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
)

// The configuration files of envoyproxy/ratelimit's test/config, copied in
// testdata/reference, and the answers its config_test.go expects of them:
// what it refuses is refused here, and a descriptor reaches the limit there
// that it reaches here.

func readRef(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "reference", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReferenceFixturesRefused(t *testing.T) {
	for _, c := range []struct {
		file string
		want error
	}{
		{"bad_limit_unit", envoyrls.ErrUnknownUnit},
		{"bad_yaml", envoyrls.ErrSyntax},
		{"duplicate_key", envoyrls.ErrDuplicateKey},
		{"empty_domain", envoyrls.ErrEmptyDomain},
		{"empty_key", envoyrls.ErrEmptyKey},
		{"misspelled_key", envoyrls.ErrUnknownField},
		{"misspelled_key2", envoyrls.ErrUnknownField},
		{"non_map_list", envoyrls.ErrFieldType},
		{"non_string_key", envoyrls.ErrNonStringKey},
		{"replaces_empty", envoyrls.ErrReplaces},
		{"replaces_self", envoyrls.ErrReplaces},
		{"unlimited_with_unit", envoyrls.ErrUnlimitedWithUnit},
	} {
		_, err := envoyrls.ParseConfig([]byte(readRef(t, c.file)))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.file, err, c.want)
		}
	}
	// duplicate_domain.yaml is test-domain again, beside basic_config.yaml.
	cfgs := rlstest.Parse(t, readRef(t, "basic_config"), readRef(t, "duplicate_domain"))
	if _, err := envoyrls.Policy(1, cfgs...); !errors.Is(err, envoyrls.ErrDuplicateDomain) {
		t.Errorf("duplicate_domain: %v, want ErrDuplicateDomain", err)
	}
}

// refLimit is what a descriptor reaches: nothing (rpu -1), unlimited (rpu
// -2), or a limit.
type refLimit struct {
	rpu  int64
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	name string
}

var (
	none      = refLimit{rpu: -1}
	unlimited = refLimit{rpu: -2}
)

func perSecond(n int64) refLimit {
	return refLimit{rpu: n, unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
}
func perMinute(n int64) refLimit {
	return refLimit{rpu: n, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
}

type refCase struct {
	domain  string
	entries []string
	want    refLimit
}

func checkRef(t *testing.T, h *rlstest.Harness, cases []refCase) {
	t.Helper()
	for _, c := range cases {
		domain := c.domain
		if domain == "" {
			domain = "test-domain"
		}
		resp := h.Ask(rlstest.Req(domain, 0, rlstest.D(c.entries...)))
		st := resp.Statuses[0]
		var got refLimit
		switch {
		case st.GetCurrentLimit() != nil:
			l := st.GetCurrentLimit()
			got = refLimit{int64(l.GetRequestsPerUnit()), l.GetUnit(), l.GetName()}
		case st.GetLimitRemaining() == math.MaxUint32:
			got = unlimited
		default:
			got = none
		}
		if got != c.want || st.GetCode() != rlstest.OK {
			t.Errorf("%s %q: %v (code %v), want %v", domain, c.entries, got, st.GetCode(), c.want)
		}
	}
}

func TestReferenceBasicConfig(t *testing.T) {
	h := rlstest.Start(t, newEngine, readRef(t, "basic_config"))
	checkRef(t, h, []refCase{
		{"foo_domain", nil, none},
		{"", nil, none},
		{"", []string{"key1=something"}, none},
		{"", []string{"key1=value1"}, none},
		{"", []string{"key2=value2", "subkey=subvalue"}, none},
		{"", []string{"key5=value5", "subkey5=subvalue"}, none},
		{"", []string{"key1=value1", "subkey1=something"}, perSecond(5)},
		{"", []string{"key1=value1", "subkey1=subvalue1"}, perSecond(10)},
		{"", []string{"key2=something"}, perMinute(20)},
		{"", []string{"key2=value2"}, perMinute(30)},
		{"", []string{"key2=value3"}, none},
		{"", []string{"key3=foo"}, refLimit{1, rlsv3.RateLimitResponse_RateLimit_HOUR, ""}},
		{"", []string{"key4=foo"}, refLimit{1, rlsv3.RateLimitResponse_RateLimit_DAY, "key4_rate_limit"}},
		{"", []string{"key5=value5"}, refLimit{15, rlsv3.RateLimitResponse_RateLimit_DAY, ""}},
		{"", []string{"key5=value5", "subkey5=subvalue5"}, refLimit{25, rlsv3.RateLimitResponse_RateLimit_DAY, ""}},
		{"", []string{"key6=foo"}, unlimited},
		{"", []string{"key7=unspecified_value"}, perMinute(70)},
		{"", []string{"key7=another_value"}, perMinute(70)},
		{"", []string{"key2="}, perMinute(20)},
	})
}

func TestReferenceWildcardConfig(t *testing.T) {
	h := rlstest.Start(t, newEngine, readRef(t, "wildcard"))
	checkRef(t, h, []refCase{
		{"", []string{"noVal=foo1"}, perMinute(20)},
		{"", []string{"noVal=foo2"}, perMinute(20)},
		{"", []string{"wild=foo1"}, perMinute(20)},
		{"", []string{"wild=foo2"}, perMinute(20)},
		{"", []string{"wild=foo"}, perMinute(20)},
		{"", []string{"nestedWild=val1", "wild=goo2"}, perMinute(20)},
		{"", []string{"wild=bar"}, none},
		{"", []string{"noWild=foo1"}, none},
		{"", []string{"midWild=barab"}, perMinute(20)},
		{"", []string{"midWild=bar123b"}, perMinute(20)},
		{"", []string{"midWild=barb"}, perMinute(20)},
		{"", []string{"midWild=bara"}, none},
		{"", []string{"midWild=xbarb"}, none},
		{"", []string{"multiWild=foo123bar456baz"}, perMinute(10)},
		{"", []string{"multiWild=foobarbaz"}, perMinute(10)},
		{"", []string{"multiWild=foo123baz"}, none},
		{"", []string{"multiWild=bar456baz"}, none},
	})
}

func TestReferenceShareThreshold(t *testing.T) {
	h := rlstest.Start(t, newEngine, readRef(t, "share_threshold"))
	checkRef(t, h, []refCase{
		{"", []string{"files=files/a.pdf"}, perMinute(100)},
		{"", []string{"nested=parent", "files=nested/x"}, perMinute(200)},
		{"", []string{"files=top/a", "files=nested/b"}, perMinute(300)},
		{"", []string{"route=api/v1", "method=GET"}, perMinute(60)},
		{"", []string{"service=svc/a", "endpoint=e"}, perMinute(80)},
		{"", []string{"path=path/a", "file=file/b", "type=t"}, perMinute(120)},
		{"", []string{"user=user/a", "resource=res/b", "action=x"}, perMinute(150)},
		{"", []string{"file=test1"}, perMinute(50)},
		{"", []string{"file=test2"}, perMinute(100)},
		{"", []string{"midpath=/api/v1"}, perMinute(100)},
		{"", []string{"midpath=/api/v2"}, none},
		{"", []string{"multiroute=svcXepYrpc"}, perMinute(50)},
		{"", []string{"multiroute=svcABCrpc"}, none},
		{"", []string{"midroute=/api-beta-v2"}, perMinute(80)},
		{"", []string{"tenant=t1prod", "resource=res1v2"}, perMinute(60)},
	})
}

// Which requests share a bucket, as envoyproxy/ratelimit's cache key has
// it: the request's values, each value matched by a wildcard with
// share_threshold replaced by the pattern.
func TestReferenceSharedBuckets(t *testing.T) {
	h := rlstest.Start(t, newEngine, readRef(t, "share_threshold"))
	for _, c := range []struct {
		domain string
		a, b   []string
		shared bool
	}{
		{"test-domain", []string{"files=files/a"}, []string{"files=files/b"}, true},
		{"test-domain", []string{"files=top/a", "files=nested/b"}, []string{"files=top/c", "files=nested/d"}, true},
		{"test-domain", []string{"route=api/a", "method=GET"}, []string{"route=api/b", "method=GET"}, true},
		{"test-domain", []string{"route=api/a", "method=GET"}, []string{"route=api/a", "method=PUT"}, false},
		{"test-domain", []string{"path=path/a", "file=file/b", "type=t"}, []string{"path=path/c", "file=file/b", "type=t"}, true},
		{"test-domain", []string{"path=path/a", "file=file/b", "type=t"}, []string{"path=path/a", "file=file/c", "type=t"}, false},
		{"test-domain", []string{"tenant=t1prod", "resource=res1v2"}, []string{"tenant=t2prod", "resource=res2v2"}, true},
	} {
		ra := h.Ask(rlstest.Req(c.domain, 0, rlstest.D(c.a...))).Statuses[0]
		rb := h.Ask(rlstest.Req(c.domain, 0, rlstest.D(c.b...))).Statuses[0]
		rpu := rb.GetCurrentLimit().GetRequestsPerUnit()
		shared := rb.GetLimitRemaining() < ra.GetLimitRemaining()
		if shared != c.shared || rpu == 0 {
			t.Errorf("%q then %q: remaining %d then %d of %d: shared %v, want %v", c.a, c.b,
				ra.GetLimitRemaining(), rb.GetLimitRemaining(), rpu, shared, c.shared)
		}
	}
}

func TestReferenceShadowAndMetadata(t *testing.T) {
	h := rlstest.Start(t, newEngine, readRef(t, "shadowmode_config"))
	checkRef(t, h, []refCase{
		{"", []string{"key1=value1", "subkey1=something"}, perSecond(5)},
		{"", []string{"key1=value1", "subkey1=subvalue1"}, perSecond(10)},
		{"", []string{"key2=something"}, perMinute(20)},
		{"", []string{"key2=value2"}, perMinute(30)},
	})
	h = rlstest.Start(t, newEngine, readRef(t, "metadata"))
	checkRef(t, h, []refCase{
		{"", []string{"key1=value1", "subkey1=something"}, perSecond(5)},
		{"", []string{"key2=something"}, perMinute(20)},
	})
}
