package policy_test

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// mustBands builds a BandSet or fails the test.
func mustBands(t testing.TB, bands ...policy.Band) *policy.BandSet {
	t.Helper()
	s, err := policy.NewBands(bands...)
	require.NoError(t, err)
	return s
}

// ratsOf returns the model's balances of lv under sh.
func ratsOf(sh policy.Shape, lv []policy.Level) []*big.Rat {
	xs := make([]*big.Rat, len(lv))
	for i := range lv {
		xs[i] = ratOfLevel(sh.Band(i), lv[i])
	}
	return xs
}

// requireLevels fails unless every lv[i] is a valid level of band i whose
// balance is xs[i].
func requireLevels(t testing.TB, sh policy.Shape, xs []*big.Rat, lv []policy.Level, msgAndArgs ...any) {
	t.Helper()
	require.Len(t, lv, len(xs), msgAndArgs...)
	for i := range lv {
		requireLevel(t, sh.Band(i), xs[i], lv[i], append(msgAndArgs, "band", i)...)
	}
}

// TestShapeAccessors: band 0 is the primary, named by the Shape; band i is
// Bands.At(i-1).
func TestShapeAccessors(t *testing.T) {
	bands := mustBands(t,
		policy.Band{Name: "hourly", Capacity: 100, Refill: policy.PerHour(100)},
		policy.Band{Name: "daily", Capacity: 1000, Refill: policy.PerDay(1000)},
	)
	sh := policy.Shape{Name: "gold", Primary: policy.Limit{Capacity: 10, TokensPerSecond: 5}, Bands: bands}
	require.Equal(t, 3, sh.Len())
	assert.Equal(t, []string{"gold", "hourly", "daily"}, []string{sh.BandName(0), sh.BandName(1), sh.BandName(2)})
	assert.Equal(t, sh.Primary, sh.Band(0))
	assert.Equal(t, policy.Limit{Capacity: 100, Refill: policy.PerHour(100)}, sh.Band(1))
	assert.Equal(t, bands.Limit(1), sh.Band(2))
	assert.False(t, sh.Compact(), "bands need Levels")
	assert.True(t, policy.Shape{Primary: sh.Primary}.Compact())
	assert.False(t, policy.Shape{Primary: policy.Limit{Capacity: 1, Refill: policy.PerMinute(1)}}.Compact())

	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 5, Bands: bands}
	assert.Equal(t, policy.Shape{Primary: p.Limit(), Bands: bands}, p.Shape())
	assert.Equal(t, p.Shape(), p.ShapeAt(0))
	assert.Equal(t, []policy.Shape{p.Shape()}, p.Shapes())
}

