package envoyrls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
)

// Configuration errors. ParseConfig wraps one of them with the line and the
// field at fault; test with errors.Is. Every one of them is also
// ErrInvalidConfig.
var (
	// ErrInvalidConfig is what every configuration error wraps.
	ErrInvalidConfig = errors.New("envoyrls: invalid configuration")
	// ErrSyntax: the input is not YAML.
	ErrSyntax = fmt.Errorf("%w: YAML does not parse", ErrInvalidConfig)
	// ErrUnknownField: a mapping key that the format does not have (a
	// misspelling such as "rate-limit" or "request_per_unit").
	ErrUnknownField = fmt.Errorf("%w: unknown field", ErrInvalidConfig)
	// ErrNonStringKey: a mapping key that is not a string (2.5: x).
	ErrNonStringKey = fmt.Errorf("%w: key is not a string", ErrInvalidConfig)
	// ErrFieldType: a field of the wrong kind (a list where a mapping
	// belongs, a word where a number does, a list of non-mappings).
	ErrFieldType = fmt.Errorf("%w: wrong type", ErrInvalidConfig)
	// ErrEmptyDomain: no domain, or an empty one.
	ErrEmptyDomain = fmt.Errorf("%w: empty domain", ErrInvalidConfig)
	// ErrDuplicateDomain: Policy or a Server was given two configurations
	// of one domain.
	ErrDuplicateDomain = fmt.Errorf("%w: duplicate domain", ErrInvalidConfig)
	// ErrEmptyKey: a descriptor without a key.
	ErrEmptyKey = fmt.Errorf("%w: descriptor has empty key", ErrInvalidConfig)
	// ErrDuplicateKey: two descriptors of one level with the same key and
	// value (compared as envoyproxy/ratelimit compares them: key, "_", value).
	ErrDuplicateKey = fmt.Errorf("%w: duplicate descriptor composite key", ErrInvalidConfig)
	// ErrUnknownUnit: a rate_limit unit other than second, minute, hour,
	// day, week, month or year (in any case), or none for a limited entry.
	ErrUnknownUnit = fmt.Errorf("%w: invalid rate limit unit", ErrInvalidConfig)
	// ErrUnlimitedWithUnit: unlimited: true with a valid unit.
	ErrUnlimitedWithUnit = fmt.Errorf("%w: should not specify rate limit unit when unlimited", ErrInvalidConfig)
	// ErrReplaces: a replaces entry with an empty name or the limit's own.
	ErrReplaces = fmt.Errorf("%w: invalid replaces entry", ErrInvalidConfig)
	// ErrShareThreshold: share_threshold on a value without '*'.
	ErrShareThreshold = fmt.Errorf("%w: share_threshold can only be used with wildcard values", ErrInvalidConfig)
	// ErrMissingRequests: a rate_limit that is not unlimited and has no
	// requests_per_unit. envoyproxy/ratelimit reads it as 0, a limit that
	// refuses every request; here 0 must be written.
	ErrMissingRequests = fmt.Errorf("%w: rate_limit without requests_per_unit", ErrInvalidConfig)
	// ErrTooLarge: more descriptors than one configuration may have
	// (100,000, aliases expanded), more replaces entries (100,000 in all),
	// or paths that add up to more than 64 MiB (a descriptor's path being
	// its own and its ancestors' keys and values, escaped; aliases
	// expanded).
	ErrTooLarge = fmt.Errorf("%w: too many descriptors", ErrInvalidConfig)
	// ErrUnsupported: a setting this server does not implement
	// (quota_mode: true, a YAML merge key, a second YAML document).
	ErrUnsupported = fmt.Errorf("%w: unsupported setting", ErrInvalidConfig)
)

// Unit is a rate limit unit of the configuration format, as the RLS v3 API
// names it.
type Unit = rlsv3.RateLimitResponse_RateLimit_Unit

const unitSecond = rlsv3.RateLimitResponse_RateLimit_SECOND

// unitName is u in lower case: "minute".
func unitName(u Unit) string { return strings.ToLower(u.String()) }

