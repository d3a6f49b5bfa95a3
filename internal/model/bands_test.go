package model_test

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

const sec = int64(time.Second)

func mustBands(t *testing.T, bands ...policy.Band) *policy.BandSet {
	t.Helper()
	s, err := policy.NewBands(bands...)
	require.NoError(t, err)
	return s
}

func mustOverrides(t *testing.T, os ...policy.Override) *policy.OverrideSet {
	t.Helper()
	s, err := policy.NewOverrideSet(os...)
	require.NoError(t, err)
	return s
}

// tokens returns key's band balances as strings ("1/1080"), the primary
// first.
func tokens(t *testing.T, m *model.Model, key string) []string {
	t.Helper()
	b, ok := m.Bucket(key)
	require.True(t, ok, "key %q is tracked", key)
	out := make([]string, len(b.Tokens))
	for i, r := range b.Tokens {
		out[i] = r.RatString()
	}
	return out
}

func allow(t *testing.T, m *model.Model, now int64, key string, cost int64) model.Decision {
	t.Helper()
	d, err := m.Allow(now, key, cost)
	require.NoError(t, err, "Allow(%d, %q, %d)", now, key, cost)
	return d
}

// Capacity 10 at 100 per minute: 10 admitted at t=0, the 11th denied with
// RetryAfter exactly 600 ms.
func TestWorkedExamplePerMinute(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)}, 0, 0)
	for i := range int64(10) {
		d := allow(t, m, 0, "k", 1)
		assert.Equal(t, model.Decision{Allowed: true, Remaining: 9 - i, Version: 1, Limit: 10,
			ResetAfter: time.Duration(i+1) * 600 * time.Millisecond}, d, "request %d", i+1)
	}
	d := allow(t, m, 0, "k", 1)
	assert.Equal(t, model.Decision{Remaining: 0, RetryAfter: 600 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 6 * time.Second}, d)
	d = allow(t, m, 300*ms, "k", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, 300*time.Millisecond, d.RetryAfter, "half a token kept across the denial")
	b, _ := m.Bucket("k")
	assert.Equal(t, int64(30e9), b.Units.Int64(), "half a token is Per/2 units")
	assert.Equal(t, "1/2", b.Tokens[0].RatString())
}