// TestDecideLevelsBinding pins the binding band on hand-built balances:
// denied, the band with the longest wait; allowed, the band with the fewest
// whole tokens left; ties to the lowest index, the primary first. Remaining
// and ResetAfter are that band's, RetryAfter the longest wait.
func TestDecideLevelsBinding(t *testing.T) {
	sec := int64(time.Second)
	// Every band refills 1 token per second, so waits read in seconds.
	one := func(capacity int64) policy.Limit { return policy.Limit{Capacity: capacity, TokensPerSecond: 1} }
	bands := mustBands(t,
		policy.Band{Name: "b", Capacity: 10, Refill: policy.PerSecond(1)},
		policy.Band{Name: "c", Capacity: 10, Refill: policy.Rate{Tokens: 60, Per: time.Minute}},
	)
	sh := policy.Shape{Primary: one(10), Bands: bands}
	half := uint64(500_000_000) // half a token at 1/s
	halfC := uint64(30_000_000_000)

	for _, tc := range []struct {
		name  string
		lv    []policy.Level
		cost  int64
		want  policy.Outcome
		band  int
		after []policy.Level // nil: unchanged
	}{
		{"allowed, all full: the primary", []policy.Level{{Tokens: 10}, {Tokens: 10}, {Tokens: 10}}, 1,
			policy.Outcome{Allowed: true, Remaining: 9, ResetAfter: sec}, 0,
			[]policy.Level{{Tokens: 9}, {Tokens: 9}, {Tokens: 9}}},
		{"allowed, fewest whole tokens: b", []policy.Level{{Tokens: 5}, {Tokens: 3, Frac: half}, {Tokens: 4}}, 2,
			policy.Outcome{Allowed: true, Remaining: 1, ResetAfter: 8*sec + sec/2}, 1,
			[]policy.Level{{Tokens: 3}, {Tokens: 1, Frac: half}, {Tokens: 2}}},
		{"allowed, whole tokens tie, fraction ignored: lowest index b", []policy.Level{{Tokens: 5}, {Tokens: 3}, {Tokens: 3, Frac: halfC}}, 1,
			policy.Outcome{Allowed: true, Remaining: 2, ResetAfter: 8 * sec}, 1,
			[]policy.Level{{Tokens: 4}, {Tokens: 2}, {Tokens: 2, Frac: halfC}}},
		{"allowed, tie with the primary: the primary", []policy.Level{{Tokens: 3, Frac: half}, {Tokens: 3}, {Tokens: 3}}, 3,
			policy.Outcome{Allowed: true, Remaining: 0, ResetAfter: 9*sec + sec/2}, 0,
			[]policy.Level{{Frac: half}, {}, {}}},
		{"allowed to exactly zero in c", []policy.Level{{Tokens: 9}, {Tokens: 9}, {Tokens: 4}}, 4,
			policy.Outcome{Allowed: true, Remaining: 0, ResetAfter: 10 * sec}, 2,
			[]policy.Level{{Tokens: 5}, {Tokens: 5}, {}}},
		{"denied by c alone: longest wait", []policy.Level{{Tokens: 10}, {Tokens: 10}, {Tokens: 1, Frac: halfC}}, 3,
			policy.Outcome{Remaining: 1, RetryAfter: sec + sec/2, ResetAfter: 8*sec + sec/2}, 2, nil},
		{"denied by two, c waits longer", []policy.Level{{Tokens: 2}, {Tokens: 1}, {Tokens: 0, Frac: halfC}}, 3,
			policy.Outcome{Remaining: 0, RetryAfter: 2*sec + sec/2, ResetAfter: 9*sec + sec/2}, 2, nil},
		{"denied, equal waits: lowest index b", []policy.Level{{Tokens: 10}, {Tokens: 1}, {Tokens: 1}}, 3,
			policy.Outcome{Remaining: 1, RetryAfter: 2 * sec, ResetAfter: 9 * sec}, 1, nil},
		{"denied, equal waits with the primary: the primary", []policy.Level{{Frac: half}, {Frac: half}, {Frac: halfC}}, 1,
			policy.Outcome{Remaining: 0, RetryAfter: sec / 2, ResetAfter: 9*sec + sec/2}, 0, nil},
		{"denied by the primary, bands full", []policy.Level{{}, {Tokens: 10}, {Tokens: 10}}, 10,
			policy.Outcome{Remaining: 0, RetryAfter: 10 * sec, ResetAfter: 10 * sec}, 0, nil},
		{"denied though c holds most: wait decides, not tokens", []policy.Level{{Tokens: 10}, {Tokens: 2, Frac: half}, {Tokens: 2}}, 4,
			policy.Outcome{Remaining: 2, RetryAfter: 2 * sec, ResetAfter: 8 * sec}, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lv := slices.Clone(tc.lv)
			xs := ratsOf(sh, tc.lv)
			got, band := policy.DecideLevels(sh, lv, tc.cost)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.band, band)
			want, wantBand := ratDecide(sh, xs, tc.cost, true)
			assert.Equal(t, want, got, "the model")
			assert.Equal(t, wantBand, band, "the model")
			after := tc.after
			if after == nil {
				after = tc.lv
			}
			assert.Equal(t, after, lv)
			requireLevels(t, sh, xs, lv)
		})
	}

	// Waits beyond MaxInt64 ns are compared as reported: both saturate, so
	// they tie, and the lowest index binds.
	slow := mustBands(t, policy.Band{Name: "slow", Capacity: 4, Refill: policy.Rate{Tokens: 1, Per: maxInt64}})
	ssh := policy.Shape{Primary: rateLimit(4, 1, maxInt64), Bands: slow}
	lv := []policy.Level{{Tokens: 1}, {}}
	got, band := policy.DecideLevels(ssh, lv, 3) // exact waits: 2 and 3 x MaxInt64 ns
	assert.Equal(t, policy.Outcome{Remaining: 1, RetryAfter: maxInt64, ResetAfter: maxInt64}, got)
	assert.Equal(t, 0, band)
	want, wantBand := ratDecide(ssh, ratsOf(ssh, []policy.Level{{Tokens: 1}, {}}), 3, true)
	assert.Equal(t, want, got)
	assert.Equal(t, wantBand, band)
}

