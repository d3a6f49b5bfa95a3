package redisstore

import (
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// FuzzParseSigned: parseSigned agrees with math/big. A balance is a
// decimal, "-" before a debt; it reads as floor(units / per) whole tokens
// and the remainder, and is refused when it is not such a decimal or its
// whole tokens are outside [-MaxInt64, MaxInt64].
func FuzzParseSigned(f *testing.F) {
	for _, s := range []string{"0", "-0", "1", "-1", "999999999", "-1000000000", "", "-", "--1", "+1", "1a", "007",
		"9223372036854775807000000000", "-9223372036854775807000000000", "-9223372036854775807000000001",
		"9223372036854775808000000000", "340282366920938463463374607431768211456", "18446744073709551616"} {
		f.Add(s, uint64(1e9))
		f.Add(s, uint64(1))
		f.Add(s, uint64(math.MaxUint64))
	}
	f.Fuzz(func(t *testing.T, units string, per uint64) {
		if per == 0 {
			return // a period is at least 1 ns
		}
		got, err := parseSigned(units, per)

		mag, neg := strings.CutPrefix(units, "-")
		ok := mag != "" && strings.Trim(mag, "0123456789") == ""
		var q, r big.Int
		if ok {
			v, _ := new(big.Int).SetString(mag, 10)
			if neg {
				v.Neg(v)
			}
			q.DivMod(v, new(big.Int).SetUint64(per), &r) // Euclidean: 0 <= r < per
			ok = q.IsInt64() && q.Int64() >= -math.MaxInt64
		}
		if !ok {
			require.Error(t, err, "%q per %d: got %+v", units, per, got)
			return
		}
		require.NoError(t, err, "%q per %d", units, per)
		require.Equal(t, policy.Level{Tokens: q.Int64(), Frac: r.Uint64()}, got, "%q per %d", units, per)
	})
}

// samePolicies reports whether a and b are one policy, field by field.
func samePolicies(a, b policy.Policy) bool {
	if a.Version != b.Version || a.Capacity != b.Capacity || a.TokensPerSecond != b.TokensPerSecond ||
		a.Refill != b.Refill || !a.Bands.Equal(b.Bands) || a.Overrides.Len() != b.Overrides.Len() {
		return false
	}
	x, y := a.Overrides.Overrides(), b.Overrides.Overrides()
	for i := range x {
		if x[i].Match != y[i].Match || x[i].Name != y[i].Name || x[i].Capacity != y[i].Capacity ||
			x[i].TokensPerSecond != y[i].TokensPerSecond || x[i].Refill != y[i].Refill || !x[i].Bands.Equal(y[i].Bands) {
			return false
		}
	}
	return true
}

// codecPieces build Matches and Names: bytes that JSON escapes or
// replaces (quotes, controls, invalid UTF-8, U+FFFD itself, HTML
// characters, U+2028), a '*' for patterns.
var codecPieces = []string{"a", "*", `"`, `\`, "\x00", "\n", "\xff", "\xc3", "\xc3\xa9", "\uFFFD", "<", "&", "\u2028", " ", ":", "MatchBytes"}

type codecBytes []byte

func (b *codecBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

func (b *codecBytes) str() string {
	var s strings.Builder
	for range 1 + b.next()%4 {
		s.WriteString(codecPieces[int(b.next())%len(codecPieces)])
	}
	return s.String()
}

func (b *codecBytes) int() int64 {
	switch c := b.next(); c % 4 {
	case 0:
		return math.MaxInt64 - int64(c>>2)
	default:
		return 1 + int64(c>>2)
	}
}

func (b *codecBytes) limit() (capacity, perSecond int64, refill policy.Rate) {
	capacity = b.int()
	if b.next()&1 == 0 {
		return capacity, b.int(), policy.Rate{}
	}
	return capacity, 0, policy.Rate{Tokens: b.int(), Per: time.Duration(b.int())}
}

func (b *codecBytes) bands() *policy.BandSet {
	var bs []policy.Band
	for range b.next() % 3 {
		c, _, r := b.limit()
		if r.IsZero() {
			r = policy.PerSecond(c)
		}
		bs = append(bs, policy.Band{Name: b.str(), Capacity: c, Refill: r})
	}
	s, err := policy.NewBands(bs...)
	if err != nil {
		return nil
	}
	return s
}

// FuzzPolicyCodec: a policy built from the fuzzer's bytes, with Matches
// and Names that JSON has to escape or cannot carry as they are, decodes
// to itself; and any blob decodePolicy accepts is a valid policy that
// encodes and decodes to itself.
func FuzzPolicyCodec(f *testing.F) {
	f.Add([]byte{}, "")
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, `{"Version":1,"Capacity":5,"TokensPerSecond":1}`)
	f.Add([]byte{3, 1, 1, 1, 4, 6, 1, 9, 2, 2, 7, 1, 3, 3, 5, 1, 2, 1, 1, 2, 2, 10, 3},
		`{"Version":2,"Capacity":5,"TokensPerSecond":0,"Refill":{"Tokens":3,"Per":60000000000},"Overrides":[{"Match":"a\ufffd","MatchBytes":"Yf8=","Capacity":1,"TokensPerSecond":1}]}`)
	f.Add([]byte{0, 0, 2, 5, 5, 5, 1, 0, 9, 9, 9, 9},
		`{"Version":1,"Capacity":2,"TokensPerSecond":2,"Bands":[{"Name":"m","Capacity":3,"Refill":{"Tokens":3,"Per":60000000000}}],"Overrides":[{"Match":"x*","Capacity":1,"TokensPerSecond":1,"Name":"n","Bands":[{"Name":"d","Capacity":1,"Refill":{"Tokens":1,"Per":1}}]}]}`)
	f.Fuzz(func(t *testing.T, shape []byte, blob string) {
		b := codecBytes(shape)
		p := policy.Policy{Version: b.int()}
		p.Capacity, p.TokensPerSecond, p.Refill = b.limit()
		p.Bands = b.bands()
		var ovs []policy.Override
		for range b.next() % 4 {
			o := policy.Override{Match: b.str()}
			if b.next()&1 != 0 {
				o.Name = b.str()
			}
			o.Capacity, o.TokensPerSecond, o.Refill = b.limit()
			o.Bands = b.bands()
			ovs = append(ovs, o)
		}
		var err error
		if p.Overrides, err = policy.NewOverrideSet(ovs...); err == nil && p.Validate() == nil {
			enc := encodePolicy(p)
			back, err := decodePolicy(enc)
			require.NoError(t, err, "%s", enc)
			require.True(t, samePolicies(p, back), "%+v encodes as %s, which decodes to %+v", p, enc, back)
		}

		got, err := decodePolicy(blob)
		if err != nil {
			return
		}
		require.NoError(t, got.Validate())
		enc := encodePolicy(got)
		back, err := decodePolicy(enc)
		require.NoError(t, err, "%q decodes, but its encoding %s does not", blob, enc)
		require.True(t, samePolicies(got, back), "%q decodes to %+v, which encodes as %s, which decodes to %+v", blob, got, enc, back)
	})
}