// Capacity 5 at 5/s and a band "daily" of 20 at 20 per day: 5 admitted at
// each of t = 0, 1, 2 and 3 s, then at 4 s the next is denied by "daily",
// with RetryAfter 4320 s less the 4 s of daily refill earned. A cutover
// that raises "daily" to 100 tops nobody up; one that adds a band starts it
// full; one that drops it leaves the primary alone.
func TestWorkedExampleDailyBand(t *testing.T) {
	daily := policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)}
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: mustBands(t, daily)}
	m := model.New(p, 0, 0)
	for s := range int64(4) {
		for i := range int64(5) {
			d := allow(t, m, s*sec, "k", 1)
			require.True(t, d.Allowed, "t=%ds request %d", s, i+1)
			// The primary holds the fewest whole tokens, or ties with
			// daily at t=3 s: the primary either way.
			assert.Equal(t, "", d.Band.String(), "t=%ds request %d", s, i+1)
			assert.Equal(t, 4-i, d.Remaining, "t=%ds request %d", s, i+1)
			assert.Equal(t, int64(5), d.Limit)
			assert.Equal(t, time.Duration(i+1)*200*time.Millisecond, d.ResetAfter)
		}
	}
	assert.Equal(t, []string{"0", "1/1440"}, tokens(t, m, "k"), "3 s of daily refill: 3/4320")

	d := allow(t, m, 4*sec, "k", 1)
	assert.Equal(t, model.Decision{Remaining: 0, RetryAfter: 4316 * time.Second, Version: 1, Limit: 20,
		ResetAfter: 86396 * time.Second, Band: decision.NameOf("daily")}, d)
	assert.Equal(t, []string{"5", "1/1080"}, tokens(t, m, "k"), "a denial takes nothing, and every band refilled to 4 s")

	// Raising daily's capacity tops nobody up.
	raised := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 5,
		Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(20)})}
	require.NoError(t, m.ReplacePolicy(4*sec, raised, 1))
	assert.Equal(t, []string{"5", "1/1080"}, tokens(t, m, "k"))
	d = allow(t, m, 4*sec, "k", 1)
	assert.Equal(t, model.Decision{RetryAfter: 4316 * time.Second, Version: 2, Limit: 100,
		ResetAfter: (5*86400 - 4) * time.Second, Band: decision.NameOf("daily")}, d)

	// Its rate too, in the same period: still no top-up, the wait shorter.
	faster := policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 5,
		Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)})}
	require.NoError(t, m.ReplacePolicy(4*sec, faster, 2))
	assert.Equal(t, []string{"5", "1/1080"}, tokens(t, m, "k"))
	d = allow(t, m, 4*sec, "k", 1)
	assert.Equal(t, 863_200*time.Millisecond, d.RetryAfter, "1079/1080 of a token at 864 s a token")

	// A band new in this version starts full.
	added := policy.Policy{Version: 4, Capacity: 5, TokensPerSecond: 5, Bands: mustBands(t,
		policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)},
		policy.Band{Name: "hourly", Capacity: 3, Refill: policy.PerHour(3)})}
	require.NoError(t, m.ReplacePolicy(4*sec, added, 3))
	assert.Equal(t, []string{"5", "1/1080", "3"}, tokens(t, m, "k"))

	// A band dropped is forgotten; the primary keeps its balance.
	dropped := policy.Policy{Version: 5, Capacity: 5, TokensPerSecond: 5}
	require.NoError(t, m.ReplacePolicy(4*sec, dropped, 4))
	assert.Equal(t, []string{"5"}, tokens(t, m, "k"))
	d = allow(t, m, 4*sec, "k", 5)
	assert.Equal(t, model.Decision{Allowed: true, Version: 5, Limit: 5, ResetAfter: time.Second}, d)

	// And a band that comes back is new again: full.
	require.NoError(t, m.ReplacePolicy(4*sec, policy.Policy{Version: 6, Capacity: 5, TokensPerSecond: 5, Bands: p.Bands}, 5))
	assert.Equal(t, []string{"0", "20"}, tokens(t, m, "k"))
}

// A cutover that changes a band's period moves its balance to the new unit
// rounding down; one that keeps the period, or moves to a period the old
// one divides, loses nothing.
func TestCutoverPeriodRoundsDown(t *testing.T) {
	sevenPer3s := policy.Rate{Tokens: 7, Per: 3 * time.Second}
	m := model.New(policy.Policy{Version: 1, Capacity: 7, Refill: sevenPer3s}, 0, 0)
	allow(t, m, 0, "k", 7)
	allow(t, m, 0, "j", 7)
	b, _ := m.Bucket("k")
	assert.Zero(t, b.Units.Sign())

	// Same period, other rate: 1 ns earned 7 units of 1/3e9, kept whole.
	require.NoError(t, m.ReplacePolicy(1, policy.Policy{Version: 2, Capacity: 7, Refill: policy.Rate{Tokens: 5, Per: 3 * time.Second}}, 1))
	b, _ = m.Bucket("k")
	assert.Equal(t, int64(7), b.Units.Int64())
	assert.Equal(t, "7/3000000000", b.Tokens[0].RatString())

	// To 1 s: floor(7/3e9 x 1e9) = 2 units of 1/1e9; a third of a unit lost.
	require.NoError(t, m.ReplacePolicy(1, policy.Policy{Version: 3, Capacity: 7, TokensPerSecond: 7}, 2))
	b, _ = m.Bucket("k")
	assert.Equal(t, int64(2), b.Units.Int64())
	assert.Equal(t, "1/500000000", b.Tokens[0].RatString())

	// Back to 3 s: 3e9 is a multiple of 1e9, so 2/1e9 is 6 units, exactly.
	require.NoError(t, m.ReplacePolicy(1, policy.Policy{Version: 4, Capacity: 7, Refill: sevenPer3s}, 3))
	b, _ = m.Bucket("k")
	assert.Equal(t, int64(6), b.Units.Int64())

	// Rounding down, then the clamp: a period of 2 ns and capacity 1. Key
	// j went through the same cutovers (6 units of 1/3e9 at 1 ns), then
	// refilled under 7 per 3 s: at 1.5 s it holds 3.5 - 1/3e9 tokens; in
	// halves that is 3 (6 units), then clamped to 1.
	require.NoError(t, m.ReplacePolicy(sec+sec/2, policy.Policy{Version: 5, Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 2}}, 4))
	b, _ = m.Bucket("j")
	assert.Equal(t, "1", b.Tokens[0].RatString())
	assert.Equal(t, int64(2), b.Units.Int64())

	// A band other than the primary converts the same way, matched by name.
	bands := func(per time.Duration) *policy.BandSet {
		return mustBands(t, policy.Band{Name: "b", Capacity: 10, Refill: policy.Rate{Tokens: 1, Per: per}})
	}
	m = model.New(policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1, Bands: bands(3)}, 0, 0)
	allow(t, m, 0, "k", 10)
	// At 2 ns band b holds 2/3; in units of 1/2: floor(4/3) = 1, so 1/2.
	require.NoError(t, m.ReplacePolicy(2, policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1, Bands: bands(2)}, 1))
	assert.Equal(t, "1/2", tokens(t, m, "k")[1])
	d := allow(t, m, 2, "k", 1)
	assert.Equal(t, model.Decision{Remaining: 0, RetryAfter: 1, Version: 2, Limit: 10, ResetAfter: 19, Band: decision.NameOf("b")}, d)
}

