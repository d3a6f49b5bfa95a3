package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestParseConfigRefuses: what the reference server refuses in a
// configuration file is refused, and more, with the kind of error, the line
// and the field.
func TestParseConfigRefuses(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       error
		line       int
		field      string
	}{
		{"unterminated quote", "domain: \"billing\n", envoyrls.ErrSyntax, 2, ""},
		{"empty file", "", envoyrls.ErrEmptyDomain, 1, "domain"},
		{"no domain", "descriptors:\n  - key: seat\n    rate_limit: {unit: hour, requests_per_unit: 9}\n", envoyrls.ErrEmptyDomain, 1, "domain"},
		{"nested entry without a key", "domain: billing\ndescriptors:\n  - key: plan\n    descriptors:\n      - value: pro\n",
			envoyrls.ErrEmptyKey, 5, "key"},
		{"same key and value twice", "domain: billing\ndescriptors:\n  - key: seat\n    value: team\n    rate_limit: {unit: hour, requests_per_unit: 9}\n  - {key: seat, value: team}\n",
			envoyrls.ErrDuplicateKey, 6, "key"},
		{"key and value joined by _ collide", "domain: d\ndescriptors:\n  - key: a_b\n    value: c\n  - key: a\n    value: b_c\n",
			envoyrls.ErrDuplicateKey, 5, "key"},
		{"nested unit not a unit", "domain: billing\ndescriptors:\n  - key: seat\n    descriptors:\n      - key: user\n        rate_limit:\n          requests_per_unit: 9\n          unit: decade\n",
			envoyrls.ErrUnknownUnit, 8, "unit"},
		{"no requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n",
			envoyrls.ErrMissingRequests, 5, "requests_per_unit"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 7\n",
			envoyrls.ErrUnknownUnit, 5, "unit"},
		{"unit unknown", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 7}\n",
			envoyrls.ErrUnknownUnit, 4, "unit"},
		{"misspelled entry field", "domain: billing\ndescriptors:\n  - key: seat\n    rate-limit: {unit: hour, requests_per_unit: 9}\n",
			envoyrls.ErrUnknownField, 4, "rate-limit"},
		{"misspelled rate_limit field", "domain: billing\ndescriptors:\n  - key: seat\n    rate_limit:\n      unit: hour\n      request_per_unit: 9\n",
			envoyrls.ErrUnknownField, 6, "request_per_unit"},
		{"unknown top field", "domain: d\nunit: second\n", envoyrls.ErrUnknownField, 2, "unit"},
		{"number as a field name", "domain: billing\ndescriptors:\n  - key: seat\n    2.5: team\n", envoyrls.ErrNonStringKey, 4, "2.5"},
		{"descriptors of scalars", "domain: billing\ndescriptors:\n  - seat\n  - plan\n", envoyrls.ErrFieldType, 3, "descriptors"},
		{"replaces its own name", "domain: billing\ndescriptors:\n  - key: seat\n    rate_limit:\n      name: seats\n      unit: hour\n      requests_per_unit: 9\n      replaces: [{name: seats}]\n",
			envoyrls.ErrReplaces, 8, "replaces"}, // the entry's line, as for an empty one
		{"empty domain after the descriptors", "descriptors: []\ndomain: \"\"\n", envoyrls.ErrEmptyDomain, 2, "domain"},
		{"replaces naming nothing", "domain: billing\ndescriptors:\n  - key: seat\n    rate_limit:\n      name: seats\n      replaces:\n        - name:\n      unit: hour\n      requests_per_unit: 9\n",
			envoyrls.ErrReplaces, 7, "replaces"},
		{"unlimited with a unit", "domain: billing\ndescriptors:\n  - key: admin\n    rate_limit:\n      requests_per_unit: 9\n      unit: hour\n      unlimited: true\n",
			envoyrls.ErrUnlimitedWithUnit, 6, "unit"},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			envoyrls.ErrShareThreshold, 3, "share_threshold"},
		{"negative requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			envoyrls.ErrFieldType, 4, "requests_per_unit"},
		{"a fraction of a request", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
			envoyrls.ErrFieldType, 4, "requests_per_unit"},
		{"a whole float of requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5.0}\n",
			envoyrls.ErrFieldType, 4, "requests_per_unit"},
		{"requests_per_unit empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit:\n",
			envoyrls.ErrMissingRequests, 5, "requests_per_unit"},
		{"requests_per_unit null", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: ~}\n",
			envoyrls.ErrMissingRequests, 4, "requests_per_unit"},
		{"a merge key", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {<<: {unit: second}, requests_per_unit: 1}\n",
			envoyrls.ErrUnsupported, 4, "<<"},
		{"a float as a value", "domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n", envoyrls.ErrFieldType, 4, "value"},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: k\n    metadata: [1, 2]\n", envoyrls.ErrFieldType, 4, "metadata"},
		{"word for a bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", envoyrls.ErrFieldType, 4, "shadow_mode"},
		{"field twice", "domain: d\ndomain: e\n", envoyrls.ErrFieldType, 2, "domain"},
		{"quota_mode", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n", envoyrls.ErrUnsupported, 4, "quota_mode"},
		{"rate_limit a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n", envoyrls.ErrFieldType, 4, "rate_limit"},
		// One domain a file: a second document would be dropped unread,
		// its limits never applied, or its YAML never checked.
		{"a second domain in the file", "domain: a\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n---\ndomain: b\n",
			envoyrls.ErrUnsupported, 5, "---"},
		{"a second document that does not parse", "domain: a\n---\ndomain: \"b\n", envoyrls.ErrSyntax, 3, ""},
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

// TestParseConfigAccepts: the suite's configurations parse, and so do
// ignored fields, every unit and aliases.
func TestParseConfigAccepts(t *testing.T) {
	for _, y := range []string{rlstest.TreeYAML, rlstest.ShadowYAML, rlstest.WildcardValuesYAML, rlstest.SharedBucketsYAML,
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
		"---\ndomain: d\n...\n",
		"domain: d\n---\n# nothing after the marker\n",
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

// "requests_per_unit is a whole number from 0 to 4294967295, written as
// envoyproxy/ratelimit's YAML library reads one ... anything larger is
// refused, not wrapped or clamped": each form's limit, as the policy's
// capacity, or its refusal.
func TestParseConfigNumbers(t *testing.T) {
	for _, c := range []struct {
		rpu  string
		want int64 // -1: refused
	}{
		{"0", 0}, {"-0", 0}, {"+5", 5}, {"1_000", 1000}, {"0x10", 16}, {"0b11", 3}, {"017", 15}, {"0o17", 15},
		{"4294967295", math.MaxUint32}, {"0xffffffff", math.MaxUint32},
		{"4294967296", -1}, {"0x100000000", -1}, {"18446744073709551616", -1}, {"-1", -1}, {"-4294967295", -1},
		{"1e3", -1}, {"1.0", -1}, {".inf", -1}, {"'5'", -1}, {"0x", -1},
	} {
		y := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: " + c.rpu + "}\n"
		cfg, err := envoyrls.ParseConfig([]byte(y))
		if c.want < 0 {
			if !errors.Is(err, envoyrls.ErrFieldType) {
				t.Errorf("requests_per_unit %s: %v, want ErrFieldType", c.rpu, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("requests_per_unit %s: %v", c.rpu, err)
			continue
		}
		p, err := envoyrls.Policy(1, cfg)
		if err != nil {
			t.Fatal(err)
		}
		o := p.Overrides.Overrides()[0]
		if got := o.Capacity; c.want > 0 && got != c.want || c.want == 0 && o.Refill.Per != 365*24*time.Hour {
			t.Errorf("requests_per_unit %s: capacity %d, refill %v; want %d", c.rpu, got, o.Refill, c.want)
		}
	}
}

// TestParseConfigYAML11Booleans: envoyproxy/ratelimit reads its files with
// yaml.v2, where a plain yes, on or y (and no, off, n) is a boolean, so a
// file of it that writes shadow_mode: yes or unlimited: on is read, with
// that meaning; a quoted "yes" is a string there, and refused as here.
func TestParseConfigYAML11Booleans(t *testing.T) {
	h := rlstest.Start(t, newEngine, "domain: d\ndescriptors:\n"+
		"  - key: s\n    shadow_mode: yes\n    detailed_metric: On\n    rate_limit: {unit: minute, requests_per_unit: 0}\n"+
		"  - key: u\n    shadow_mode: off\n    rate_limit: {unlimited: Y}\n"+
		"  - key: w\n    value: a*\n    share_threshold: YES\n    value_to_metric: n\n    quota_mode: NO\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	resp := h.Ask(rlstest.Req("d", 0, rlstest.D("s=x"), rlstest.D("u=x"), rlstest.D("w=a1")))
	if resp.OverallCode != rlstest.OK {
		t.Errorf("overall %v: shadow_mode: yes not read as true", resp.OverallCode)
	}
	if got := resp.Statuses[1].GetLimitRemaining(); got != math.MaxUint32 {
		t.Errorf("unlimited: Y: limit_remaining %d, want unlimited", got)
	}
	resp = h.Ask(rlstest.Req("d", 0, rlstest.D("w=a2")))
	if resp.OverallCode != rlstest.OverLimit {
		t.Errorf("share_threshold: YES: a second value of a* %v, want OVER_LIMIT (one shared bucket)", resp.OverallCode)
	}
	_, err := envoyrls.ParseConfig([]byte("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"yes\"\n"))
	if !errors.Is(err, envoyrls.ErrFieldType) {
		t.Errorf("a quoted \"yes\": %v, want ErrFieldType", err)
	}
}

// TestPolicy: the policy's overrides, one per limited entry (a limit of 0
// keeps a bucket of one token), with the reference's units, each of them (a
// month is 30 days, a year 365).
func TestPolicy(t *testing.T) {
	cfgs := rlstest.Parse(t, "domain: d\ndescriptors:\n"+
		"  - {key: a, value: x, rate_limit: {unit: second, requests_per_unit: 3}}\n"+
		"  - {key: b, rate_limit: {unit: month, requests_per_unit: 7}}\n"+
		"  - {key: c, rate_limit: {unlimited: true}}\n"+
		"  - {key: z, rate_limit: {unit: second, requests_per_unit: 0}}\n"+
		"  - {key: d, value: v, rate_limit: {unit: day, requests_per_unit: 2}}\n"+
		"  - {key: h, value: v, rate_limit: {unit: hour, requests_per_unit: 2}}\n"+
		"  - {key: m, value: v, rate_limit: {unit: minute, requests_per_unit: 2}}\n"+
		"  - {key: w, value: v, rate_limit: {unit: week, requests_per_unit: 2}}\n"+
		"  - {key: y, value: v, rate_limit: {unit: year, requests_per_unit: 2}}\n")
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
		{Match: "{d}/z~|*", Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 365 * 24 * 3600e9}},
		{Match: "{d}/d=v|", Capacity: 2, Refill: policy.Rate{Tokens: 2, Per: 24 * 3600e9}},
		{Match: "{d}/h=v|", Capacity: 2, Refill: policy.Rate{Tokens: 2, Per: 3600e9}},
		{Match: "{d}/m=v|", Capacity: 2, Refill: policy.Rate{Tokens: 2, Per: 60e9}},
		{Match: "{d}/w=v|", Capacity: 2, Refill: policy.Rate{Tokens: 2, Per: 7 * 24 * 3600e9}},
		{Match: "{d}/y=v|", Capacity: 2, Refill: policy.Rate{Tokens: 2, Per: 365 * 24 * 3600e9}},
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
	cfgs := rlstest.Parse(t, rlstest.TreeYAML)
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
	other := rlstest.Parse(t, rlstest.WildcardValuesYAML)
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

// TestNewServerMismatchSaysWhat: the error of a policy that is not the
// configurations' names the entry it limits otherwise and says how to
// install theirs, as on a Redis store whose prefix kept an earlier
// configuration's policy.
func TestNewServerMismatchSaysWhat(t *testing.T) {
	yaml := func(n int) []*envoyrls.Config {
		return rlstest.Parse(t, fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n  - key: j\n    value: v\n    rate_limit: {unit: minute, requests_per_unit: 3}\n", n))
	}
	p, err := envoyrls.Policy(1, yaml(5)...)
	if err != nil {
		t.Fatal(err)
	}
	_, err = envoyrls.NewServer(newEngine(t, p, nil), yaml(7)...)
	if !errors.Is(err, envoyrls.ErrPolicyMismatch) {
		t.Fatalf("another limit: %v, want ErrPolicyMismatch", err)
	}
	for _, want := range []string{`limits "{d}/k`, "with the admitter's ReplacePolicy"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
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

// TestParseConfigReplacesBomb: one rate_limit with a long replaces list,
// named by an alias from each of a few thousand descriptors, is refused
// once the replaces entries read pass 100,000, rather than read and held
// once per descriptor (15 KB of YAML took 30 s and 3 GB before).
func TestParseConfigReplacesBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k0\n    rate_limit: &r {unit: second, requests_per_unit: 1, replaces: [")
	for i := range 1000 {
		fmt.Fprintf(&b, "{name: r%d},", i)
	}
	b.WriteString("]}\n    descriptors: &a0\n")
	for i := range 10 {
		fmt.Fprintf(&b, "      - {key: x%d, rate_limit: *r}\n", i)
	}
	b.WriteString("  - key: k1\n    descriptors:\n")
	for i := range 10 {
		fmt.Fprintf(&b, "      - {key: x%d, rate_limit: *r, descriptors: *a0}\n", i)
	}
	// 121 rate_limits, each with the 1,000 entries.
	if _, err := envoyrls.ParseConfig([]byte(b.String())); !errors.Is(err, envoyrls.ErrTooLarge) {
		t.Errorf("121,000 replaces entries through aliases: %v", err)
	}
}

// TestParseConfigPathBomb: each descriptor holds its path, its ancestors'
// keys and values with its own, so deep nesting costs the square of its
// depth; past 64 MiB of paths the configuration is refused. 400 levels of
// 1,000-byte keys are 80 MB of paths from 400 KB of YAML; a list that an
// alias nests in itself, 50 bytes, is 100,000 levels deep (15 GB of paths,
// two minutes, before the bound).
func TestParseConfigPathBomb(t *testing.T) {
	key := strings.Repeat("k", 1000)
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors: ")
	for range 400 {
		b.WriteString("[{key: " + key + ", descriptors: ")
	}
	b.WriteString("[]")
	for range 400 {
		b.WriteString("}]")
	}
	b.WriteString("\n")
	if _, err := envoyrls.ParseConfig([]byte(b.String())); !errors.Is(err, envoyrls.ErrTooLarge) {
		t.Fatalf("80 MB of paths: %v", err)
	}
	if _, err := envoyrls.ParseConfig([]byte("domain: d\ndescriptors: &a\n  - {key: k, descriptors: *a}\n")); !errors.Is(err, envoyrls.ErrTooLarge) {
		t.Errorf("a list nested in itself: %v", err)
	}
}

// TestParseConfigBinaryStrings: a !!binary scalar is the bytes its base64
// spells, as envoyproxy/ratelimit's YAML library reads it into a string:
// value: !!binary aGVsbG8= is the value "hello" there, and a request of
// hello reaches the entry here too, not only one of "aGVsbG8=". Base64
// that does not decode is refused, as there.
func TestParseConfigBinaryStrings(t *testing.T) {
	h := rlstest.Start(t, newEngine, "domain: !!binary ZA==\ndescriptors:\n"+
		"  - key: !!binary aw==\n    value: !!binary aGVsbG8=\n    rate_limit: {unit: minute, requests_per_unit: 1, name: !!binary Ymlu}\n")
	resp := h.Ask(rlstest.Req("d", 0, rlstest.D("k=hello")))
	if got := resp.Statuses[0].GetCurrentLimit().GetName(); got != "bin" {
		t.Errorf("k=hello: limit %q, want the entry of value !!binary aGVsbG8=, name \"bin\"", got)
	}
	resp = h.Ask(rlstest.Req("d", 0, rlstest.D("k=aGVsbG8=")))
	if st := resp.Statuses[0]; st.GetCurrentLimit() != nil {
		t.Errorf("k=aGVsbG8= (the base64 itself) matched: %v", st)
	}
	_, err := envoyrls.ParseConfig([]byte("domain: d\ndescriptors:\n  - key: k\n    value: !!binary '%%%'\n"))
	if !errors.Is(err, envoyrls.ErrFieldType) {
		t.Errorf("!!binary of bad base64: %v, want ErrFieldType", err)
	}
}

// A boolean written with no value is false, as envoyproxy/ratelimit's YAML
// library reads a null into a bool: shadow_mode: with nothing after it
// enforces, unlimited: limits. A rate_limit with no value stays refused:
// read there as no limit, it would leave the entry unlimited unseen.
func TestParseConfigNullBooleans(t *testing.T) {
	h := rlstest.Start(t, newEngine, "domain: d\ndescriptors:\n"+
		"  - key: k\n    shadow_mode:\n    share_threshold:\n    detailed_metric:\n    quota_mode:\n"+
		"    rate_limit: {unit: minute, requests_per_unit: 1, unlimited: }\n")
	if got := h.Ask(rlstest.Req("d", 0, rlstest.D("k=a"))).OverallCode; got != rlstest.OK {
		t.Fatalf("first request: %v, want OK", got)
	}
	if got := h.Ask(rlstest.Req("d", 0, rlstest.D("k=a"))).OverallCode; got != rlstest.OverLimit {
		t.Errorf("second request of a limit of 1 a minute, shadow_mode and unlimited null: %v, want OVER_LIMIT", got)
	}
	_, err := envoyrls.ParseConfig([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"))
	if !errors.Is(err, envoyrls.ErrFieldType) {
		t.Errorf("rate_limit with no value: %v, want ErrFieldType", err)
	}
}
