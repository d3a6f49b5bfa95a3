package policy_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// FuzzOverrideSetLookup: for overrides whose Matches the fuzzer writes
// (split from matches on "\n"; capacities tell them apart), NewOverrideSet
// refuses exactly a blank Match or one given twice, and Lookup finds what
// the rule says, read literally: the override whose Match is the key, else
// the first pattern in declaration order that globDP matches, else none.
func FuzzOverrideSetLookup(f *testing.F) {
	f.Add("a*\n*b\nab\n*a*b*\n*", "ab")
	f.Add("x\n*\nx*", "x")
	f.Add("**\n*\n", "")
	f.Add("a*a\naa\n*a", "a")
	f.Add(" \nk", "k")
	f.Fuzz(func(t *testing.T, matches, key string) {
		ms := strings.Split(matches, "\n")
		if len(ms) > 8 {
			ms = ms[:8]
		}
		var ovs []policy.Override
		valid, seen := true, map[string]bool{}
		for i, m := range ms {
			ovs = append(ovs, ov(m, int64(i+1), 1))
			valid = valid && strings.TrimSpace(m) != "" && !seen[m]
			seen[m] = true
		}
		set, err := policy.NewOverrideSet(ovs...)
		if !valid {
			require.ErrorIs(t, err, policy.ErrInvalid, "%q", ms)
			return
		}
		require.NoError(t, err, "%q", ms)

		want := -1
		for i, m := range ms {
			if m == key {
				want = i
			}
		}
		for i, m := range ms {
			if want < 0 && strings.Contains(m, "*") && globDP(m, key) {
				want = i
			}
		}
		o, ok := set.Lookup(key)
		if want < 0 {
			require.False(t, ok, "%q in %q: found %q", key, ms, o.Match)
			return
		}
		require.True(t, ok, "%q in %q: want %q", key, ms, ms[want])
		require.Equal(t, ms[want], o.Match, "%q in %q", key, ms)
		require.Equal(t, int64(want+1), o.Capacity)
	})
}