// awkwardStep is one request of TestAwkwardRates and its whole answer.
type awkwardStep struct {
	at   int64
	cost int64
	want model.Decision
}

// Awkward rates, exactly: answers computed by hand.
func TestAwkwardRates(t *testing.T) {
	const maxI = math.MaxInt64
	day := 24 * time.Hour
	for _, tc := range []struct {
		name     string
		capacity int64
		rate     policy.Rate
		steps    []awkwardStep
	}{
		{"7 per 3s", 7, policy.Rate{Tokens: 7, Per: 3 * time.Second}, []awkwardStep{
			{0, 7, model.Decision{Allowed: true, Limit: 7, ResetAfter: 3 * time.Second}},
			// A token is 3e9/7 = 428,571,428.57 ns.
			{0, 1, model.Decision{RetryAfter: 428_571_429, Limit: 7, ResetAfter: 3 * time.Second}},
			{428_571_428, 1, model.Decision{RetryAfter: 1, Limit: 7, ResetAfter: 3*time.Second - 428_571_428}},
			// 428,571,429 ns earn 1 + 1/1e9 tokens; the 1/1e9 left needs
			// 3e9 - 3/7 ns to fill 7: rounded up, 3 s.
			{428_571_429, 1, model.Decision{Allowed: true, Limit: 7, ResetAfter: 3 * time.Second}},
			{4 * sec, 7, model.Decision{Allowed: true, Limit: 7, ResetAfter: 3 * time.Second}},
		}},
		{"1 per day", 1, policy.PerDay(1), []awkwardStep{
			{0, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: day}},
			{0, 1, model.Decision{RetryAfter: day, Limit: 1, ResetAfter: day}},
			{int64(day) - 1, 1, model.Decision{RetryAfter: 1, Limit: 1, ResetAfter: 1}},
			{int64(day), 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: day}},
		}},
		{"1 per MaxInt64 ns", 1, policy.Rate{Tokens: 1, Per: maxI}, []awkwardStep{
			{0, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: maxI}},
			{0, 1, model.Decision{RetryAfter: maxI, Limit: 1, ResetAfter: maxI}},
			{maxI - 1, 1, model.Decision{RetryAfter: 1, Limit: 1, ResetAfter: 1}},
			{maxI, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: maxI}},
		}},
		{"1 per MaxInt64 ns at capacity 2", 2, policy.Rate{Tokens: 1, Per: maxI}, []awkwardStep{
			{0, 2, model.Decision{Allowed: true, Limit: 2, ResetAfter: maxI}}, // 2 x MaxInt64 ns, saturated
			{0, 2, model.Decision{RetryAfter: maxI, Limit: 2, ResetAfter: maxI}},
			{maxI, 2, model.Decision{Remaining: 1, RetryAfter: maxI, Limit: 2, ResetAfter: maxI}}, // exactly 1 token
			{maxI, 1, model.Decision{Allowed: true, Limit: 2, ResetAfter: maxI}},
		}},
		{"MaxInt64 per 1 ns", maxI, policy.Rate{Tokens: maxI, Per: 1}, []awkwardStep{
			{0, maxI, model.Decision{Allowed: true, Limit: maxI, ResetAfter: 1}},
			{0, 1, model.Decision{RetryAfter: 1, Limit: maxI, ResetAfter: 1}},
			{1, maxI, model.Decision{Allowed: true, Limit: maxI, ResetAfter: 1}},
			{2, 1, model.Decision{Allowed: true, Remaining: maxI - 1, Limit: maxI, ResetAfter: 1}},
		}},
		{"MaxInt64 per 1 ns at capacity 1", 1, policy.Rate{Tokens: maxI, Per: 1}, []awkwardStep{
			{0, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: 1}},
			{0, 1, model.Decision{RetryAfter: 1, Limit: 1, ResetAfter: 1}},
			{1, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: 1}},
		}},
		{"100 per minute at capacity 1", 1, policy.PerMinute(100), []awkwardStep{
			{0, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: 600 * time.Millisecond}},
			{0, 1, model.Decision{RetryAfter: 600 * time.Millisecond, Limit: 1, ResetAfter: 600 * time.Millisecond}},
			{599_999_999, 1, model.Decision{RetryAfter: 1, Limit: 1, ResetAfter: 1}},
			{600 * ms, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: 600 * time.Millisecond}},
			{10 * sec, 1, model.Decision{Allowed: true, Limit: 1, ResetAfter: 600 * time.Millisecond}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := model.New(policy.Policy{Version: 1, Capacity: tc.capacity, Refill: tc.rate}, 0, 0)
			for i, st := range tc.steps {
				d := allow(t, m, st.at, "k", st.cost)
				want := st.want
				want.Version = 1
				assert.Equal(t, want, d, "step %d: Allow(%d, cost %d)", i, st.at, st.cost)
				checkWhole(t, m)
			}
		})
	}
}