// TestPeekLevels: a peek is a decision of one token that takes nothing.
func TestPeekLevels(t *testing.T) {
	sec := int64(time.Second)
	sh := policy.Shape{
		Name:    "gold",
		Primary: policy.Limit{Capacity: 5, TokensPerSecond: 5},
		Bands:   mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)}),
	}
	for _, tc := range []struct {
		name string
		lv   []policy.Level
		want policy.Outcome
		band int
	}{
		{"full", []policy.Level{{Tokens: 5}, {Tokens: 20}}, policy.Outcome{Allowed: true, Remaining: 5}, 0},
		{"daily has fewest", []policy.Level{{Tokens: 5}, {Tokens: 2}}, policy.Outcome{Allowed: true, Remaining: 2, ResetAfter: 18 * 4320 * sec}, 1},
		{"one token each: the primary", []policy.Level{{Tokens: 1}, {Tokens: 1}}, policy.Outcome{Allowed: true, Remaining: 1, ResetAfter: 4 * sec / 5}, 0},
		{"primary empty", []policy.Level{{}, {Tokens: 7}}, policy.Outcome{RetryAfter: sec / 5, ResetAfter: sec}, 0},
		{"daily all but 20 units empty", []policy.Level{{}, {Frac: 20}}, policy.Outcome{RetryAfter: 4320*sec - 1, ResetAfter: 20*4320*sec - 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lv := slices.Clone(tc.lv)
			got, band := policy.PeekLevels(sh, lv)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.band, band)
			assert.Equal(t, tc.lv, lv, "a peek takes nothing")
			want, wantBand := ratDecide(sh, ratsOf(sh, tc.lv), 1, false)
			assert.Equal(t, want, got, "the model")
			assert.Equal(t, wantBand, band, "the model")
		})
	}
}

// TestFullLevels: a key is full only when every band is.
func TestFullLevels(t *testing.T) {
	sh := policy.Shape{Primary: policy.Limit{Capacity: 5, TokensPerSecond: 5},
		Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})}
	assert.True(t, policy.FullLevels(sh, []policy.Level{{Tokens: 5}, {Tokens: 20}}))
	assert.False(t, policy.FullLevels(sh, []policy.Level{{Tokens: 4, Frac: 999_999_999}, {Tokens: 20}}))
	assert.False(t, policy.FullLevels(sh, []policy.Level{{Tokens: 5}, {Tokens: 19, Frac: 1}}))
	lv := []policy.Level{{Tokens: 4}, {Tokens: 19}}
	policy.RefillLevels(sh, lv, int64(time.Second/5))
	assert.Equal(t, []policy.Level{{Tokens: 5}, {Tokens: 19, Frac: 4_000_000_000}}, lv, "each band at its own rate: 0.2 s x 20 units")
	assert.False(t, policy.FullLevels(sh, lv))
	policy.RefillLevels(sh, lv, int64(72*time.Minute))
	assert.True(t, policy.FullLevels(sh, lv))
	assert.Equal(t, []policy.Level{policy.FullLevel(sh.Band(0)), policy.FullLevel(sh.Band(1))}, lv)
}

