package redisstore

import (
	"math"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// luaTable reads the Lua table "local name = { field = n, ... }" from
// decide.lua.
func luaTable(t *testing.T, name string) map[string]int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^local ` + name + ` = \{([^}]*)\}`).FindStringSubmatch(decideLib)
	require.NotNil(t, m, "decide.lua has no table %s", name)
	out := map[string]int{}
	for _, f := range regexp.MustCompile(`(\w+) = (\d+)`).FindAllStringSubmatch(m[1], -1) {
		n, err := strconv.Atoi(f[2])
		require.NoError(t, err)
		out[f[1]] = n
	}
	return out
}

// TestProtocolPositions: the positions the Go encoder writes the decide
// script's keys and arguments at are the ones decide.lua's KEY and ARG
// tables name, so the two cannot drift apart.
func TestProtocolPositions(t *testing.T) {
	require.Equal(t, map[string]int{"policy": keyPolicy, "history": keyHistory, "pending": keyPending, "buckets": keyBuckets},
		luaTable(t, "KEY"))
	require.Equal(t, map[string]int{"mode": argMode, "version": argVersion, "now": argNow, "expiry": argExpiry, "per": argPer, "seed": argSeed, "shapes": argShapes},
		luaTable(t, "ARG"))
}

// TestCallWords: callWords puts each key and argument where decide.lua's
// tables say, for one shape and for two shapes and a chain.
func TestCallWords(t *testing.T) {
	keys, args := luaTable(t, "KEY"), luaTable(t, "ARG")
	p := policy.Policy{Version: 7, Capacity: 10, TokensPerSecond: 3}
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 20, TokensPerSecond: 5})
	require.NoError(t, err)
	p2 := p
	p2.Overrides = ov
	sk := shardKeys{policy: "P", history: "H", pending: "N", bucket: "b:"}
	sk.words = [3]any{sk.policy, sk.history, sk.pending}
	s := &Store{shards: []shardKeys{sk}}
	km, err := parseKeyMap("000102030405060708090a0b0c0d0e0f", "1")
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		p     policy.Policy
		chunk []*item
		want  []any // ARGV from argShapes on: the shapes, then each bucket's words
	}{
		{"one shape", p, []*item{{key: "x", cost: 3}, {key: "y", cost: 4}}, []any{1, int64(10), "3", any(int64(3)), any(int64(4))}},
		{"two shapes, a chain", p2, []*item{{key: "x", cost: 3}, {key: "vip", cost: 4, chain: "6 1 1"}, {key: "x", cost: 1}},
			[]any{2, int64(10), "3", int64(20), "5", int64(3), 1, int64(4), "2;6 1 1", int64(1), 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := s.callWords(sk, newState(c.p), &km, c.chunk, "a", "", "1")
			n := keys["buckets"] - 1 + len(c.chunk)
			kw, aw := a[callHead:callHead+n], a[callHead+n:]
			require.Equal(t, "P", kw[keys["policy"]-1])
			require.Equal(t, "H", kw[keys["history"]-1])
			require.Equal(t, "N", kw[keys["pending"]-1])
			for i, it := range c.chunk {
				require.Equal(t, "b:"+it.key, kw[keys["buckets"]-1+i])
			}
			require.Equal(t, "a", aw[args["mode"]-1])
			require.Equal(t, "7", aw[args["version"]-1])
			require.Equal(t, "", aw[args["now"]-1])
			want := "1"
			if repeats(c.chunk) {
				want = "1m"
			}
			require.Equal(t, want, aw[args["expiry"]-1])
			per := 1
			if len(c.want) > 3+len(c.chunk) {
				per = 2
			}
			require.Equal(t, per, aw[args["per"]-1])
			require.Equal(t, "000102030405060708090a0b0c0d0e0f", aw[args["seed"]-1])
			require.Equal(t, c.want, aw[args["shapes"]-1:])
		})
	}
}

// TestParseAhead: the script's time until a bucket's last update is a
// positive decimal, read saturating at math.MaxInt64; anything else is an
// error, never a wait of 0.
func TestParseAhead(t *testing.T) {
	for in, want := range map[string]int64{"1": 1, "84000000000000": 84e12, "9223372036854775807": math.MaxInt64, "99999999999999999999999": math.MaxInt64} {
		got, err := parseAhead(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	// Digits past the range and then something else are no decimal either:
	// the range is not all a reading checks.
	for _, in := range []string{"", "0", "-5", "+5", "5x", " 5", "1_000", "99999999999999999999x", "9223372036854775808 5"} {
		_, err := parseAhead(in)
		require.Error(t, err, "%q", in)
	}
}