// TokensPerSecond n is Refill PerSecond(n), bit for bit: random requests,
// sweeps and cutovers between the two forms answer alike, and keep the
// same units.
func TestTokensPerSecondIsPerSecond(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 1))
	for run := range 50 {
		capacity, rate := 1+r.Int64N(20), 1+r.Int64N(5)
		if run%10 == 0 {
			capacity, rate = math.MaxInt64-r.Int64N(3), math.MaxInt64-r.Int64N(3)
		}
		a := model.New(policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate}, 0, 0)
		b := model.New(policy.Policy{Version: 1, Capacity: capacity, Refill: policy.PerSecond(rate)}, 0, 0)
		now := int64(0)
		for op := range 200 {
			now += []int64{0, 1, 333_333_333, sec, r.Int64N(5 * sec)}[r.IntN(5)]
			key := fmt.Sprint("k", r.IntN(3))
			switch x := r.IntN(20); {
			case x == 0:
				na, ea := a.EvictFull(now)
				nb, eb := b.EvictFull(now)
				require.Equal(t, na, nb)
				require.Equal(t, ea, eb)
			case x == 1:
				v := a.Policy().Version
				c, n := 1+r.Int64N(20), 1+r.Int64N(5)
				// Each side gets the other form now and then.
				pa := policy.Policy{Version: v + 1, Capacity: c, TokensPerSecond: n}
				pb := policy.Policy{Version: v + 1, Capacity: c, Refill: policy.PerSecond(n)}
				if r.IntN(2) == 0 {
					pa, pb = pb, pa
				}
				require.NoError(t, a.ReplacePolicy(now, pa, v))
				require.NoError(t, b.ReplacePolicy(now, pb, v))
			default:
				cost := 1 + r.Int64N(min(a.Policy().Capacity, 30))
				da, ea := a.Allow(now, key, cost)
				db, eb := b.Allow(now, key, cost)
				require.Equal(t, ea, eb, "run %d op %d", run, op)
				require.Equal(t, da, db, "run %d op %d", run, op)
			}
			for _, k := range a.Keys() {
				ba, _ := a.Bucket(k)
				bb, ok := b.Bucket(k)
				require.True(t, ok)
				require.Equal(t, ba.Units.String(), bb.Units.String())
			}
		}
	}
}

