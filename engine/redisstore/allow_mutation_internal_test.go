package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// A charge answers for the band with the fewest whole tokens left, ties to
// the lowest index (as policy.ChargeLevels has it): the primary, when a
// band holds as few.
func TestChargeDecisionTiesToTheLowestBand(t *testing.T) {
	bands, err := policy.NewBands(policy.Band{Name: "burst", Capacity: 50, Refill: policy.Rate{Tokens: 1, Per: time.Second}})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1, Bands: bands}
	require.NoError(t, p.Validate())
	sh := p.Shape()
	ten := func(i int) string { return strconv.FormatUint(10*period(sh.Band(i)), 10) }
	d, err := decision(sh, modeCharge, true, ten(0)+" "+ten(1), nil, 5)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 10, Limit: 100, ResetAfter: 90 * time.Second, Band: sh.BandName(0)}, d)
}

// A balance past 128 bits overflows, also when the last digit's product
// alone passes them (2^127 then a 0 is 5*2^128, which modulo 2^128 would
// read as 0 units).
func TestParseSignedPast128Bits(t *testing.T) {
	for _, u := range []string{"1701411834604692317316873037158841057280", "-1701411834604692317316873037158841057280", "340282366920938463463374607431768211461"} {
		_, err := parseSigned(u, uint64(time.Second))
		require.ErrorContains(t, err, "overflows", u)
	}
}
