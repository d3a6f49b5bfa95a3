package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

func ov(match string, capacity, rate int64) policy.Override {
	return policy.Override{Match: match, Capacity: capacity, TokensPerSecond: rate}
}

// TestResolve walks the resolution rule: an exact match wins, else the first
// matching pattern in declaration order, else the default; '*' matches any
// run of bytes, the empty run and '/' included, at the start, middle or end.
func TestResolve(t *testing.T) {
	set, err := policy.NewOverrideSet(
		ov("tenant:acme:*", 100, 10),     // 1
		ov("*:login", 5, 1),              // 2
		ov("tenant:acme:login", 1000, 1), // 3: exact beats both patterns
		ov("api/*/v1/*", 7, 7),           // 4
		ov("*", 2, 2),                    // a catch-all, last: only for keys nothing else matched
		ov("a*b*c", 3, 3),                // never reached: "*" comes first
		ov("key*with*star", 9, 9),
		ov("literal*key", 11, 11),
		ov("x*", 12, 12),
	)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 50, TokensPerSecond: 5, Overrides: set}
	def := policy.Limit{Capacity: 50, TokensPerSecond: 5}
	catchAll := policy.Limit{Capacity: 2, TokensPerSecond: 2}
	for _, tc := range []struct {
		key  string
		want policy.Limit
	}{
		{"tenant:acme:login", policy.Limit{Capacity: 1000, TokensPerSecond: 1}},
		{"tenant:acme:search", policy.Limit{Capacity: 100, TokensPerSecond: 10}},
		{"tenant:acme:", policy.Limit{Capacity: 100, TokensPerSecond: 10}}, // '*' matches the empty run
		{"tenant:acme:a/b/c", policy.Limit{Capacity: 100, TokensPerSecond: 10}},
		{"tenant:other:login", policy.Limit{Capacity: 5, TokensPerSecond: 1}}, // first pattern that matches
		{":login", policy.Limit{Capacity: 5, TokensPerSecond: 1}},
		{"api/users/v1/get", policy.Limit{Capacity: 7, TokensPerSecond: 7}},
		{"api//v1/", policy.Limit{Capacity: 7, TokensPerSecond: 7}},
		{"api/users/v2/get", catchAll},
		{"abc", catchAll}, // "a*b*c" matches, but "*" was declared first
		{"literal*key", catchAll},
	} {
		got, idx := p.Resolve(tc.key)
		assert.Equal(t, tc.want, got, "key %q", tc.key)
		assert.Equal(t, got, p.LimitAt(idx), "key %q: LimitAt(Resolve)", tc.key)
		assert.Equal(t, idx, set.Resolve(tc.key))
	}

	// Without a catch-all, unmatched keys get the default.
	set, err = policy.NewOverrideSet(ov("*:login", 5, 1), ov("a*b*c", 3, 3), ov("key*with*star", 9, 9), ov("x*y", 4, 4))
	require.NoError(t, err)
	p.Overrides = set
	for _, tc := range []struct {
		key  string
		want policy.Limit
	}{
		{"login", def},        // no ':' before it
		{"user:login:x", def}, // suffix anchored
		{"abc", policy.Limit{Capacity: 3, TokensPerSecond: 3}},
		{"aXbYc", policy.Limit{Capacity: 3, TokensPerSecond: 3}},
		{"ab", def},
		{"acb", def},  // runs must come in order
		{"abcb", def}, // the last run is a suffix
		{"abcbc", policy.Limit{Capacity: 3, TokensPerSecond: 3}},
		{"key*with*star", policy.Limit{Capacity: 9, TokensPerSecond: 9}}, // a key containing '*' may match a pattern
		{"xy", policy.Limit{Capacity: 4, TokensPerSecond: 4}},
		{"x", def}, // prefix and suffix may not overlap
		{"", def},
	} {
		got, _ := p.Resolve(tc.key)
		assert.Equal(t, tc.want, got, "key %q", tc.key)
	}
}

// TestResolveNoOverrides: a nil set resolves everything to the default,
// index 0, and the limit table is the default alone.
func TestResolveNoOverrides(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	lim, idx := p.Resolve("anything")
	assert.Equal(t, p.Limit(), lim)
	assert.Zero(t, idx)
	assert.Equal(t, []policy.Limit{p.Limit()}, p.Limits())
	var none *policy.OverrideSet
	assert.Zero(t, none.Len())
	assert.Zero(t, none.Patterns())
	assert.Nil(t, none.Overrides())
	set, err := policy.NewOverrideSet()
	require.NoError(t, err)
	assert.Nil(t, set, "no overrides is no set")

	// An empty set made by hand behaves as none.
	p.Overrides = &policy.OverrideSet{}
	require.NoError(t, p.Validate())
	lim, idx = p.Resolve("anything")
	assert.Equal(t, p.Limit(), lim)
	assert.Zero(t, idx)
}