// TestCutoverLevels: bands are matched by name (the primary with the
// primary, whatever the names), a matched band keeps its balance floored to
// the new unit and clamped to the new capacity, a new band starts full, a
// removed one is dropped.
func TestCutoverLevels(t *testing.T) {
	old := policy.Shape{
		Name:    "gold",
		Primary: policy.Limit{Capacity: 10, TokensPerSecond: 2},
		Bands: mustBands(t,
			policy.Band{Name: "hourly", Capacity: 100, Refill: policy.PerHour(100)},
			policy.Band{Name: "daily", Capacity: 1000, Refill: policy.PerDay(1000)},
			policy.Band{Name: "weekly", Capacity: 5000, Refill: policy.Rate{Tokens: 5000, Per: 7 * 24 * time.Hour}},
		),
	}
	lv := []policy.Level{
		{Tokens: 3, Frac: 500_000_000},           // half a token
		{Tokens: 40, Frac: 1},                    // 1 unit = 1/3.6e12 token
		{Tokens: 900, Frac: 43_200_000_000_000},  // half a token
		{Tokens: 4000, Frac: 60_480_000_000_000}, // 1/10 token
	}
	next := policy.Shape{
		Name:    "silver", // renamed: still the primary
		Primary: policy.Limit{Capacity: 20, Refill: policy.PerMinute(60)},
		Bands: mustBands(t,
			policy.Band{Name: "daily", Capacity: 500, Refill: policy.PerDay(500)},              // reordered, lowered, same period
			policy.Band{Name: "monthly", Capacity: 20_000, Refill: policy.PerDay(20_000 / 30)}, // new
			policy.Band{Name: "hourly", Capacity: 200, Refill: policy.Rate{Tokens: 1, Per: time.Second}},
		),
	}
	out := make([]policy.Level, next.Len())
	policy.CutoverLevels(old, lv, next, out)
	assert.Equal(t, []policy.Level{
		{Tokens: 3, Frac: 30_000_000_000}, // 1/2 token in minutes' units, exact
		{Tokens: 500},                     // clamped, fraction dropped
		{Tokens: 20_000},                  // new: full
		{Tokens: 40},                      // 1/3.6e12 token floors to no 1e9-unit: lost, not minted
	}, out)
	for i := range out {
		j := 0
		if i > 0 {
			j = old.Bands.Index(next.BandName(i)) + 1
		}
		want := ratTokens(next.Band(i).Capacity)
		if i == 0 || j > 0 {
			want = ratConvert(next.Band(i), ratOfLevel(old.Band(j), lv[j]))
			require.LessOrEqual(t, want.Cmp(ratOfLevel(old.Band(j), lv[j])), 0)
		}
		requireLevel(t, next.Band(i), want, out[i], "band %d", i)
	}

	// To no bands and back: the primary carries, a band comes back full.
	plain := policy.Shape{Primary: policy.Limit{Capacity: 10, TokensPerSecond: 2}}
	one := make([]policy.Level, 1)
	policy.CutoverLevels(old, lv, plain, one)
	assert.Equal(t, []policy.Level{{Tokens: 3, Frac: 500_000_000}}, one)
	back := make([]policy.Level, old.Len())
	policy.CutoverLevels(plain, one, old, back)
	assert.Equal(t, []policy.Level{{Tokens: 3, Frac: 500_000_000}, {Tokens: 100}, {Tokens: 1000}, {Tokens: 5000}}, back)
}

// randomRate returns a rate whose period is often one of the awkward ones.
func randomRate(r *rand.Rand) policy.Rate {
	periods := []int64{1, 3_000_000_000, int64(time.Minute), int64(time.Hour), int64(24 * time.Hour), 1 << 32, 1<<32 + 1, maxInt64, 1_000_000_000}
	per := interesting(r, 1, maxInt64)
	if r.IntN(2) == 0 {
		per = periods[r.IntN(len(periods))]
	}
	tokens := interesting(r, 1, maxInt64)
	if r.IntN(2) == 0 {
		tokens = 1 + r.Int64N(1000)
	}
	return policy.Rate{Tokens: tokens, Per: time.Duration(per)}
}

// randomBandLimit returns a valid limit of any rate, per second or not.
func randomBandLimit(r *rand.Rand) policy.Limit {
	c := interesting(r, 1, maxInt64)
	if r.IntN(2) == 0 {
		c = 1 + r.Int64N(100)
	}
	if r.IntN(4) == 0 {
		return policy.Limit{Capacity: c, TokensPerSecond: interesting(r, 1, maxInt64)}
	}
	return policy.Limit{Capacity: c, Refill: randomRate(r)}
}

// randomShape returns a shape of 0 to MaxBands bands besides the primary,
// named from a small pool so that two shapes often share band names.
func randomShape(t testing.TB, r *rand.Rand) policy.Shape {
	names := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
	r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	n := r.IntN(policy.MaxBands + 1)
	if r.IntN(2) == 0 {
		n = r.IntN(3)
	}
	var bands []policy.Band
	for i := range n {
		l := randomBandLimit(r)
		bands = append(bands, policy.Band{Name: names[i], Capacity: l.Capacity, Refill: l.Rate()})
	}
	return policy.Shape{Name: []string{"", "gold"}[r.IntN(2)], Primary: randomBandLimit(r), Bands: mustBands(t, bands...)}
}