// A decision over bands is atomic: allowed only if every band holds the
// cost, a denial takes nothing from any, a cost above any band's capacity
// is ErrCostExceedsCapacity; the binding band is the longest wait on a
// denial and the fewest whole tokens when allowed, ties to the primary then
// in order.
func TestBandsAtomic(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1,
		Bands: mustBands(t, policy.Band{Name: "b", Capacity: 3, Refill: policy.PerSecond(1)})}
	m := model.New(p, 0, 0)
	_, err := m.Allow(0, "k", 4)
	assert.ErrorIs(t, err, model.ErrCostExceedsCapacity, "within the primary's 10, above b's 3")
	assert.Zero(t, m.KeyCount())
	d := allow(t, m, 0, "k", 3)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 3, ResetAfter: 3 * time.Second, Band: decision.NameOf("b")}, d)
	d = allow(t, m, 0, "k", 1)
	assert.Equal(t, model.Decision{RetryAfter: time.Second, Version: 1, Limit: 3, ResetAfter: 3 * time.Second, Band: decision.NameOf("b")}, d)
	assert.Equal(t, []string{"7", "0"}, tokens(t, m, "k"), "the primary kept its 7")
	d = allow(t, m, 500*ms, "k", 1)
	assert.False(t, d.Allowed)
	assert.Equal(t, []string{"15/2", "1/2"}, tokens(t, m, "k"), "a denial refills every band to now")
	b, _ := m.Bucket("k")
	assert.Equal(t, 500*ms, b.Last)

	ties := policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1, Bands: mustBands(t,
		policy.Band{Name: "b", Capacity: 2, Refill: policy.PerSecond(1)},
		policy.Band{Name: "c", Capacity: 2, Refill: policy.PerSecond(1)})}
	m = model.New(ties, 0, 0)
	assert.Equal(t, "", allow(t, m, 0, "k", 2).Band.String(), "allowed, all tied: the primary")
	assert.Equal(t, "", allow(t, m, 0, "k", 1).Band.String(), "denied, all tied: the primary")
	ties.Capacity = 5
	m = model.New(ties, 0, 0)
	d = allow(t, m, 0, "k", 2)
	assert.Equal(t, "b", d.Band.String(), "b and c tie below the primary: the first")
	assert.Equal(t, int64(2), d.Limit)
	assert.Equal(t, "b", allow(t, m, 0, "k", 1).Band.String())

	// A band other than the primary binds a denial by its wait; the
	// longest wait binds though another band holds fewer tokens.
	slow := policy.Policy{Version: 1, Capacity: 4, TokensPerSecond: 1, Bands: mustBands(t,
		policy.Band{Name: "fast", Capacity: 2, Refill: policy.PerSecond(100)},
		policy.Band{Name: "slow", Capacity: 10, Refill: policy.PerMinute(1)})}
	m = model.New(slow, 0, 0)
	d = allow(t, m, 0, "k", 2)
	assert.Equal(t, model.Decision{Allowed: true, Version: 1, Limit: 2, ResetAfter: 20 * time.Millisecond, Band: decision.NameOf("fast")}, d)
	d = allow(t, m, 0, "k", 2)
	assert.Equal(t, model.Decision{RetryAfter: 20 * time.Millisecond, Version: 1, Limit: 2, ResetAfter: 20 * time.Millisecond, Band: decision.NameOf("fast")}, d)
	d = allow(t, m, 20*ms, "k", 2)
	assert.Equal(t, model.Decision{Allowed: true, Version: 1, Limit: 4, ResetAfter: 3980 * time.Millisecond}, d,
		"the primary (1/50) and fast (0) tie at 0 whole tokens: the primary")
	d = allow(t, m, 20*ms, "k", 2)
	assert.Equal(t, model.Decision{RetryAfter: 1980 * time.Millisecond, Version: 1, Limit: 4, ResetAfter: 3980 * time.Millisecond}, d,
		"the primary waits 1.98 s, fast 20 ms though it holds less")
	assert.Equal(t, []string{"1/50", "0", "18001/3000"}, tokens(t, m, "k"))
	d = allow(t, m, 2*sec, "k", 2)
	assert.True(t, d.Allowed)
	assert.Equal(t, []string{"0", "0", "121/30"}, tokens(t, m, "k"), "slow: 8 - 2 + 2 s at 1/min")
}

