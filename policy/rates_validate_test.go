package policy_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// requireInvalid fails unless err wraps ErrInvalid and its message has
// every one of want.
func requireInvalid(t testing.TB, err error, want ...string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, policy.ErrInvalid)
	for _, w := range want {
		require.Contains(t, err.Error(), w)
	}
}

// TestValidateRefill: a Policy has exactly one of TokensPerSecond and
// Refill, and a Refill has Tokens and Per >= 1; each error names its field.
func TestValidateRefill(t *testing.T) {
	for _, p := range []policy.Policy{
		{Version: 1, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 1}},
		{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)},
		{Version: 1, Capacity: maxInt64, Refill: policy.Rate{Tokens: maxInt64, Per: maxInt64}},
		{Version: 1, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: maxInt64}},
		{Version: 1, Capacity: 1, Refill: policy.Rate{Tokens: maxInt64, Per: 1}},
	} {
		assert.NoError(t, p.Validate(), "%+v", p)
	}

	for _, tc := range []struct {
		name      string
		tps       int64
		refill    policy.Rate
		want      []string
		wantNoTPS bool // the message does not blame tokens per second
	}{
		{"both set", 5, policy.PerSecond(5), []string{"tokens per second 5", "refill 5/1s", "both set", "exactly one"}, false},
		{"both set, Refill odd", 1, policy.Rate{Tokens: 7, Per: 3 * time.Second}, []string{"both set"}, false},
		{"neither set", 0, policy.Rate{}, []string{"tokens per second 0", "no refill"}, false},
		{"refill tokens 0", 0, policy.Rate{Per: time.Second}, []string{"refill tokens 0", "want >= 1"}, true},
		{"refill tokens -1", 0, policy.Rate{Tokens: -1, Per: time.Second}, []string{"refill tokens -1"}, true},
		{"refill tokens MinInt64", 0, policy.Rate{Tokens: math.MinInt64, Per: time.Second}, []string{"refill tokens"}, true},
		{"refill period 0", 0, policy.Rate{Tokens: 1}, []string{"refill period 0s", "want >= 1ns"}, true},
		{"refill period -1ns", 0, policy.Rate{Tokens: 1, Per: -1}, []string{"refill period -1ns"}, true},
		{"refill period MinInt64", 0, policy.Rate{Tokens: 1, Per: math.MinInt64}, []string{"refill period"}, true},
		{"tokens per second negative, refill set", -1, policy.PerSecond(1), []string{"tokens per second -1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: tc.tps, Refill: tc.refill}
			err := p.Validate()
			requireInvalid(t, err, tc.want...)
			assert.NotContains(t, err.Error(), "version")
			assert.NotContains(t, err.Error(), "capacity")
			if tc.wantNoTPS {
				assert.NotContains(t, err.Error(), "tokens per second")
			}

			// The same limit in an override is refused with the same words,
			// naming the override.
			_, err = policy.NewOverrideSet(policy.Override{Match: "k", Capacity: 10, TokensPerSecond: tc.tps, Refill: tc.refill})
			requireInvalid(t, err, append([]string{`override 0 ("k")`}, tc.want...)...)
			// And so does a TokenBucket limiter.
			_, err = policy.NewTokenBucket(p.Limit(), 0)
			requireInvalid(t, err, tc.want...)
		})
	}

	// The first bad field is named: version before capacity before the rate.
	err := policy.Policy{Capacity: 0, Refill: policy.Rate{Tokens: -1}}.Validate()
	requireInvalid(t, err, "version")
	err = policy.Policy{Version: 1, Capacity: 0, Refill: policy.Rate{Tokens: -1}}.Validate()
	requireInvalid(t, err, "capacity 0")
	assert.NotContains(t, err.Error(), "refill")

	// A valid Refill override passes, and each form is kept as given: a
	// Refill of n per second is not turned into TokensPerSecond.
	in := policy.Override{Match: "k", Capacity: 10, Refill: policy.PerSecond(5)}
	set, err := policy.NewOverrideSet(in)
	require.NoError(t, err)
	assert.Equal(t, []policy.Override{in}, set.Overrides())
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerSecond(5), Overrides: set}
	require.NoError(t, p.Validate())
	assert.Equal(t, policy.Limit{Capacity: 10, Refill: policy.PerSecond(5)}, p.Limit())
	assert.Equal(t, policy.Limit{Capacity: 10, Refill: policy.PerSecond(5)}, p.LimitAt(set.Resolve("k")))
	assert.Equal(t, policy.PerSecond(5), p.Rate())
	assert.Equal(t, policy.PerSecond(7), policy.Policy{TokensPerSecond: 7}.Rate())
}

