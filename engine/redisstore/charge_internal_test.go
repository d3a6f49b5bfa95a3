package redisstore

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestParseSigned: a band's units in debt read as floor(units / P) whole
// tokens and 0 <= Frac < P, down to -(2^63-1) tokens; a magnitude beyond
// is refused.
func TestParseSigned(t *testing.T) {
	for _, c := range []struct {
		units string
		per   uint64
		want  policy.Level
	}{
		{"5", 10, policy.Level{Tokens: 0, Frac: 5}},
		{"-1", 10, policy.Level{Tokens: -1, Frac: 9}},
		{"-10", 10, policy.Level{Tokens: -1}},
		{"-11", 10, policy.Level{Tokens: -2, Frac: 9}},
		{"-9223372036854775807", 1, policy.Level{Tokens: -math.MaxInt64}},
		{"-92233720368547758070", 10, policy.Level{Tokens: -math.MaxInt64}},
		{"-92233720368547758069", 10, policy.Level{Tokens: -math.MaxInt64, Frac: 1}},
	} {
		got, err := parseSigned(c.units, c.per)
		require.NoError(t, err, c.units)
		require.Equal(t, c.want, got, c.units)
	}
	for _, bad := range []string{"-", "--1", "-x", "-92233720368547758071"} {
		_, err := parseSigned(bad, 10)
		require.Error(t, err, bad)
	}
}
