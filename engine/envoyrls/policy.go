package envoyrls

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// ErrTooManyWildcardRules: the configurations have more limited entries whose
// keys carry request values than an override set holds patterns
// (policy.MaxPatterns).
var ErrTooManyWildcardRules = errors.New("envoyrls: too many limited entries with per-value buckets")

// ErrNilConfig: a nil *Config was passed.
var ErrNilConfig = errors.New("envoyrls: nil configuration")

// DefaultCapacity is the capacity, and the tokens per second, of the limit
// Policy gives a key that matches no override: math.MaxInt64, so never a
// denial. The server only sends the keys of limited entries, each of which
// has an override, so the default only answers between the two steps of
// Server.Reload: a key of an entry the new configuration drops, which is then
// unlimited anyway.
const DefaultCapacity = math.MaxInt64

// zeroRefill is the refill of an entry whose requests_per_unit is 0: one
// token a year, the longest unit.
var zeroRefill = policy.Rate{Tokens: 1, Per: 365 * 24 * time.Hour}

// Policy returns the policy the admitter must run for configs: version,
// a default that never denies (DefaultCapacity) and one override per limited
// configuration entry, of capacity requests_per_unit refilled at
// requests_per_unit per unit (an entry whose requests_per_unit is 0 gets
// capacity 1 and one token a year: the server refuses its requests without
// its bucket, which only keeps a spent key spent across a reload to 0 and
// back). So a key that
// has not been used admits exactly requests_per_unit at once, what a fixed
// window admits at the start of a window, and after that no more than the
// rate: never twice the limit across a window's boundary. An entry whose
// key carries request values (an entry with no value, or a wildcard without
// share_threshold, on its path) is a pattern override; every other entry is
// an exact one. Keys are described on MaxKeyBytes. The order of configs
// does not matter: listed in any order, they give the same policy.
//
// Errors: ErrNilConfig, ErrDuplicateDomain for two configurations of one
// domain, ErrTooManyWildcardRules for more than policy.MaxPatterns pattern
// entries, and those of policy.NewOverrideSet.
func Policy(version int64, configs ...*Config) (policy.Policy, error) {
	var ovs []policy.Override
	patterns := 0
	seen := map[string]bool{}
	for i, c := range configs {
		if c == nil {
			return policy.Policy{}, fmt.Errorf("%w: configs[%d]", ErrNilConfig, i)
		}
		if seen[c.domain] {
			return policy.Policy{}, fmt.Errorf("%w: '%s' in configs[%d]", ErrDuplicateDomain, c.domain, i)
		}
		seen[c.domain] = true
	}
	// By domain, not in the order given: the same configurations give the
	// same policy however they are listed, so NewServer, Reload and another
	// replica's CheckPolicy find it equal to the admitter's.
	sorted := slices.SortedFunc(slices.Values(configs), func(a, b *Config) int { return strings.Compare(a.domain, b.domain) })
	for _, c := range sorted {
		for _, n := range c.rules {
			l := n.limit
			if l.unlimited {
				continue
			}
			o := policy.Override{Match: n.rule + "|", Capacity: int64(l.requestsPerUnit)}
			if n.variable {
				o.Match += "*"
				patterns++
			}
			switch {
			case l.requestsPerUnit == 0:
				// The server refuses the entry's requests without asking
				// its bucket, which only keeps a spent key spent: at the
				// default it would refill at once, and a reload back to a
				// real limit would hand every key a fresh burst; at one
				// token a unit, a spent key would be full, and dropped as
				// full buckets are, within a unit.
				o.Capacity, o.Refill = 1, zeroRefill
			case l.unit == unitSecond:
				o.TokensPerSecond = o.Capacity
			default:
				o.Refill = policy.Rate{Tokens: o.Capacity, Per: unitDuration[l.unit]}
			}
			ovs = append(ovs, o)
		}
	}
	if patterns > policy.MaxPatterns {
		return policy.Policy{}, fmt.Errorf("%w: %d, at most %d (policy.MaxPatterns)", ErrTooManyWildcardRules, patterns, policy.MaxPatterns)
	}
	set, err := policy.NewOverrideSet(ovs...)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("envoyrls: %w", err)
	}
	p := policy.Policy{Version: version, Capacity: DefaultCapacity, TokensPerSecond: DefaultCapacity, Overrides: set}
	if err := p.Validate(); err != nil {
		return policy.Policy{}, fmt.Errorf("envoyrls: %w", err)
	}
	return p, nil
}

// samePolicy reports whether a and b give every key the same limit, their
// versions aside.
func samePolicy(a, b policy.Policy) bool {
	if a.Capacity != b.Capacity || a.TokensPerSecond != b.TokensPerSecond || a.Refill != b.Refill ||
		!a.Bands.Equal(b.Bands) {
		return false
	}
	return slices.EqualFunc(a.Overrides.Overrides(), b.Overrides.Overrides(), sameOverride)
}

// sameOverride reports whether x and y are one entry with one limit.
func sameOverride(x, y policy.Override) bool {
	return x.Match == y.Match && x.Capacity == y.Capacity && x.TokensPerSecond == y.TokensPerSecond &&
		x.Refill == y.Refill && x.Name == y.Name && x.Bands.Equal(y.Bands)
}

// policyDiff says, for an error, where a gives a key another limit than
// want: the default limit, or the first entry of want (else of a) that the
// other lacks or limits otherwise, by its key.
func policyDiff(a, want policy.Policy) string {
	if a.Capacity != want.Capacity || a.TokensPerSecond != want.TokensPerSecond || a.Refill != want.Refill ||
		!a.Bands.Equal(want.Bands) {
		return "its default limit is not the configurations'"
	}
	have := map[string]policy.Override{}
	for _, o := range a.Overrides.Overrides() {
		have[o.Match] = o
	}
	for _, o := range want.Overrides.Overrides() {
		switch h, ok := have[o.Match]; {
		case !ok:
			return fmt.Sprintf("it has no limit for %q", o.Match)
		case !sameOverride(h, o):
			return fmt.Sprintf("it limits %q otherwise", o.Match)
		}
		delete(have, o.Match)
	}
	for _, o := range a.Overrides.Overrides() {
		if _, ok := have[o.Match]; ok {
			return fmt.Sprintf("it limits %q, which the configurations do not", o.Match)
		}
	}
	return "it differs"
}
