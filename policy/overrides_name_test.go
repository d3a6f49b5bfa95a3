package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

func named(match, name string, capacity, rate int64) policy.Override {
	return policy.Override{Match: match, Capacity: capacity, TokensPerSecond: rate, Name: name}
}

// TestOverrideNameAccepted: a Name is optional, any printable ASCII up to
// MaxNameBytes, and may be shared by overrides with the same limit.
func TestOverrideNameAccepted(t *testing.T) {
	longest := strings.Repeat("n", policy.MaxNameBytes)
	in := []policy.Override{
		named("a", "gold", 100, 10),
		named("b*", "gold", 100, 10), // same limit, same name
		named("c", "", 100, 10),      // unnamed
		named("d", "", 5, 1),
		named("e", ` !"\~ "quoted" `, 7, 7), // every edge of 0x20..0x7E
		named("f", longest, 8, 8),
	}
	set, err := policy.NewOverrideSet(in...)
	require.NoError(t, err)
	assert.Equal(t, in, set.Overrides(), "names are kept, in order")
}

// TestOverrideNameRejected: every bad Name is ErrInvalid, naming the entry.
func TestOverrideNameRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []policy.Override
		want string
	}{
		{"newline", []policy.Override{named("a", "go\nld", 1, 1)}, `override 0 ("a"): name "go\nld" has byte 0xa at 2, want printable ASCII`},
		{"tab", []policy.Override{named("a", "\tgold", 1, 1)}, `byte 0x9 at 0`},
		{"DEL", []policy.Override{named("a", "gold\x7f", 1, 1)}, `byte 0x7f at 4`},
		{"non-ASCII", []policy.Override{named("a", "café", 1, 1)}, `byte 0xc3 at 3`},
		{"too long", []policy.Override{named("a", strings.Repeat("n", policy.MaxNameBytes+1), 1, 1)}, `override 0 ("a"): name is 65 bytes, at most 64`},
		{"shared, capacity differs", []policy.Override{named("a", "gold", 5, 1), named("b", "x", 1, 1), named("c*", "gold", 6, 1)},
			`override 2 ("c*"): Name "gold" is override 0's, whose limit differs`},
		{"shared, rate differs", []policy.Override{named("a", "gold", 5, 1), named("b", "gold", 5, 2)},
			`override 1 ("b"): Name "gold" is override 0's, whose limit differs`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := policy.NewOverrideSet(tc.in...)
			require.Error(t, err)
			assert.Nil(t, set)
			assert.True(t, errors.Is(err, policy.ErrInvalid), "%v is not ErrInvalid", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestLookup: Lookup finds the override by Resolve's rule (exact, then the
// first matching pattern). Overrides with one limit and different names
// have different LimitIndexes (a key's primary band is named by its
// override), so a decision can say which one it was.
func TestLookup(t *testing.T) {
	in := []policy.Override{
		named("tenant:acme:*", "acme", 100, 10),
		named("*:login", "login", 5, 1),
		named("tenant:acme:login", "acme-login", 5, 1), // login's limit, its own name
		named("vip", "", 100, 10),                      // acme's limit, unnamed
	}
	set, err := policy.NewOverrideSet(in...)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 50, TokensPerSecond: 5, Overrides: set}
	for _, tc := range []struct {
		key  string
		want int // position in in; -1 for the default
	}{
		{"tenant:acme:login", 2},
		{"tenant:acme:search", 0},
		{"tenant:other:login", 1},
		{"vip", 3},
		{"vip:login", 1},
		{"nobody", -1},
		{"", -1},
	} {
		got, ok := set.Lookup(tc.key)
		_, idx := p.Resolve(tc.key)
		if tc.want < 0 {
			assert.False(t, ok, "key %q", tc.key)
			assert.Zero(t, got, "key %q", tc.key)
			assert.Zero(t, idx, "key %q", tc.key)
			continue
		}
		require.True(t, ok, "key %q", tc.key)
		assert.Equal(t, in[tc.want], got, "key %q", tc.key)
		assert.Equal(t, policy.Limit{Capacity: got.Capacity, TokensPerSecond: got.TokensPerSecond}, p.LimitAt(idx),
			"key %q: Lookup and Resolve agree", tc.key)
	}
	_, login := p.Resolve("x:login")
	_, acmeLogin := p.Resolve("tenant:acme:login")
	assert.NotEqual(t, login, acmeLogin, "one limit, two names, two indexes")
	assert.Equal(t, p.LimitAt(login), p.LimitAt(acmeLogin), "one limit")
	assert.Equal(t, "acme-login", p.ShapeAt(acmeLogin).Name)
	_, vip := p.Resolve("vip")
	assert.Equal(t, "", p.ShapeAt(vip).Name)

	var none *policy.OverrideSet
	o, ok := none.Lookup("vip")
	assert.False(t, ok)
	assert.Zero(t, o)
	o, ok = (&policy.OverrideSet{}).Lookup("vip") // empty, made by hand
	assert.False(t, ok)
	assert.Zero(t, o)
}

// FuzzLookupAgreesWithResolve: for any key, Lookup's override has the limit
// Resolve gives, and Lookup finds one exactly when Resolve is not 0.
func FuzzLookupAgreesWithResolve(f *testing.F) {
	set, err := policy.NewOverrideSet(
		named("a*", "a", 3, 1), named("*b", "b", 4, 1), named("ab", "", 3, 1), named("*a*b*", "", 5, 5), named("*", "all", 9, 9))
	require.NoError(f, err)
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: set}
	f.Add("ab")
	f.Add("xb")
	f.Add("")
	f.Fuzz(func(t *testing.T, key string) {
		o, ok := set.Lookup(key)
		lim, idx := p.Resolve(key)
		assert.Equal(t, idx != 0, ok)
		if ok {
			assert.Equal(t, policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond}, lim)
		}
	})
}

// TestOverrideNameSharedAcrossRateForms: TokensPerSecond n is exactly
// Refill PerSecond(n), so two overrides that write one limit in the two
// forms have the same limit and may share a Name; a rate that differs
// (60 per minute is not written as a rate per second) still may not.
func TestOverrideNameSharedAcrossRateForms(t *testing.T) {
	in := []policy.Override{
		{Match: "a", Name: "gold", Capacity: 5, TokensPerSecond: 10},
		{Match: "b*", Name: "gold", Capacity: 5, Refill: policy.PerSecond(10)},
	}
	set, err := policy.NewOverrideSet(in...)
	require.NoError(t, err, "one limit in two forms is one limit")
	assert.Equal(t, in, set.Overrides(), "each kept as given")
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Overrides: set}
	_, a := p.Resolve("a")
	_, b := p.Resolve("bee")
	assert.Equal(t, "gold", p.ShapeAt(a).Name)
	assert.Equal(t, "gold", p.ShapeAt(b).Name)
	assert.Equal(t, in[0].TokensPerSecond, p.LimitAt(a).TokensPerSecond, "the limit as given")
	assert.Equal(t, in[1].Refill, p.LimitAt(b).Refill, "the limit as given")

	_, err = policy.NewOverrideSet(in[0], policy.Override{Match: "c", Name: "gold", Capacity: 5, Refill: policy.PerSecond(11)})
	require.ErrorIs(t, err, policy.ErrInvalid, "another rate")
	_, err = policy.NewOverrideSet(in[0], policy.Override{Match: "c", Name: "gold", Capacity: 5, Refill: policy.PerMinute(600)})
	require.ErrorIs(t, err, policy.ErrInvalid, "another period is another rate")
}
