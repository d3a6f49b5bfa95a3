package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestParseConfigRefuses: envoyproxy/ratelimit's invalid test
// configurations (test/config/*.yaml), and more, are refused with the kind
// of error, the line and the field.
func TestParseConfigRefuses(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       error
		line       int
		field      string
	}{
		{"bad_yaml", "'''\n", envoyrls.ErrSyntax, 2, ""},
		{"empty file", "", envoyrls.ErrEmptyDomain, 1, "domain"},
		{"empty_domain", "descriptors:\n", envoyrls.ErrEmptyDomain, 1, "domain"},
		{"empty_key", "domain: test-domain\ndescriptors:\n  - value: value1\n", envoyrls.ErrEmptyKey, 3, "key"},
		{"duplicate_key", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
			envoyrls.ErrDuplicateKey, 6, "key"},
		{"duplicate composite key", "domain: d\ndescriptors:\n  - key: a_b\n    value: c\n  - key: a\n    value: b_c\n",
			envoyrls.ErrDuplicateKey, 5, "key"},
		{"bad_limit_unit", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
			envoyrls.ErrUnknownUnit, 6, "unit"},
		{"no requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n",
			envoyrls.ErrMissingRequests, 5, "requests_per_unit"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
			envoyrls.ErrUnknownUnit, 5, "unit"},
		{"unit unknown", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 5}\n",
			envoyrls.ErrUnknownUnit, 4, "unit"},
		{"misspelled_key", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
			envoyrls.ErrUnknownField, 5, "ratelimit"},
		{"misspelled_key2", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			envoyrls.ErrUnknownField, 7, "requestsperunit"},
		{"unknown top field", "domain: d\nunit: second\n", envoyrls.ErrUnknownField, 2, "unit"},
		{"non_string_key", "0.25: test-domain\ndescriptors:\n  - key: key1\n", envoyrls.ErrNonStringKey, 1, "0.25"},
		{"non_map_list", "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n", envoyrls.ErrFieldType, 3, "descriptors"},
		{"replaces_self", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
			envoyrls.ErrReplaces, 6, "replaces"},
		{"replaces_empty", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
			envoyrls.ErrReplaces, 10, "replaces"},
		{"unlimited_with_unit", "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
			envoyrls.ErrUnlimitedWithUnit, 6, "unit"},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			envoyrls.ErrShareThreshold, 3, "share_threshold"},
		{"negative requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			envoyrls.ErrFieldType, 4, "requests_per_unit"},
		{"word for a bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", envoyrls.ErrFieldType, 4, "shadow_mode"},
		{"field twice", "domain: d\ndomain: e\n", envoyrls.ErrFieldType, 2, "domain"},
		{"quota_mode", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n", envoyrls.ErrUnsupported, 4, "quota_mode"},
		{"rate_limit a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n", envoyrls.ErrFieldType, 4, "rate_limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := envoyrls.ParseConfig([]byte(c.yaml))
			if cfg != nil || !errors.Is(err, c.want) || !errors.Is(err, envoyrls.ErrInvalidConfig) {
				t.Fatalf("ParseConfig: %v, %v; want %v", cfg, err, c.want)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("line %d", c.line)) {
				t.Errorf("error %q does not name line %d", err, c.line)
			}
			if c.field != "" && !strings.Contains(err.Error(), fmt.Sprintf("field %q", c.field)) {
				t.Errorf("error %q does not name field %q", err, c.field)
			}
		})
	}
}

// TestParseConfigAccepts: the reference's valid test configurations parse,
// with every unit.
func TestParseConfigAccepts(t *testing.T) {
	for _, y := range []string{rlstest.BasicConfigYAML, rlstest.ShadowModeYAML, rlstest.WildcardYAML, rlstest.ShareThresholdYAML,
		"domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [1, {b: c}]}\n    detailed_metric: true\n    value_to_metric: false\n    quota_mode: false\n",
		"domain: d\ndescriptors:\n" +
			"  - {key: a, rate_limit: {unit: SECOND, requests_per_unit: 1}}\n" +
			"  - {key: b, rate_limit: {unit: Minute, requests_per_unit: 1}}\n" +
			"  - {key: c, rate_limit: {unit: hour, requests_per_unit: 1}}\n" +
			"  - {key: d, rate_limit: {unit: day, requests_per_unit: 1}}\n" +
			"  - {key: e, rate_limit: {unit: week, requests_per_unit: 1}}\n" +
			"  - {key: f, rate_limit: {unit: month, requests_per_unit: 1}}\n" +
			"  - {key: g, rate_limit: {unit: year, requests_per_unit: 4294967295}}\n" +
			"  - {key: h, rate_limit: {unlimited: true}}\n" +
			"  - {key: i, rate_limit: {unit: second, requests_per_unit: 0}}\n",
		"domain: d\ndescriptors:\n  - key: a\n    rate_limit: &l {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: *l\n",
	} {
		c, err := envoyrls.ParseConfig([]byte(y))
		if err != nil {
			t.Fatalf("ParseConfig(%.40q): %v", y, err)
		}
		if c.Domain() == "" {
			t.Errorf("no domain")
		}
		if _, err := envoyrls.Policy(1, c); err != nil {
			t.Errorf("Policy(%.40q): %v", y, err)
		}
	}
}

