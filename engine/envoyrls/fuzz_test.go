package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/policy"
)

// FuzzDescriptorKeys builds a configuration tree and descriptors from the
// fuzzer's bytes, with keys and values from an alphabet of the bytes the
// key layout and the matcher give a meaning to, and checks each
// descriptor's answer against a reference matcher that compares keys and
// values as strings (no map, no separator):
//
//   - the limit the server reports is the entry the reference finds;
//   - the bucket key the admitter is given resolves, under Policy, to that
//     entry's override, is at most MaxKeyBytes long, and
//   - two descriptors have one bucket key exactly when they reach the same
//     entry of the same domain with the same values at its variable
//     entries: no descriptor can write itself into another's bucket.
//
// The same tree is served under two domains, so a key of one domain must
// never be a key of the other.
func FuzzDescriptorKeys(f *testing.F) {
	f.Add([]byte("domain"), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	f.Add([]byte{3, 4}, []byte{0x41, 3, 0x81, 5, 0x42, 2, 1, 4, 0xc3, 9, 9, 9, 0x40, 5, 7}, []byte{2, 0, 1, 3, 3, 7, 5, 5, 5, 1, 0, 0})
	f.Add([]byte{20, 20, 20, 20, 20}, []byte{0x51, 20, 20, 20, 0xa1, 21, 21, 21, 21, 0x40, 20, 20, 0x41, 21}, []byte{1, 3, 0, 0, 0, 1, 3, 1, 1, 1})
	// Entries whose key and value join alike around a NUL: key "a\0b"
	// value "a", and key "a" value "b\0a".
	f.Add([]byte("d"), []byte{2, 1, 1, 18, 1, 0, 1, 1, 0, 3, 1, 3, 0}, []byte{0, 0, 0, 0, 0, 0, 1, 1})
	f.Fuzz(func(t *testing.T, domain, tree, descs []byte) {
		fuzzDescriptorKeys(t, domain, tree, descs)
	})
}

// fuzzAtoms are the pieces of keys and values: the bytes the layout uses
// ("{}/=~!?|#*%"), the NUL and "_" that join a key to its value in a
// lookup, escapes that look like escaped bytes, and runs long enough to
// push a key past its bounds onto its hashes.
var fuzzAtoms = []string{
	"a", "b", "_", "\x00", "*", "|", "/", "=", "~", "!", "?", "#", "%", "{", "}",
	"%7C", "%00", "a_b", "a\x00b", "", strings.Repeat("x", 40), strings.Repeat("|", 30),
}

type fuzzBytes []byte

func (b *fuzzBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

// str reads up to three atoms.
func (b *fuzzBytes) str() string {
	var s strings.Builder
	for range b.next() % 4 {
		s.WriteString(fuzzAtoms[int(b.next())%len(fuzzAtoms)])
	}
	return s.String()
}

// refNode is an entry of the reference tree.
type refNode struct {
	key, value string
	share      bool
	rpu        uint32 // 0: no rate_limit (every limit here is at least 1)
	name       string
	children   []*refNode
}

// refTree reads a tree of at most maxNodes entries, at most 3 deep, from b.
// An entry whose key and value repeat a sibling's (as ParseConfig compares
// them, key "_" value) is left out, as is a share_threshold without '*'.
func refTree(b *fuzzBytes, depth int, count *int) []*refNode {
	const maxNodes = 24
	var out []*refNode
	seen := map[string]bool{}
	for n := b.next() % 5; n > 0 && *count < maxNodes; n-- {
		flags := b.next()
		nd := &refNode{key: b.str(), value: b.str()}
		if nd.key == "" {
			nd.key = "k"
		}
		composite := nd.key
		if nd.value != "" {
			composite += "_" + nd.value
		}
		if seen[composite] {
			continue
		}
		seen[composite] = true
		*count++
		nd.share = flags&2 != 0 && strings.Contains(nd.value, "*")
		if flags&1 != 0 || depth == 3 {
			nd.rpu = uint32(*count)
			nd.name = fmt.Sprintf("n%d", *count)
		}
		if depth < 3 && flags&4 != 0 {
			nd.children = refTree(b, depth+1, count)
		}
		out = append(out, nd)
	}
	return out
}

// yamlQuote writes s as a YAML double-quoted scalar, every byte but a
// letter or digit escaped (the atoms are ASCII).
func yamlQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// writeYAML writes the descriptors of nodes at the given indent; rpuBase
// is added to each limit's requests_per_unit, so that the two domains'
// entries have different overrides.
func writeYAML(b *strings.Builder, nodes []*refNode, indent string, rpuBase uint32) {
	for _, n := range nodes {
		fmt.Fprintf(b, "%s- key: %s\n", indent, yamlQuote(n.key))
		if n.value != "" {
			fmt.Fprintf(b, "%s  value: %s\n", indent, yamlQuote(n.value))
		}
		if n.share {
			fmt.Fprintf(b, "%s  share_threshold: true\n", indent)
		}
		if n.rpu != 0 {
			fmt.Fprintf(b, "%s  rate_limit: {unit: minute, requests_per_unit: %d, name: %s}\n", indent, n.rpu+rpuBase, n.name)
		}
		if len(n.children) > 0 {
			fmt.Fprintf(b, "%s  descriptors:\n", indent)
			writeYAML(b, n.children, indent+"    ", rpuBase)
		}
	}
}

// globMatch reports whether v matches pattern p, in which each '*'
// matches any run of bytes: the textbook dynamic programme.
func globMatch(p, v string) bool {
	// m[j]: p[:i] matches v[:j]
	m := make([]bool, len(v)+1)
	m[0] = true
	for i := 0; i < len(p); i++ {
		if p[i] == '*' {
			for j := 1; j <= len(v); j++ {
				m[j] = m[j] || m[j-1]
			}
			continue
		}
		for j := len(v); j >= 1; j-- {
			m[j] = m[j-1] && v[j-1] == p[i]
		}
		m[0] = false
	}
	return m[len(v)]
}

// refMatch is the package doc's matching rule, read literally: level by
// level, the entry with the same key and value, else the first wildcard
// entry of the key whose pattern matches the value, else the entry of the
// key with no value. It returns the entry the last descriptor entry
// reaches, if limited, and the request's values at the variable entries
// (no value, or a wildcard without share_threshold) on its path.
func refMatch(nodes []*refNode, entries [][2]string) (*refNode, []string) {
	var vals []string
	for i, e := range entries {
		var next *refNode
		for _, n := range nodes {
			if n.key == e[0] && n.value != "" && n.value == e[1] {
				next = n
				break
			}
		}
		for _, n := range nodes {
			if next == nil && n.key == e[0] && strings.Contains(n.value, "*") && globMatch(n.value, e[1]) {
				next = n
			}
		}
		for _, n := range nodes {
			if next == nil && n.key == e[0] && n.value == "" {
				next = n
			}
		}
		if next == nil {
			return nil, nil
		}
		if next.value == "" || strings.Contains(next.value, "*") && !next.share {
			vals = append(vals, e[1])
		}
		if i == len(entries)-1 {
			if next.rpu == 0 {
				return nil, nil
			}
			return next, vals
		}
		nodes = next.children
	}
	return nil, nil
}

// refKeys collects every key and value of the tree, for descriptors that
// mostly name real entries.
func refKeys(nodes []*refNode, keys, values *[]string) {
	for _, n := range nodes {
		*keys = append(*keys, n.key)
		*values = append(*values, n.value)
		refKeys(n.children, keys, values)
	}
}

// recorder is an admitter that admits everything and records the keys it
// is asked about.
type recorder struct {
	p    policy.Policy
	keys []string
}

func (r *recorder) Allow(_ context.Context, key string, _ int64) (engine.Decision, error) {
	r.keys = append(r.keys, key)
	return engine.Decision{Allowed: true}, nil
}

func (r *recorder) AllowBatch(_ context.Context, reqs []engine.Request, out []engine.Result) error {
	for i, q := range reqs {
		r.keys = append(r.keys, q.Key)
		out[i] = engine.Result{Decision: engine.Decision{Allowed: true}}
	}
	return nil
}

func (r *recorder) AllowAll(_ context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	for _, q := range reqs {
		r.keys = append(r.keys, q.Key)
	}
	return engine.Decision{Allowed: true}, 0, nil
}

func (r *recorder) Peek(_ context.Context, key string) (engine.Decision, error) {
	r.keys = append(r.keys, key)
	return engine.Decision{Allowed: true}, nil
}

func (r *recorder) Charge(context.Context, string, int64) (engine.Decision, error) {
	return engine.Decision{}, errors.New("not used")
}

func (r *recorder) Refund(context.Context, string, int64) (engine.Decision, error) {
	return engine.Decision{}, errors.New("not used")
}
func (r *recorder) EvictFull(context.Context) (int, error) { return 0, nil }
func (r *recorder) ReplacePolicy(context.Context, policy.Policy, int64) error {
	return errors.New("not used")
}
func (r *recorder) Policy() policy.Policy { return r.p }
func (r *recorder) Close() error          { return nil }

func fuzzDescriptorKeys(t *testing.T, domainBytes, treeBytes, descBytes []byte) {
	tb := fuzzBytes(treeBytes)
	count := 0
	tree := refTree(&tb, 1, &count)

	// Two domains: the fuzzer's bytes, as atoms, and that with an "x"
	// after it.
	db := fuzzBytes(domainBytes)
	var domain strings.Builder
	for len(db) > 0 {
		domain.WriteString(fuzzAtoms[int(db.next())%len(fuzzAtoms)])
	}
	domains := [2]string{domain.String(), domain.String() + "x"}
	if domains[0] == "" {
		domains[0] = "d"
	}
	var cfgs []*envoyrls.Config
	for i, d := range domains {
		var y strings.Builder
		fmt.Fprintf(&y, "domain: %s\ndescriptors:\n", yamlQuote(d))
		writeYAML(&y, tree, "  ", uint32(1000*i))
		c, err := envoyrls.ParseConfig([]byte(y.String()))
		if err != nil {
			t.Fatalf("ParseConfig refused a valid configuration: %v\n%s", err, y.String())
		}
		if c.Domain() != d {
			t.Fatalf("Domain() = %q, want %q", c.Domain(), d)
		}
		cfgs = append(cfgs, c)
	}
	p, err := envoyrls.Policy(1, cfgs...)
	if err != nil {
		t.Fatalf("Policy: %v", err)
	}
	rec := &recorder{p: p}
	srv, err := envoyrls.NewServer(rec, cfgs...)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}

	var keys, values []string
	refKeys(tree, &keys, &values)
	pick := func(b *fuzzBytes, from []string) string {
		c := b.next()
		if c&0x80 == 0 && len(from) > 0 {
			return from[int(c)%len(from)]
		}
		return b.str()
	}

	type owner struct {
		domain int
		node   *refNode
		vals   string
	}
	owners := map[string]owner{}
	keyOf := map[owner]string{}
	bb := fuzzBytes(descBytes)
	for range 16 {
		if len(bb) == 0 {
			break
		}
		di := int(bb.next() & 1)
		var entries [][2]string
		desc := &rlv3.RateLimitDescriptor{}
		for range 1 + bb.next()%4 {
			e := [2]string{pick(&bb, keys), pick(&bb, values)}
			entries = append(entries, e)
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
		}
		want, vals := refMatch(tree, entries)
		rec.keys = rec.keys[:0]
		resp, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: domains[di], Descriptors: []*rlv3.RateLimitDescriptor{desc}})
		if err != nil {
			t.Fatalf("ShouldRateLimit(%q, %q): %v", domains[di], entries, err)
		}
		got := resp.GetStatuses()[0].GetCurrentLimit()
		if want == nil {
			if got != nil || len(rec.keys) != 0 {
				t.Fatalf("%q in domain %q matches no limited entry, but the server reports %v with keys %q", entries, domains[di], got, rec.keys)
			}
			continue
		}
		if got.GetName() != want.name {
			t.Fatalf("%q in domain %q: limit %q, want %q (entry %q=%q)", entries, domains[di], got.GetName(), want.name, want.key, want.value)
		}
		if len(rec.keys) != 1 {
			t.Fatalf("%q: the admitter was asked about %q, want one key", entries, rec.keys)
		}
		key := rec.keys[0]
		if len(key) > envoyrls.MaxKeyBytes {
			t.Fatalf("%q: key of %d bytes, above MaxKeyBytes: %q", entries, len(key), key)
		}
		if o, ok := p.Overrides.Lookup(key); !ok || o.Capacity != int64(want.rpu)+int64(1000*di) {
			t.Fatalf("%q: key %q resolves to %+v (found %v), want capacity %d", entries, key, o, ok, int64(want.rpu)+int64(1000*di))
		}
		// The values, length-prefixed: a list no separator can fake.
		var lp strings.Builder
		for _, v := range vals {
			fmt.Fprintf(&lp, "%d:%s", len(v), v)
		}
		me := owner{di, want, lp.String()}
		if prev, ok := owners[key]; ok && prev != me {
			t.Fatalf("key %q is both entry %q=%q of domain %q with values %q and entry %q=%q of domain %q with values %q",
				key, prev.node.key, prev.node.value, domains[prev.domain], prev.vals, want.key, want.value, domains[di], me.vals)
		}
		if k, ok := keyOf[me]; ok && k != key {
			t.Fatalf("entry %q=%q of domain %q with values %q has two keys, %q and %q", want.key, want.value, domains[di], me.vals, k, key)
		}
		owners[key], keyOf[me] = me, key
	}
}