// TestNewBandsValid: what NewBands accepts, and what the set gives back.
func TestNewBandsValid(t *testing.T) {
	set, err := policy.NewBands()
	require.NoError(t, err)
	assert.Nil(t, set, "no bands is a nil set")
	assert.Zero(t, set.Len())
	assert.Nil(t, set.Bands())
	assert.Equal(t, -1, set.Index("daily"))

	require.GreaterOrEqual(t, policy.MaxBands, 3, "at least 3 bands besides the primary")
	in := make([]policy.Band, policy.MaxBands)
	for i := range in {
		in[i] = policy.Band{Name: fmt.Sprintf("band %d", i), Capacity: int64(i + 1), Refill: policy.Rate{Tokens: int64(i + 1), Per: time.Duration(i+1) * time.Hour}}
	}
	in[0].Name = ` !"\~ "quoted" ` // every edge of 0x20..0x7E
	in[1].Name = strings.Repeat("n", policy.MaxNameBytes)
	in[2].Capacity, in[2].Refill = maxInt64, policy.Rate{Tokens: maxInt64, Per: maxInt64}
	set, err = policy.NewBands(in...)
	require.NoError(t, err)
	require.Equal(t, policy.MaxBands, set.Len())
	assert.Equal(t, in, set.Bands())
	for i, b := range in {
		assert.Equal(t, b, set.At(i))
		assert.Equal(t, policy.Limit{Capacity: b.Capacity, Refill: b.Refill}, set.Limit(i))
		assert.Equal(t, i, set.Index(b.Name))
	}
	assert.Equal(t, -1, set.Index(""))
	assert.Equal(t, -1, set.Index("band 99"))

	// The set is immutable: changing the input or a copy changes nothing.
	in[3].Name = "changed"
	got := set.Bands()
	got[4].Capacity = 999
	assert.Equal(t, "band 3", set.At(3).Name)
	assert.Equal(t, int64(5), set.At(4).Capacity)

	// Two sets of equal bands are different sets: a BandSet compares by
	// pointer, so a Policy holding one stays comparable.
	a := mustBands(t, policy.Band{Name: "d", Capacity: 1, Refill: policy.PerDay(1)})
	b := mustBands(t, policy.Band{Name: "d", Capacity: 1, Refill: policy.PerDay(1)})
	pa := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Bands: a}
	pb := pa
	assert.True(t, pa == pb)
	pb.Bands = b
	assert.False(t, pa == pb)
}