// TestLevelsMatchModelRandom runs random sequences of refills, decisions,
// peeks, credits and cutovers over shapes of random bands against the
// rational model, checking atomicity on the way: a denial changes no band,
// an admission takes cost from every band.
func TestLevelsMatchModelRandom(t *testing.T) {
	skipUnderRace(t)
	r, seed := newRand(t)
	for i := range 3_000 {
		sh := randomShape(t, r)
		lv := make([]policy.Level, sh.Len())
		for j := range lv {
			lv[j] = randomLevel(r, sh.Band(j))
		}
		xs := ratsOf(sh, lv)
		for step := range 8 {
			msg := []any{"seed %d iteration %d step %d: shape %+v bands %v levels %+v", seed, i, step, sh, sh.Bands.Bands(), slices.Clone(lv)}
			switch op := r.IntN(10); {
			case op < 2:
				d := interesting(r, 0, maxInt64)
				policy.RefillLevels(sh, lv, d)
				for j := range xs {
					xs[j] = ratRefill(sh.Band(j), xs[j], d)
				}
			case op < 6:
				cost := interesting(r, 1, minCapacity(sh))
				before := slices.Clone(lv)
				got, band := policy.DecideLevels(sh, lv, cost)
				want, wantBand := ratDecide(sh, xs, cost, true)
				require.Equal(t, want, got, append(msg, "cost", cost)...)
				require.Equal(t, wantBand, band, append(msg, "cost", cost)...)
				if !got.Allowed {
					require.Equal(t, before, lv, "a denial takes nothing")
				} else {
					for j := range lv {
						require.Equal(t, before[j].Tokens-cost, lv[j].Tokens, "cost taken from band %d", j)
						require.Equal(t, before[j].Frac, lv[j].Frac)
					}
				}
			case op < 7:
				before := slices.Clone(lv)
				got, band := policy.PeekLevels(sh, lv)
				want, wantBand := ratDecide(sh, xs, 1, false)
				require.Equal(t, want, got, msg...)
				require.Equal(t, wantBand, band, msg...)
				require.Equal(t, before, lv, "a peek takes nothing")
			case op < 8:
				n := interesting(r, 1, maxInt64)
				for j := range lv {
					lv[j].Credit(sh.Band(j), n)
					xs[j] = ratCredit(sh.Band(j), xs[j], n)
				}
			default:
				next := randomShape(t, r)
				out := make([]policy.Level, next.Len())
				policy.CutoverLevels(sh, lv, next, out)
				nx := make([]*big.Rat, next.Len())
				for j := range nx {
					nx[j] = ratTokens(next.Band(j).Capacity)
					if k := next.BandName(j); j == 0 {
						nx[j] = ratConvert(next.Band(0), xs[0])
					} else if o := sh.Bands.Index(k); o >= 0 {
						nx[j] = ratConvert(next.Band(j), xs[o+1])
					}
				}
				sh, lv, xs = next, out, nx
			}
			requireLevels(t, sh, xs, lv, msg...)
			want := true
			for j := range xs {
				want = want && xs[j].Cmp(ratTokens(sh.Band(j).Capacity)) == 0
			}
			require.Equal(t, want, policy.FullLevels(sh, lv), msg...)
		}
	}
}

func minCapacity(sh policy.Shape) int64 {
	c := sh.Band(0).Capacity
	for i := 1; i < sh.Len(); i++ {
		c = min(c, sh.Band(i).Capacity)
	}
	return c
}

// TestDecideLevelsAllocs: deciding over bands allocates nothing.
func TestDecideLevelsAllocs(t *testing.T) {
	sh := policy.Shape{Primary: policy.Limit{Capacity: 5, TokensPerSecond: 5},
		Bands: mustBands(t,
			policy.Band{Name: "hourly", Capacity: 100, Refill: policy.PerHour(100)},
			policy.Band{Name: "daily", Capacity: 1000, Refill: policy.PerDay(1000)},
			policy.Band{Name: "weekly", Capacity: 5000, Refill: policy.PerDay(700)},
		)}
	lv := []policy.Level{{Tokens: 5}, {Tokens: 100}, {Tokens: 1000}, {Tokens: 5000}}
	out := make([]policy.Level, len(lv))
	var sink policy.Outcome
	allocs := testing.AllocsPerRun(100, func() {
		policy.RefillLevels(sh, lv, 1_000_000)
		sink, _ = policy.DecideLevels(sh, lv, 1)
		sink, _ = policy.PeekLevels(sh, lv)
		policy.CutoverLevels(sh, lv, sh, out)
	})
	assert.Zero(t, allocs)
	_ = fmt.Sprint(sink)
}