// FuzzParseConfig: ParseConfig never panics; what it refuses wraps
// ErrInvalidConfig; what it accepts has a domain, gives a Policy (or
// ErrTooManyWildcardRules, or a policy the override set refuses) that a
// Server takes, and parses again to the same Policy; and a Server on it
// answers a descriptor made of the configuration's first keys.
func FuzzParseConfig(f *testing.F) {
	for _, y := range []string{
		"domain: d\ndescriptors:\n  - key: a\n    rate_limit: &l {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: *l\n",
		"domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [1, {b: c}]}\n    detailed_metric: true\n    value_to_metric: false\n    quota_mode: false\n",
		"domain: d\ndescriptors:\n  - {key: a, value: \"x*y\", share_threshold: true, rate_limit: {unit: Minute, requests_per_unit: 1}}\n  - {key: h, rate_limit: {unlimited: true}}\n",
		"domain: billing\ndescriptors:\n  - key: seat\n    rate_limit:\n      name: seats\n      unit: hour\n      requests_per_unit: 9\n      replaces: [{name: other}]\n    descriptors:\n      - {key: user, shadow_mode: true, rate_limit: {unit: day, requests_per_unit: 4294967295}}\n",
		"domain: a\n---\ndomain: b\n", "---\ndomain: d\n...\n", "domain: \"\\0\"\ndescriptors:\n  - {key: \"\\0\", value: \"\\0\"}\n",
		"domain: d\ndescriptors: &a\n  - {key: k, descriptors: *a}\n", "[", "domain: {a: b}\n",
	} {
		f.Add([]byte(y))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := envoyrls.ParseConfig(data)
		if err != nil {
			if c != nil || !errors.Is(err, envoyrls.ErrInvalidConfig) {
				t.Fatalf("ParseConfig: %v, %v: an error comes alone and wraps ErrInvalidConfig", c, err)
			}
			return
		}
		if c.Domain() == "" {
			t.Fatal("accepted without a domain")
		}
		p, err := envoyrls.Policy(1, c)
		if err != nil {
			if !errors.Is(err, envoyrls.ErrTooManyWildcardRules) && !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("Policy: %v", err)
			}
			return
		}
		again, err := envoyrls.ParseConfig(data)
		if err != nil {
			t.Fatalf("parses once, not twice: %v", err)
		}
		p2, err := envoyrls.Policy(1, again)
		if err != nil || !policiesEqual(p, p2) {
			t.Fatalf("parsed twice, two policies: %v", err)
		}
		rec := &recorder{p: p}
		srv, err := envoyrls.NewServer(rec, c)
		if err != nil {
			t.Fatalf("NewServer: %v", err)
		}
		if _, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: c.Domain(),
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k"}, {Key: "a", Value: "x"}}}}}); err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
	})
}

func policiesEqual(a, b policy.Policy) bool {
	x, y := a.Overrides.Overrides(), b.Overrides.Overrides()
	if len(x) != len(y) || a.Capacity != b.Capacity || a.TokensPerSecond != b.TokensPerSecond {
		return false
	}
	for i := range x {
		if x[i].Match != y[i].Match || x[i].Capacity != y[i].Capacity || x[i].TokensPerSecond != y[i].TokensPerSecond || x[i].Refill != y[i].Refill {
			return false
		}
	}
	return true
}