// unitDuration is the length of each unit: a month is 30 days and a year
// 365, as in envoyproxy/ratelimit.
var unitDuration = map[Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// Config is one domain's configuration, as ParseConfig read it. It is
// immutable and safe to share.
type Config struct {
	domain string
	tag    string // the key prefix of the domain's buckets
	root   *node
	rules  []*node // every node with a rate_limit, in document order
	count  int     // descriptors read so far
	nrepl  int     // replaces entries read so far
	nbytes int     // bytes of the paths built so far
}

// maxDescriptors bounds the descriptors of one configuration, aliases
// expanded, so that a file of nested aliases cannot take the process's
// memory.
const maxDescriptors = 100_000

// maxReplaces bounds the replaces entries of one configuration, aliases
// expanded: one rate_limit with a long replaces list, named by an alias from
// every descriptor, would otherwise be read and held once per descriptor.
const maxReplaces = 100_000

// maxPathBytes bounds the bytes of all descriptors' paths together, aliases
// expanded: each descriptor holds its path, which repeats its ancestors', so
// an alias nesting a list in itself, 50 bytes of YAML, would otherwise build
// 100,000 levels and 15 GB of paths before the descriptor bound stops it.
const maxPathBytes = 64 << 20

// Domain returns the configuration's domain ("" for a nil *Config).
func (c *Config) Domain() string {
	if c == nil {
		return ""
	}
	return c.domain
}

// limit is a node's rate_limit.
type limit struct {
	requestsPerUnit uint32
	unit            Unit
	unlimited       bool
	name            string
	replaces        []string

	sfName, policyField string // see headerFields
}

// node is one descriptor entry of the tree.
type node struct {
	key, value string
	wildcard   []string // value split on '*' when it has one
	share      bool     // share_threshold
	shadow     bool
	line       int
	limit      *limit // nil: no rate_limit here

	exact     map[entryKey]*node // children by key and value (value non-empty)
	wildcards []*node            // children whose value has '*', in order
	defaults  map[string]*node   // children with no value, by key

	// For a node with a limit: its bucket key's fixed part, and whether
	// the key also carries request values (a default entry, or a wildcard
	// without share_threshold, on its path).
	path     string // the escaped entries from the root: "/k=v/k2~"
	rule     string
	variable bool
	depth    int
}

// entryKey is an entry's key and value, as a map key: two strings, not one
// joined by a separator, since keys and values may hold any byte (a
// separator in one would let a descriptor reach another entry).
type entryKey struct{ key, value string }

// ParseConfig reads one domain's configuration in envoyproxy/ratelimit's YAML
// format (the package doc lists the fields). It refuses what that server
// refuses, and a little more: every field it does not know, anywhere. The
// error wraps one of the Err values above (and so ErrInvalidConfig) and names
// the line and the field.
func ParseConfig(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	// One domain a file: a document after the first is refused, not
	// dropped unread (an empty one, a trailing "---", is nothing).
	for {
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
		}
		if len(more.Content) > 0 && !isNull(more.Content[0]) {
			return nil, fieldErr(ErrUnsupported, more.Content[0], "---", "a second YAML document: one domain a file")
		}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, fmt.Errorf("%w: line 1: field \"domain\": the document is empty", ErrEmptyDomain)
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fieldErr(ErrFieldType, root, "", "the document is not a mapping")
	}
	c := &Config{root: &node{}}
	var descs *yaml.Node
	domainAt := root // the line an empty domain is reported at: its own if given
	err := eachField(root, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "domain":
			domainAt = kn
			s, err := str(k, v)
			c.domain = s
			return err
		case "descriptors":
			descs = v
			return nil
		}
		return fieldErr(ErrUnknownField, kn, k, "not a field of the document")
	})
	if err != nil {
		return nil, err
	}
	if c.domain == "" {
		return nil, fieldErr(ErrEmptyDomain, domainAt, "domain", "config file cannot have empty domain")
	}
	c.tag = domainTag(c.domain)
	if err := c.loadLevel(c.root, descs); err != nil {
		return nil, err
	}
	return c, nil
}

// loadLevel reads the descriptors below parent.
func (c *Config) loadLevel(parent *node, seq *yaml.Node) error {
	if seq == nil || isNull(seq) {
		return nil
	}
	if seq.Kind != yaml.SequenceNode {
		return fieldErr(ErrFieldType, seq, "descriptors", "not a list")
	}
	seen := map[string]bool{}
	for _, item := range seq.Content {
		item = deref(item)
		if item.Kind != yaml.MappingNode {
			return fieldErr(ErrFieldType, item, "descriptors", "yaml file contains list of type other than map")
		}
		if c.count++; c.count > maxDescriptors {
			return fieldErr(ErrTooLarge, item, "descriptors", fmt.Sprintf("more than %d descriptors, aliases expanded", maxDescriptors))
		}
		n, children, err := c.loadDescriptor(item)
		if err != nil {
			return err
		}
		composite := n.key
		if n.value != "" {
			composite += "_" + n.value
		}
		if seen[composite] {
			return fieldErr(ErrDuplicateKey, item, "key", fmt.Sprintf("'%s'", composite))
		}
		seen[composite] = true
		if n.share && n.wildcard == nil {
			return fieldErr(ErrShareThreshold, item, "share_threshold", fmt.Sprintf("but found key '%s'", composite))
		}

		n.depth = parent.depth + 1
		seg := "/" + escape(n.key)
		switch {
		case n.value == "":
			seg += "~"
			n.variable = true
		case n.wildcard != nil && n.share:
			seg += "!" + escape(n.value)
		case n.wildcard != nil:
			seg += "?" + escape(n.value)
			n.variable = true
		default:
			seg += "=" + escape(n.value)
		}
		n.variable = n.variable || parent.variable
		if c.nbytes += len(parent.path) + len(seg); c.nbytes > maxPathBytes {
			return fieldErr(ErrTooLarge, item, "descriptors", fmt.Sprintf("paths of more than %d bytes, aliases expanded", maxPathBytes))
		}
		n.path = parent.path + seg
		if n.limit != nil {
			n.rule = ruleKey(c.tag, n.path)
		}

		switch {
		case n.value == "":
			if parent.defaults == nil {
				parent.defaults = map[string]*node{}
			}
			parent.defaults[n.key] = n
		default:
			if parent.exact == nil {
				parent.exact = map[entryKey]*node{}
			}
			parent.exact[entryKey{n.key, n.value}] = n
			if n.wildcard != nil {
				parent.wildcards = append(parent.wildcards, n)
			}
		}
		if n.limit != nil {
			c.rules = append(c.rules, n)
		}
		if err := c.loadLevel(n, children); err != nil {
			return err
		}
	}
	return nil
}