// TestOverrideSetLimits: overrides that share a limit share its index, and
// the table lists the default first.
func TestOverrideSetLimits(t *testing.T) {
	set, err := policy.NewOverrideSet(ov("a", 5, 1), ov("b*", 7, 2), ov("c", 5, 1), ov("d", 5, 2))
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1, Overrides: set}
	assert.Equal(t, []policy.Limit{{Capacity: 5, TokensPerSecond: 1}, {Capacity: 5, TokensPerSecond: 1}, {Capacity: 7, TokensPerSecond: 2}, {Capacity: 5, TokensPerSecond: 2}}, p.Limits())
	_, a := p.Resolve("a")
	_, c := p.Resolve("c")
	assert.Equal(t, a, c)
	assert.Equal(t, 4, set.Len())
	assert.Equal(t, 1, set.Patterns(), "b* alone is a pattern")
	got := set.Overrides()
	assert.Equal(t, []policy.Override{ov("a", 5, 1), ov("b*", 7, 2), ov("c", 5, 1), ov("d", 5, 2)}, got)
	got[0].Capacity = 99 // a copy: the set cannot be changed through it
	assert.Equal(t, int64(5), set.Overrides()[0].Capacity)
}

// TestOverrideSetIsImmutable: changing the slice passed to NewOverrideSet
// afterwards changes nothing.
func TestOverrideSetIsImmutable(t *testing.T) {
	in := []policy.Override{ov("a", 5, 1), ov("b*", 7, 2)}
	set, err := policy.NewOverrideSet(in...)
	require.NoError(t, err)
	in[0].Capacity, in[1].Match = 1, "zzz"
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: set}
	lim, _ := p.Resolve("a")
	assert.Equal(t, int64(5), lim.Capacity)
	lim, _ = p.Resolve("bee")
	assert.Equal(t, int64(7), lim.Capacity)
}

// TestNewOverrideSetRejects: every bad entry is ErrInvalid with a message
// that names it.
func TestNewOverrideSetRejects(t *testing.T) {
	patterns := make([]policy.Override, policy.MaxPatterns+1)
	for i := range patterns {
		patterns[i] = ov(fmt.Sprintf("p%d:*", i), 1, 1)
	}
	for _, tc := range []struct {
		name string
		in   []policy.Override
		want string
	}{
		{"zero capacity", []policy.Override{ov("a", 1, 1), ov("b", 0, 1)}, `override 1 ("b"): capacity 0`},
		{"negative capacity", []policy.Override{ov("b*", -3, 1)}, `override 0 ("b*"): capacity -3`},
		{"zero rate", []policy.Override{ov("a", 1, 0)}, `override 0 ("a"): tokens per second 0`},
		{"negative rate", []policy.Override{ov("*x", 1, -1)}, `override 0 ("*x"): tokens per second -1`},
		{"empty match", []policy.Override{ov("", 1, 1)}, `override 0 (""): blank Match`},
		{"blank match", []policy.Override{ov("a", 1, 1), ov(" \t", 1, 1)}, `override 1 (" \t"): blank Match`},
		{"duplicate exact", []policy.Override{ov("a", 1, 1), ov("b", 2, 2), ov("a", 3, 3)}, `override 2 ("a"): Match given twice`},
		{"duplicate pattern", []policy.Override{ov("a*", 1, 1), ov("a*", 1, 1)}, `override 1 ("a*"): Match given twice`},
		{"too many patterns", patterns, fmt.Sprintf(`override %d ("p%d:*"): more than %d patterns`, policy.MaxPatterns, policy.MaxPatterns, policy.MaxPatterns)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := policy.NewOverrideSet(tc.in...)
			require.Error(t, err)
			assert.Nil(t, set)
			assert.True(t, errors.Is(err, policy.ErrInvalid), "%v is not ErrInvalid", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// Exactly MaxPatterns is fine.
	_, err := policy.NewOverrideSet(patterns[:policy.MaxPatterns]...)
	assert.NoError(t, err)
}

// TestOverrideSetManyExact: exact overrides have no count bound beyond
// memory; many of them with few distinct limits are fine.
func TestOverrideSetManyExact(t *testing.T) {
	in := make([]policy.Override, 100_000)
	for i := range in {
		in[i] = ov(fmt.Sprintf("tenant:%d", i), int64(1+i%3), 1)
	}
	set, err := policy.NewOverrideSet(in...)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: set}
	assert.Len(t, p.Limits(), 4)
	lim, _ := p.Resolve("tenant:99998")
	assert.Equal(t, int64(1+99998%3), lim.Capacity)
}

// TestPolicyComparable: a Policy with overrides is still comparable with ==,
// by the set's identity.
func TestPolicyComparable(t *testing.T) {
	a, err := policy.NewOverrideSet(ov("a", 1, 1))
	require.NoError(t, err)
	b, err := policy.NewOverrideSet(ov("a", 1, 1))
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: a}
	q := p
	assert.True(t, p == q)
	q.Overrides = b
	assert.False(t, p == q, "same content, another set")
}

// FuzzResolvePattern checks pattern matching against a dynamic-programming
// matcher on arbitrary patterns and keys.
func FuzzResolvePattern(f *testing.F) {
	f.Add("a*b*c", "aXbYc")
	f.Add("*:login", "x:login")
	f.Add("**", "")
	f.Add("a*a", "a")
	f.Add("*ab*ab*", "abab")
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if !strings.Contains(pattern, "*") || strings.TrimSpace(pattern) == "" {
			return
		}
		set, err := policy.NewOverrideSet(ov(pattern, 1, 1))
		require.NoError(t, err)
		want := globDP(pattern, key)
		assert.Equal(t, want, set.Resolve(key) == 1, "pattern %q key %q", pattern, key)
	})
}