// Eviction takes a key only when every band is full.
func TestBandsEvictOnlyAllFull(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1000,
		Bands: mustBands(t, policy.Band{Name: "slow", Capacity: 1, Refill: policy.PerDay(1)})}
	m := model.New(p, 0, 0)
	allow(t, m, 0, "k", 1)
	n, err := m.EvictFull(sec)
	require.NoError(t, err)
	assert.Zero(t, n, "the primary is full, slow is not")
	n, _ = m.EvictFull(int64(24*time.Hour) - 1)
	assert.Zero(t, n)
	n, _ = m.EvictFull(int64(24 * time.Hour))
	assert.Equal(t, 1, n)
}

// An override's limit is its own: its Name names its primary band, and the
// policy's bands do not apply to it. A cutover carries the primary to the
// primary whatever their names, and other bands by name.
func TestBandsAndOverrides(t *testing.T) {
	daily := mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	hourly := mustBands(t, policy.Band{Name: "hourly", Capacity: 2, Refill: policy.PerHour(2)})
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: daily, Overrides: mustOverrides(t,
		policy.Override{Match: "gold", Capacity: 2, Refill: policy.PerMinute(60), Name: "gold"},
		policy.Override{Match: "t*", Capacity: 3, TokensPerSecond: 1, Bands: hourly, Name: "tier"})}
	m := model.New(p, 0, 0)
	assert.Nil(t, model.ShapeOf(p, "gold").Bands)
	assert.Equal(t, policy.Shape{Name: "tier", Primary: policy.Limit{Capacity: 3, TokensPerSecond: 1}, Bands: hourly}, model.ShapeOf(p, "t1"))
	assert.Equal(t, policy.Limit{Capacity: 2, Refill: policy.PerMinute(60)}, model.LimitOf(p, "gold"), "Refill carried")

	d := allow(t, m, 0, "gold", 2)
	assert.Equal(t, model.Decision{Allowed: true, Version: 1, Limit: 2, ResetAfter: 2 * time.Second, Band: decision.NameOf("gold")}, d)
	assert.Equal(t, []string{"0"}, tokens(t, m, "gold"), "no daily band for an override")
	d = allow(t, m, 0, "t1", 2)
	assert.Equal(t, model.Decision{Allowed: true, Version: 1, Limit: 2, ResetAfter: time.Hour, Band: decision.NameOf("hourly")}, d)
	d = allow(t, m, 0, "t1", 1)
	assert.Equal(t, model.Decision{RetryAfter: 30 * time.Minute, Version: 1, Limit: 2, ResetAfter: time.Hour, Band: decision.NameOf("hourly")}, d)
	_, err := m.Allow(0, "t1", 3)
	assert.ErrorIs(t, err, model.ErrCostExceedsCapacity)
	d = allow(t, m, 0, "x", 1)
	assert.Equal(t, "", d.Band.String())
	assert.Equal(t, []string{"4", "19"}, tokens(t, m, "x"))

	// v2: gold falls to the default (its primary carries over, clamped to
	// 5; daily is new to it: full); t* keeps hourly and takes daily, new;
	// x gets an override with a band named "daily", which takes over x's.
	p2 := policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 5, Bands: daily, Overrides: mustOverrides(t,
		policy.Override{Match: "t*", Capacity: 1, TokensPerSecond: 1, Name: "tier",
			Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 7, Refill: policy.PerDay(7)}, policy.Band{Name: "hourly", Capacity: 2, Refill: policy.PerHour(2)})},
		policy.Override{Match: "x", Capacity: 50, TokensPerSecond: 5, Name: "ex",
			Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 30, Refill: policy.PerDay(20)})})}
	require.NoError(t, m.ReplacePolicy(sec, p2, 1))
	assert.Equal(t, []string{"1", "20"}, tokens(t, m, "gold"), "1 s at 60/min: 1 token, then the default's full daily")
	assert.Equal(t, []string{"1", "7", "1/1800"}, tokens(t, m, "t1"), "primary 0+1 (cap 1), daily new, hourly 1 s of 2/h")
	assert.Equal(t, []string{"5", "82081/4320"}, tokens(t, m, "x"), "primary refilled to 5 under the old cap, daily 19 + 1/4320 carried")
	d = allow(t, m, sec, "x", 1)
	assert.Equal(t, "ex", d.Band.String())
}