// TestNewBandsRejects: every bad band is ErrInvalid, naming the band and
// its bad field.
func TestNewBandsRejects(t *testing.T) {
	ok := policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)}
	with := func(f func(b *policy.Band)) []policy.Band {
		b := ok
		f(&b)
		return []policy.Band{{Name: "first", Capacity: 1, Refill: policy.PerSecond(1)}, b}
	}
	tooMany := make([]policy.Band, policy.MaxBands+1)
	for i := range tooMany {
		tooMany[i] = policy.Band{Name: fmt.Sprint(i), Capacity: 1, Refill: policy.PerSecond(1)}
	}
	for _, tc := range []struct {
		name string
		in   []policy.Band
		want []string
	}{
		{"blank name", with(func(b *policy.Band) { b.Name = "" }), []string{"band 1", "empty name"}},
		{"repeated name", with(func(b *policy.Band) { b.Name = "first" }), []string{`band 1 ("first")`, "name is band 0's"}},
		{"newline", with(func(b *policy.Band) { b.Name = "dai\nly" }), []string{"band 1", `name "dai\nly" has byte 0xa at 3, want printable ASCII`}},
		{"NUL", with(func(b *policy.Band) { b.Name = "\x00" }), []string{"band 1", "byte 0x0 at 0"}},
		{"DEL", with(func(b *policy.Band) { b.Name = "d\x7f" }), []string{"band 1", "byte 0x7f at 1"}},
		{"non-ASCII", with(func(b *policy.Band) { b.Name = "täglich" }), []string{"band 1", "byte 0xc3 at 1"}},
		{"too long", with(func(b *policy.Band) { b.Name = strings.Repeat("n", policy.MaxNameBytes+1) }), []string{"band 1", "name is 65 bytes, at most 64"}},
		{"capacity 0", with(func(b *policy.Band) { b.Capacity = 0 }), []string{`band 1 ("daily")`, "capacity 0, want >= 1"}},
		{"capacity negative", with(func(b *policy.Band) { b.Capacity = math.MinInt64 }), []string{`band 1 ("daily")`, "capacity -9223372036854775808"}},
		{"no refill", with(func(b *policy.Band) { b.Refill = policy.Rate{} }), []string{`band 1 ("daily")`, "no refill rate"}},
		{"refill tokens 0", with(func(b *policy.Band) { b.Refill.Tokens = 0 }), []string{`band 1 ("daily")`, "refill tokens 0"}},
		{"refill tokens negative", with(func(b *policy.Band) { b.Refill.Tokens = -5 }), []string{`band 1 ("daily")`, "refill tokens -5"}},
		{"refill period 0", with(func(b *policy.Band) { b.Refill.Per = 0 }), []string{`band 1 ("daily")`, "refill period 0s"}},
		{"refill period negative", with(func(b *policy.Band) { b.Refill.Per = -time.Hour }), []string{`band 1 ("daily")`, "refill period -1h0m0s"}},
		{"too many", tooMany, []string{fmt.Sprintf("%d bands, at most %d", policy.MaxBands+1, policy.MaxBands)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := policy.NewBands(tc.in...)
			assert.Nil(t, set)
			requireInvalid(t, err, tc.want...)
		})
	}
}

// TestOverrideBandsRejects: a band may not have its override's Name; the
// names of the bands of different overrides, and of the policy's own
// bands, are free.
func TestOverrideBandsRejects(t *testing.T) {
	gold := mustBands(t,
		policy.Band{Name: "hourly", Capacity: 100, Refill: policy.PerHour(100)},
		policy.Band{Name: "gold", Capacity: 1000, Refill: policy.PerDay(1000)},
	)
	_, err := policy.NewOverrideSet(
		policy.Override{Match: "a", Capacity: 5, TokensPerSecond: 5},
		policy.Override{Match: "tenant:*", Capacity: 5, TokensPerSecond: 5, Bands: gold, Name: "gold"},
	)
	requireInvalid(t, err, `override 1 ("tenant:*")`, `name "gold" is also one of its bands'`)

	// Named otherwise, or unnamed, the same bands are fine; and a band may
	// share the name of another override.
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "a", Capacity: 5, TokensPerSecond: 5, Bands: gold, Name: "hourly-plan"},
		policy.Override{Match: "b", Capacity: 5, TokensPerSecond: 5, Bands: gold},
		policy.Override{Match: "c", Capacity: 5, Refill: policy.PerMinute(5), Name: "gold"},
	)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1, Bands: gold, Overrides: set}
	require.NoError(t, p.Validate())

	// An override's limit is its own: the policy's Bands do not apply.
	sh := p.ShapeAt(p.Overrides.Resolve("c"))
	assert.Equal(t, policy.Shape{Name: "gold", Primary: policy.Limit{Capacity: 5, Refill: policy.PerMinute(5)}}, sh)
	assert.Equal(t, 1, sh.Len())
	assert.Equal(t, gold, p.ShapeAt(p.Overrides.Resolve("a")).Bands)
	assert.Equal(t, 3, p.ShapeAt(0).Len())

	// A shared Name needs the same limit, bands included.
	other := mustBands(t, policy.Band{Name: "hourly", Capacity: 100, Refill: policy.PerHour(100)})
	_, err = policy.NewOverrideSet(
		policy.Override{Match: "a", Capacity: 5, TokensPerSecond: 5, Bands: other, Name: "plan"},
		policy.Override{Match: "b", Capacity: 5, TokensPerSecond: 5, Name: "plan"},
	)
	requireInvalid(t, err, `override 1 ("b")`, `Name "plan" is override 0's, whose limit differs`)
}