// globDP matches by the textbook dynamic programme over (pattern, key)
// suffixes: a '*' either matches nothing or swallows one more byte.
func globDP(pattern, key string) bool {
	// m[i][j]: pattern[i:] matches key[j:].
	m := make([][]bool, len(pattern)+1)
	for i := range m {
		m[i] = make([]bool, len(key)+1)
	}
	m[len(pattern)][len(key)] = true
	for i := len(pattern) - 1; i >= 0; i-- {
		for j := len(key); j >= 0; j-- {
			if pattern[i] == '*' {
				m[i][j] = m[i+1][j] || (j < len(key) && m[i][j+1])
			} else {
				m[i][j] = j < len(key) && pattern[i] == key[j] && m[i+1][j+1]
			}
		}
	}
	return m[0][0]
}

// TestOverrideSetBandsByContent: overrides whose BandSets hold the same
// bands share a limit, whether they share the pointer or not, and a Name may
// be given to both; different bands are different limits.
func TestOverrideSetBandsByContent(t *testing.T) {
	mk := func(cap int64) *policy.BandSet {
		s, err := policy.NewBands(policy.Band{Name: "daily", Capacity: cap, Refill: policy.PerDay(cap)})
		require.NoError(t, err)
		return s
	}
	a, b, c := mk(100), mk(100), mk(200)
	require.True(t, a.Equal(b))
	require.False(t, a.Equal(c))
	require.False(t, a.Equal(nil))
	require.True(t, (*policy.BandSet)(nil).Equal(&policy.BandSet{}))
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "x", Name: "gold", Capacity: 5, TokensPerSecond: 1, Bands: a},
		policy.Override{Match: "y", Name: "gold", Capacity: 5, TokensPerSecond: 1, Bands: b},
		policy.Override{Match: "z", Capacity: 5, TokensPerSecond: 1, Bands: c})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: set}
	_, x := p.Resolve("x")
	_, y := p.Resolve("y")
	_, z := p.Resolve("z")
	assert.Equal(t, x, y)
	assert.NotEqual(t, x, z)
	_, err = policy.NewOverrideSet(
		policy.Override{Match: "x", Name: "gold", Capacity: 5, TokensPerSecond: 1, Bands: a},
		policy.Override{Match: "z", Name: "gold", Capacity: 5, TokensPerSecond: 1, Bands: c})
	require.ErrorIs(t, err, policy.ErrInvalid, "one name, two limits")
}

// TestResolvePatternRunsDoNotOverlap: the literal runs of a pattern match
// in order and without overlap, so a run given twice needs two
// occurrences in the key.
func TestResolvePatternRunsDoNotOverlap(t *testing.T) {
	set, err := policy.NewOverrideSet(ov("a*x*x*b", 3, 3), ov("*ab*ab*", 4, 4))
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 50, TokensPerSecond: 5, Overrides: set}
	for key, want := range map[string]int64{
		"axb":    50, // one x: the second run has nothing left to match
		"axxb":   3,
		"ax-x-b": 3,
		"xaby":   50, // one ab
		"xabab":  4,
		"abab":   4,
		"aba":    50,
	} {
		lim, _ := p.Resolve(key)
		assert.Equal(t, want, lim.Capacity, "key %q", key)
	}
}