// The model's invariants hold over random histories of awkward rates and
// bands: every band's balance is a multiple of 1/Per tokens of its current
// rate, within [0, capacity], and Bucket's Units is the primary's Tokens x
// Per.
func TestBandsInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 2))
	rates := []policy.Rate{{Tokens: 7, Per: 3 * time.Second}, policy.PerDay(1), {Tokens: 1, Per: math.MaxInt64},
		{Tokens: math.MaxInt64, Per: 1}, policy.PerMinute(100), policy.PerSecond(3), {Tokens: 2, Per: 3}}
	caps := []int64{1, 2, 7, 100, math.MaxInt64}
	names := []string{"a", "b", "c"}
	draw := func(v int64) policy.Policy {
		p := policy.Policy{Version: v, Capacity: caps[r.IntN(len(caps))], Refill: rates[r.IntN(len(rates))]}
		var bs []policy.Band
		for _, i := range r.Perm(len(names))[:r.IntN(len(names)+1)] {
			bs = append(bs, policy.Band{Name: names[i], Capacity: caps[r.IntN(len(caps))], Refill: rates[r.IntN(len(rates))]})
		}
		p.Bands = mustBands(t, bs...)
		return p
	}
	for range 30 {
		m := model.New(draw(1), 0, 0)
		now := int64(0)
		for range 300 {
			if now < 1<<62 {
				now += []int64{0, 1, 7, 428_571_429, sec, r.Int64N(100 * sec)}[r.IntN(6)]
			}
			switch r.IntN(10) {
			case 0:
				_, err := m.EvictFull(now)
				require.NoError(t, err)
			case 1:
				v := m.Policy().Version
				require.NoError(t, m.ReplacePolicy(now, draw(v+1), v))
			default:
				_, _ = m.Allow(now, fmt.Sprint("k", r.IntN(3)), 1+r.Int64N(3))
			}
			checkWhole(t, m)
		}
	}
}

// checkWhole checks every tracked bucket's invariants under the policy in
// force.
func checkWhole(t *testing.T, m *model.Model) {
	t.Helper()
	for _, k := range m.Keys() {
		b, _ := m.Bucket(k)
		sh := model.ShapeOf(m.Policy(), k)
		require.Len(t, b.Tokens, sh.Len(), "key %q", k)
		for i, tok := range b.Tokens {
			l := sh.Band(i)
			per := big.NewRat(int64(l.Rate().Per), 1)
			require.True(t, new(big.Rat).Mul(tok, per).IsInt(), "key %q band %d: %s is not a multiple of 1/%v", k, i, tok.RatString(), l.Rate().Per)
			require.True(t, tok.Sign() >= 0 && tok.Cmp(big.NewRat(l.Capacity, 1)) <= 0, "key %q band %d: %s outside [0, %d]", k, i, tok.RatString(), l.Capacity)
			if i == 0 {
				require.Zero(t, new(big.Rat).Mul(tok, per).Cmp(new(big.Rat).SetInt(b.Units)), "key %q: Units", k)
			}
		}
	}
}