// loadDescriptor reads one descriptor's own fields; its children are
// returned for loadLevel.
func (c *Config) loadDescriptor(m *yaml.Node) (*node, *yaml.Node, error) {
	n := &node{line: m.Line}
	var children *yaml.Node
	err := eachField(m, func(k string, kn, v *yaml.Node) error {
		var err error
		switch k {
		case "key":
			n.key, err = str(k, v)
		case "value":
			n.value, err = str(k, v)
		case "descriptors":
			children = v
		case "rate_limit":
			n.limit, err = c.loadLimit(v)
		case "shadow_mode":
			n.shadow, err = boolean(k, v)
		case "share_threshold":
			n.share, err = boolean(k, v)
		case "detailed_metric", "value_to_metric":
			// Metric naming only: they change no decision.
			_, err = boolean(k, v)
		case "quota_mode":
			var q bool
			q, err = boolean(k, v)
			if err == nil && q {
				err = fieldErr(ErrUnsupported, kn, k, "quota mode is not implemented")
			}
		case "metadata":
			// Dynamic metadata for the response, which this server does not
			// send; any mapping is accepted, as envoyproxy/ratelimit accepts it.
			if !isNull(v) && v.Kind != yaml.MappingNode {
				err = fieldErr(ErrFieldType, v, k, "not a mapping")
			}
		default:
			err = fieldErr(ErrUnknownField, kn, k, "not a field of a descriptor")
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if n.key == "" {
		return nil, nil, fieldErr(ErrEmptyKey, m, "key", "descriptor has empty key")
	}
	if strings.Contains(n.value, "*") {
		n.wildcard = strings.Split(n.value, "*")
	}
	return n, children, nil
}

// loadLimit reads a rate_limit mapping.
func (c *Config) loadLimit(m *yaml.Node) (*limit, error) {
	if m.Kind != yaml.MappingNode {
		// Null too: envoyproxy/ratelimit reads "rate_limit:" with no value
		// as no limit, which would leave the entry unlimited unseen.
		return nil, fieldErr(ErrFieldType, m, "rate_limit", "not a mapping")
	}
	l := &limit{}
	var unit string
	var unitNode *yaml.Node
	var replNodes []*yaml.Node // each replaces entry, for its line
	hasRequests := false
	err := eachField(m, func(k string, kn, v *yaml.Node) error {
		var err error
		switch k {
		case "unit":
			unit, err = str(k, v)
			unitNode = v
		case "requests_per_unit":
			if isNull(v) {
				return nil // as if not given: refused below, where a 0 must be written
			}
			var n uint32
			// yaml.v3 decodes 1.5 or 5.0 into a uint32; envoyproxy/ratelimit
			// refuses any float
			if err := v.Decode(&n); err != nil || v.Kind != yaml.ScalarNode || v.ShortTag() == "!!float" {
				return fieldErr(ErrFieldType, v, k, fmt.Sprintf("not a whole number from 0 to %d", uint32(math.MaxUint32)))
			}
			l.requestsPerUnit, hasRequests = n, true
		case "unlimited":
			l.unlimited, err = boolean(k, v)
		case "name":
			l.name, err = str(k, v)
		case "replaces":
			if isNull(v) {
				return nil
			}
			if v.Kind != yaml.SequenceNode {
				return fieldErr(ErrFieldType, v, k, "not a list")
			}
			for _, e := range v.Content {
				e = deref(e)
				if e.Kind != yaml.MappingNode {
					return fieldErr(ErrFieldType, e, k, "yaml file contains list of type other than map")
				}
				if c.nrepl++; c.nrepl > maxReplaces {
					return fieldErr(ErrTooLarge, e, k, fmt.Sprintf("more than %d replaces entries, aliases expanded", maxReplaces))
				}
				name := ""
				if err := eachField(e, func(k string, kn, v *yaml.Node) error {
					if k != "name" {
						return fieldErr(ErrUnknownField, kn, k, "not a field of a replaces entry")
					}
					var err error
					name, err = str("replaces.name", v)
					return err
				}); err != nil {
					return err
				}
				if name == "" {
					return fieldErr(ErrReplaces, e, "replaces", "should not have an empty replaces entry")
				}
				l.replaces = append(l.replaces, name)
				replNodes = append(replNodes, e)
			}
		default:
			err = fieldErr(ErrUnknownField, kn, k, "not a field of rate_limit")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, r := range l.replaces {
		if r == l.name {
			return nil, fieldErr(ErrReplaces, replNodes[i], "replaces", "replaces should not contain name of same descriptor")
		}
	}
	u, ok := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)]
	valid := ok && Unit(u) != rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	switch {
	case l.unlimited && valid:
		return nil, fieldErr(ErrUnlimitedWithUnit, unitNode, "unit", "should not specify rate limit unit when unlimited")
	case !l.unlimited && !valid:
		at := unitNode
		if at == nil {
			at = m
		}
		return nil, fieldErr(ErrUnknownUnit, at, "unit", fmt.Sprintf("invalid rate limit unit '%s'", unit))
	}
	if !l.unlimited && !hasRequests {
		return nil, fieldErr(ErrMissingRequests, m, "requests_per_unit", "a limit needs requests_per_unit (0 refuses every request)")
	}
	if valid {
		l.unit = Unit(u)
		l.headerFields()
	}
	return l, nil
}

// eachField calls f for each key of mapping m, in order, after checking
// that the key is a string and appears once.
func eachField(m *yaml.Node, f func(k string, kn, v *yaml.Node) error) error {
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := m.Content[i], deref(m.Content[i+1])
		if kn.Kind == yaml.ScalarNode && kn.ShortTag() == "!!merge" {
			return fieldErr(ErrUnsupported, kn, kn.Value, "merge keys are not supported: write the fields out")
		}
		if kn.Kind != yaml.ScalarNode || kn.ShortTag() != "!!str" {
			return fieldErr(ErrNonStringKey, kn, kn.Value, "config error, key is not of type string")
		}
		if seen[kn.Value] {
			return fieldErr(ErrFieldType, kn, kn.Value, "given twice")
		}
		seen[kn.Value] = true
		if err := f(kn.Value, kn, v); err != nil {
			return err
		}
	}
	return nil
}

// deref follows an alias (*name) to the node it names.
func deref(v *yaml.Node) *yaml.Node {
	for v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	return v
}

func isNull(v *yaml.Node) bool { return v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" }

// str reads a scalar as a string: an integer or a word is its text, as
// envoyproxy/ratelimit reads it; null is ""; a float is refused, as there;
// a !!binary scalar is the bytes its base64 spells, as there (its text
// would be another string, which no request of those bytes matches).
func str(field string, v *yaml.Node) (string, error) {
	if isNull(v) {
		return "", nil
	}
	if v.Kind != yaml.ScalarNode || v.ShortTag() == "!!float" {
		return "", fieldErr(ErrFieldType, v, field, "not a string")
	}
	if v.ShortTag() == "!!binary" {
		var s string
		if err := v.Decode(&s); err != nil {
			return "", fieldErr(ErrFieldType, v, field, "!!binary that is not base64")
		}
		return s, nil
	}
	return v.Value, nil
}

// yaml11Bools are the plain scalars that envoyproxy/ratelimit's YAML library
// (yaml.v2, YAML 1.1) reads as booleans and this one (YAML 1.2) as strings.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// boolean reads a true or false: a YAML 1.1 word too, as envoyproxy/ratelimit
// reads it; null (a field written with no value) is false, as there.
func boolean(field string, v *yaml.Node) (bool, error) {
	if isNull(v) {
		return false, nil
	}
	if v.Kind == yaml.ScalarNode && v.Style == 0 && v.Tag == "!!str" {
		if b, ok := yaml11Bools[v.Value]; ok {
			return b, nil // plain, as envoyproxy/ratelimit reads it; a quoted "yes" is a string there too
		}
	}
	var b bool
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" || v.Decode(&b) != nil {
		return false, fieldErr(ErrFieldType, v, field, "not true or false")
	}
	return b, nil
}

// fieldErr wraps kind with the line of at and the field's name.
func fieldErr(kind error, at *yaml.Node, field, what string) error {
	line := 0
	if at != nil {
		line = at.Line
	}
	return fmt.Errorf("%w: line %d: field %q: %s", kind, line, field, what)
}
