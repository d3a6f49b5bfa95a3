package redisstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestSafeCutoverPerKey: a cutover lengthens only if some key's own limit
// fills slower under the next policy than under the one in force, so one
// that lowers the default of a policy with an override below it needs no
// pass over the keyspace (every key keeps or lowers its limit), while one
// that moves a key to a higher limit, by an exact override or a pattern
// (a key "bulk:1" from "bulk:*" to a pattern put before it), or raises a
// pattern's limit, does.
func TestSafeCutoverPerKey(t *testing.T) {
	pol := func(v, def int64, os ...policy.Override) policy.Policy {
		set, err := policy.NewOverrideSet(os...)
		require.NoError(t, err)
		p := policy.Policy{Version: v, Capacity: def, TokensPerSecond: 1, Overrides: set}
		require.NoError(t, p.Validate())
		return p
	}
	ov := func(match string, capacity int64) policy.Override {
		return policy.Override{Match: match, Capacity: capacity, TokensPerSecond: 1}
	}
	cur := pol(1, 1000, ov("vip", 100_000), ov("low", 10), ov("bulk:*", 5))
	for _, c := range []struct {
		name string
		next policy.Policy
		safe bool
	}{
		{"the default lowered", pol(2, 900, ov("vip", 100_000), ov("low", 10), ov("bulk:*", 5)), true},
		{"an override dropped to a default below it", pol(2, 900, ov("low", 10), ov("bulk:*", 5)), true},
		{"an override lowered", pol(2, 1000, ov("vip", 50_000), ov("low", 10), ov("bulk:*", 5)), true},
		{"an override added below the default", pol(2, 1000, ov("vip", 100_000), ov("low", 10), ov("new", 3), ov("bulk:*", 5)), true},
		{"an override raised", pol(2, 1000, ov("vip", 100_000), ov("low", 11), ov("bulk:*", 5)), false},
		{"an override dropped to a default above it", pol(2, 1000, ov("vip", 100_000), ov("bulk:*", 5)), false},
		{"an override added above the default", pol(2, 1000, ov("vip", 100_000), ov("low", 10), ov("new", 1001), ov("bulk:*", 5)), false},
		{"a pattern raised", pol(2, 1000, ov("vip", 100_000), ov("low", 10), ov("bulk:*", 6)), false},
		{"a pattern added above the default", pol(2, 1000, ov("vip", 100_000), ov("low", 10), ov("bulk:*", 5), ov("x*", 2000)), false},
		{"a pattern put first that takes another's keys", pol(2, 1000, ov("vip", 100_000), ov("low", 10), ov("*:*", 1000), ov("bulk:*", 5)), false},
		{"the default raised", pol(2, 1001, ov("vip", 100_000), ov("low", 10), ov("bulk:*", 5)), false},
	} {
		require.Equal(t, c.safe, safeCutover(cur, c.next), c.name)
	}
}