// TestPolicy: the policy's overrides, one per limited entry, with the
// reference's units.
func TestPolicy(t *testing.T) {
	cfgs := rlstest.Parse(t, "domain: d\ndescriptors:\n"+
		"  - {key: a, value: x, rate_limit: {unit: second, requests_per_unit: 3}}\n"+
		"  - {key: b, rate_limit: {unit: month, requests_per_unit: 7}}\n"+
		"  - {key: c, rate_limit: {unlimited: true}}\n"+
		"  - {key: z, rate_limit: {unit: second, requests_per_unit: 0}}\n")
	p, err := envoyrls.Policy(4, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != 4 || p.Capacity != envoyrls.DefaultCapacity {
		t.Errorf("policy %+v", p)
	}
	ovs := p.Overrides.Overrides()
	want := []policy.Override{
		{Match: "{d}/a=x|", Capacity: 3, TokensPerSecond: 3},
		{Match: "{d}/b~|*", Capacity: 7, Refill: policy.Rate{Tokens: 7, Per: 30 * 24 * 3600e9}},
	}
	if len(ovs) != len(want) {
		t.Fatalf("overrides %+v, want %+v", ovs, want)
	}
	for i := range want {
		if ovs[i] != want[i] {
			t.Errorf("override %d: %+v, want %+v", i, ovs[i], want[i])
		}
	}
	if _, err := envoyrls.Policy(1, cfgs[0], cfgs[0]); !errors.Is(err, envoyrls.ErrDuplicateDomain) {
		t.Errorf("two configurations of one domain: %v", err)
	}
	if _, err := envoyrls.Policy(1, nil); !errors.Is(err, envoyrls.ErrNilConfig) {
		t.Errorf("nil configuration: %v", err)
	}
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	for i := range policy.MaxPatterns + 1 {
		fmt.Fprintf(&b, "  - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	many := rlstest.Parse(t, b.String())
	if _, err := envoyrls.Policy(1, many...); !errors.Is(err, envoyrls.ErrTooManyWildcardRules) {
		t.Errorf("%d pattern entries: %v", policy.MaxPatterns+1, err)
	}
}

// noPeek hides the engine's Peek.
type noPeek struct{ engine.Admitter }

// TestNewServer: the admitter must run Policy(configs) and have Peek.
func TestNewServer(t *testing.T) {
	cfgs := rlstest.Parse(t, rlstest.BasicConfigYAML)
	p, err := envoyrls.Policy(7, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, p, nil)
	if _, err := envoyrls.NewServer(e, cfgs...); err != nil {
		t.Errorf("NewServer at version 7: %v", err)
	}
	if _, err := envoyrls.NewServer(noPeek{e}, cfgs...); !errors.Is(err, envoyrls.ErrNoPeek) {
		t.Errorf("without Peek: %v", err)
	}
	if _, err := envoyrls.NewServer(nil, cfgs...); !errors.Is(err, envoyrls.ErrNilAdmitter) {
		t.Errorf("nil admitter: %v", err)
	}
	other := rlstest.Parse(t, rlstest.WildcardYAML)
	if _, err := envoyrls.NewServer(e, other...); !errors.Is(err, envoyrls.ErrPolicyMismatch) {
		t.Errorf("another configuration: %v", err)
	}
	// Installing the policy first makes it fit.
	q, err := envoyrls.Policy(8, other...)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ReplacePolicy(context.Background(), q, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := envoyrls.NewServer(e, other...); err != nil {
		t.Errorf("after ReplacePolicy: %v", err)
	}
}

// TestParseConfigAliasBomb: nested aliases that expand to millions of
// descriptors are refused, quickly.
func TestParseConfigAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k0\n    descriptors: &a0\n")
	for i := range 10 {
		fmt.Fprintf(&b, "      - {key: x%d}\n", i)
	}
	for lvl := 1; lvl <= 7; lvl++ {
		fmt.Fprintf(&b, "  - key: k%d\n    descriptors: &a%d\n", lvl, lvl)
		for i := range 10 {
			fmt.Fprintf(&b, "      - {key: x%d, descriptors: *a%d}\n", i, lvl-1)
		}
	}
	if _, err := envoyrls.ParseConfig([]byte(b.String())); !errors.Is(err, envoyrls.ErrTooLarge) {
		t.Errorf("10^8 descriptors through aliases: %v", err)
	}
}
