package policy

import (
	"fmt"
	"math"
	"strings"
)

// Override gives the keys that Match selects their own limit. Match is an
// exact key or, if it contains '*', a pattern in which each '*' matches any
// run of bytes, the empty run and '/' included ("tenant:acme:*", "*:login").
// There is no escape: a key that contains '*' cannot have an exact override,
// though patterns may match it.
//
// The limit is Capacity refilled at TokensPerSecond, or at Refill when
// TokensPerSecond is 0 (exactly one of the two is set, as in Policy), plus
// the bands of Bands if set. An override's limit is its own: the policy's
// Bands do not apply to it (give it the same BandSet to keep them).
//
// Name, optional, names the override's quota to clients (the HTTP
// middleware sends it in RateLimit-Policy) and is the name of its primary
// band (Decision.Band). It is printable ASCII (0x20 to 0x7E), at most
// MaxNameBytes long, no band of Bands may have it, and overrides with
// different limits may not share one; overrides with the same limit may
// ("gold" for every tenant on one plan), TokensPerSecond n and Refill
// PerSecond(n) being one rate.
type Override struct {
	Match           string
	Capacity        int64
	TokensPerSecond int64
	Refill          Rate     `json:",omitzero"`  // omitted from JSON when not set
	Bands           *BandSet `json:"-"`          // not in JSON: a BandSet is built by NewBands
	Name            string   `json:",omitempty"` // omitted from JSON when empty
}

// limit returns o's primary band.
func (o Override) limit() Limit {
	return Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill}
}

// shape returns o's whole limit.
func (o Override) shape() Shape { return Shape{Name: o.Name, Primary: o.limit(), Bands: o.Bands} }

// Bounds on an OverrideSet.
const (
	// MaxPatterns is the most pattern overrides one set may hold: each new
	// key is tried against them in order.
	MaxPatterns = 128
	// MaxLimits is the most distinct limits (a Name with its Capacity,
	// rate and Bands) one set may hold, the default not counted: a bucket
	// records its limit as a 16-bit index. Any number of overrides may
	// share a limit.
	MaxLimits = 1<<16 - 2
	// MaxNameBytes is the longest Name an override may have.
	MaxNameBytes = 64
)

// OverrideSet is an immutable set of overrides, built once by NewOverrideSet
// and shared by reference, so a Policy that carries one stays comparable
// with ==. It is safe for concurrent use.
//
// A key resolves to the override whose Match equals it; failing that, to
// the first pattern, in declaration order, that matches it; failing that,
// to the policy's default limit. Exact overrides are one map lookup;
// patterns are compiled when the set is built. Resolve gives the limit a
// key resolves to, Lookup the override itself.
type OverrideSet struct {
	overrides []Override
	limitOf   []LimitIndex     // limitOf[i] is the index of overrides[i]'s limit
	exact     map[string]int32 // an exact Match's position in overrides
	patterns  []pattern
	limits    []Shape // limits[i-1] is LimitIndex i; 0 is the policy's default
}

// LimitIndex names a limit of a Policy: 0 is its default, and 1 and up are
// the distinct limits of its OverrideSet. A bucket keeps the index of its
// key's limit, so the key is resolved once, not on every request.
type LimitIndex uint16

type pattern struct {
	parts []string // the literal runs between stars; len >= 2
	at    int32    // the override's position in overrides
}

// NewOverrideSet validates overrides and builds their set. It returns nil
// for no overrides, and an error wrapping ErrInvalid that names the first
// bad entry for an invalid limit (as Policy.Validate judges one), a blank
// Match, a Match given twice, a Name that is not printable ASCII or is
// longer than MaxNameBytes, a Name given to two different limits or to one
// of the override's own bands, more than MaxPatterns patterns or more than
// MaxLimits distinct limits.
func NewOverrideSet(overrides ...Override) (*OverrideSet, error) {
	if len(overrides) == 0 {
		return nil, nil
	}
	if len(overrides) > math.MaxInt32 { // positions are kept as int32
		return nil, fmt.Errorf("%w: %d overrides, at most %d", ErrInvalid, len(overrides), math.MaxInt32)
	}
	s := &OverrideSet{
		overrides: append([]Override(nil), overrides...),
		limitOf:   make([]LimitIndex, len(overrides)),
		exact:     make(map[string]int32),
	}
	// Limits are told apart by what they are, bands by their contents: two
	// BandSets built alike are one limit, whichever the override holds.
	type limitKey struct {
		name    string
		primary Limit
		bands   string
	}
	index := map[limitKey]LimitIndex{}
	seen := map[string]bool{}
	named := map[string]int{} // a Name's first override
	for i, o := range s.overrides {
		if err := o.validate(); err != nil {
			return nil, fmt.Errorf("%w: override %d (%q): %s", ErrInvalid, i, o.Match, err)
		}
		if seen[o.Match] {
			return nil, fmt.Errorf("%w: override %d (%q): Match given twice", ErrInvalid, i, o.Match)
		}
		seen[o.Match] = true
		lim := o.shape()
		if o.Name != "" {
			if j, ok := named[o.Name]; !ok {
				named[o.Name] = i
			} else if f := s.overrides[j]; !sameLimit(f, o) {
				return nil, fmt.Errorf("%w: override %d (%q): Name %q is override %d's, whose limit differs", ErrInvalid, i, o.Match, o.Name, j)
			}
		}
		key := limitKey{o.Name, lim.Primary, o.Bands.id()}
		idx, ok := index[key]
		if !ok {
			if len(s.limits) == MaxLimits {
				return nil, fmt.Errorf("%w: override %d (%q): more than %d distinct limits", ErrInvalid, i, o.Match, MaxLimits)
			}
			s.limits = append(s.limits, lim)
			idx = LimitIndex(len(s.limits))
			index[key] = idx
		}
		s.limitOf[i] = idx
		if !strings.Contains(o.Match, "*") {
			s.exact[o.Match] = int32(i)
			continue
		}
		if len(s.patterns) == MaxPatterns {
			return nil, fmt.Errorf("%w: override %d (%q): more than %d patterns", ErrInvalid, i, o.Match, MaxPatterns)
		}
		s.patterns = append(s.patterns, pattern{parts: strings.Split(o.Match, "*"), at: int32(i)})
	}
	return s, nil
}

// sameLimit reports whether a and b give a key the same limit, and so may
// share a Name: the same Capacity, Bands and rate, TokensPerSecond n being
// the same rate as Refill PerSecond(n).
func sameLimit(a, b Override) bool {
	return a.Capacity == b.Capacity && a.limit().Rate() == b.limit().Rate() && a.Bands.id() == b.Bands.id()
}

func (o Override) validate() error {
	if strings.TrimSpace(o.Match) == "" {
		return fmt.Errorf("blank Match")
	}
	if err := o.limit().validate(); err != nil {
		return err
	}
	if err := validateName(o.Name); err != nil {
		return err
	}
	if o.Bands.Index(o.Name) >= 0 {
		return fmt.Errorf("name %q is also one of its bands'", o.Name)
	}
	return nil
}

// Overrides returns a copy of the overrides, in declaration order.
func (s *OverrideSet) Overrides() []Override {
	if s == nil {
		return nil
	}
	return append([]Override(nil), s.overrides...)
}

// Len returns the number of overrides.
func (s *OverrideSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.overrides)
}

// Patterns returns the number of pattern overrides: the most a key is
// tried against when it is resolved.
func (s *OverrideSet) Patterns() int {
	if s == nil {
		return 0
	}
	return len(s.patterns)
}

// Resolve returns the index of key's limit: that of the override whose Match
// is key, else that of the first pattern that matches key, else 0 for the
// policy's default. A nil set resolves every key to 0.
func (s *OverrideSet) Resolve(key string) LimitIndex {
	if i := s.find(key); i >= 0 {
		return s.limitOf[i]
	}
	return 0
}

// Lookup returns the override key resolves to, by Resolve's rule, and true;
// or the zero Override and false when key gets the policy's default. Use it
// for what the limit alone does not say, such as the override's Match:
// overrides that share a limit, written alike, and a name share its
// LimitIndex. A nil set finds none.
func (s *OverrideSet) Lookup(key string) (Override, bool) {
	if i := s.find(key); i >= 0 {
		return s.overrides[i], true
	}
	return Override{}, false
}

// find is the one matching routine of Resolve and Lookup: the position in
// overrides of key's override, or -1 for none (and for a nil set).
func (s *OverrideSet) find(key string) int {
	if s == nil {
		return -1
	}
	if i, ok := s.exact[key]; ok {
		return int(i)
	}
	for i := range s.patterns {
		if s.patterns[i].match(key) {
			return int(s.patterns[i].at)
		}
	}
	return -1
}

// match reports whether key matches the pattern: its first run as a prefix,
// its last as a suffix, and the runs between in order, without overlap. With
// '*' the only wildcard, taking each middle run at its leftmost place is
// never worse than any other choice.
func (p *pattern) match(key string) bool {
	first, last := p.parts[0], p.parts[len(p.parts)-1]
	if len(key) < len(first)+len(last) || !strings.HasPrefix(key, first) || !strings.HasSuffix(key, last) {
		return false
	}
	rest := key[len(first) : len(key)-len(last)]
	for _, part := range p.parts[1 : len(p.parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// Resolve returns the limit p gives key and its index: the exact override
// for key, else the first matching pattern, else the default.
func (p Policy) Resolve(key string) (Limit, LimitIndex) {
	idx := p.Overrides.Resolve(key)
	return p.LimitAt(idx), idx
}

// LimitAt returns the primary band of the limit at idx, which must come
// from p's Resolve or Limits.
func (p Policy) LimitAt(idx LimitIndex) Limit { return p.ShapeAt(idx).Primary }

// ShapeAt returns the whole limit at idx, which must come from p's Resolve
// or Limits: at 0 the policy's own (named ""), else an override's.
func (p Policy) ShapeAt(idx LimitIndex) Shape {
	if idx == 0 {
		return p.Shape()
	}
	return p.Overrides.limits[idx-1]
}

// Shape returns the policy's own limit: its primary band, named "", and its
// Bands.
func (p Policy) Shape() Shape { return Shape{Primary: p.Limit(), Bands: p.Bands} }

// Limits returns the primary bands of p's limit table: the default at index
// 0, then the distinct limits of its overrides, so limits[idx] is
// LimitAt(idx).
func (p Policy) Limits() []Limit {
	out := []Limit{p.Limit()}
	for _, sh := range p.Shapes()[1:] {
		out = append(out, sh.Primary)
	}
	return out
}

// Shapes returns p's limit table, whole: shapes[idx] is ShapeAt(idx).
func (p Policy) Shapes() []Shape {
	out := []Shape{p.Shape()}
	if p.Overrides != nil {
		out = append(out, p.Overrides.limits...)
	}
	return out
}
