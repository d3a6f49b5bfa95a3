package model_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

func reqs(kv ...any) []model.Request {
	var out []model.Request
	for i := 0; i < len(kv); i += 2 {
		out = append(out, model.Request{Key: kv[i].(string), Cost: int64(kv[i+1].(int))})
	}
	return out
}

// Capacity 10 at 2/s, worked by hand. An admitted call takes every summed
// cost and names the key left with the fewest whole tokens; a refused one
// takes nothing, creates nothing, and names the key that waits longest;
// ties go to the first request.
func TestAllowAllWorkedExample(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}, 0, 0)
	allow(t, m, 0, "a", 6) // a holds 4

	// b's two requests add up to 4, leaving 6; a keeps 2 of its 4.
	d, at, err := m.AllowAll(0, reqs("b", 3, "a", 2, "b", 1))
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 10, ResetAfter: 4 * time.Second}, d)
	assert.Equal(t, 1, at, "a has the fewest tokens left")
	assert.Equal(t, []string{"2"}, tokens(t, m, "a"))
	assert.Equal(t, []string{"6"}, tokens(t, m, "b"))

	// 1 left each: a tie, the first request binds.
	d, at, err = m.AllowAll(0, reqs("a", 1, "b", 5))
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 1, Version: 1, Limit: 10, ResetAfter: 4500 * time.Millisecond}, d)
	assert.Equal(t, 0, at)

	// At 250 ms a and b hold 1.5 each. a cannot pay 2 (250 ms short), b
	// could pay 1 and c, new, anything: refused, as a alone would be.
	d, at, err = m.AllowAll(250*ms, reqs("b", 1, "a", 2, "c", 1))
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Remaining: 1, RetryAfter: 250 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 4250 * time.Millisecond}, d)
	assert.Equal(t, 1, at)
	assert.Equal(t, []string{"1"}, tokens(t, m, "b"), "nothing taken from b")
	_, tracked := m.Bucket("c")
	assert.False(t, tracked, "a refused call creates no key")
	assert.Equal(t, 2, m.KeyCount())
	assert.True(t, allow(t, m, 250*ms, "b", 1).Allowed, "b's token is still there")

	// Now b holds 0.5 and a 1.5. The longest wait binds: b, 2.5 short of
	// 3, waits 1.25 s, a, 1.5 short, 0.75 s.
	d, at, err = m.AllowAll(250*ms, reqs("a", 3, "b", 3))
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Remaining: 0, RetryAfter: 1250 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 4750 * time.Millisecond}, d)
	assert.Equal(t, 1, at)
	// Each 0.5 short, of 1 and of 2: equal waits, the first request binds.
	for _, tc := range []struct {
		reqs []model.Request
		rem  int64
	}{{reqs("b", 1, "a", 2), 0}, {reqs("a", 2, "b", 1), 1}} {
		d, at, err = m.AllowAll(250*ms, tc.reqs)
		require.NoError(t, err)
		assert.False(t, d.Allowed)
		assert.Equal(t, 0, at, "%v", tc.reqs)
		assert.Equal(t, 250*time.Millisecond, d.RetryAfter)
		assert.Equal(t, tc.rem, d.Remaining, "%v: the first key's own answer", tc.reqs)
	}
}

// An AllowAll's Decision is the binding key's Allow answer for its summed
// cost, Band and all: here the daily band of 3 binds the sum of 2 and 1.
func TestAllowAllBands(t *testing.T) {
	daily := policy.Band{Name: "daily", Capacity: 3, Refill: policy.PerDay(3)}
	p := policy.Policy{Version: 7, Capacity: 5, TokensPerSecond: 5, Bands: mustBands(t, daily)}
	m := model.New(p, 0, 0)
	d, at, err := m.AllowAll(0, reqs("j", 1, "k", 2, "k", 1))
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 0, Version: 7, Limit: 3, ResetAfter: 24 * time.Hour, Band: decision.NameOf("daily")}, d)
	assert.Equal(t, 1, at)
	assert.Equal(t, []string{"2", "0"}, tokens(t, m, "k"))
	assert.Equal(t, []string{"4", "2"}, tokens(t, m, "j"))

	// At 1 s the primary is full again, daily holds 1/28800: k's 1 is
	// refused by daily, 28800 s less the second earned.
	d, at, err = m.AllowAll(sec, reqs("j", 1, "k", 1))
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Remaining: 0, RetryAfter: 28799 * time.Second, Version: 7, Limit: 3,
		ResetAfter: (86400 - 1) * time.Second, Band: decision.NameOf("daily")}, d)
	assert.Equal(t, 1, at)
	assert.Equal(t, []string{"4", "2"}, tokens(t, m, "j"), "refused: j keeps its tokens")
}

// The errors come in the engine's order, with the index of the request at
// fault, and change nothing.
func TestAllowAllErrors(t *testing.T) {
	over := mustOverrides(t, policy.Override{Match: "small", Capacity: 2, TokensPerSecond: 1})
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: over}, 4, 5)
	allow(t, m, 100, "a", 1)
	allow(t, m, 100, "b", 1)
	before := m.Clone()

	too := make([]model.Request, model.MaxAllowAll+1)
	for i := range too {
		too[i] = model.Request{Key: "a", Cost: 1}
	}
	for _, tc := range []struct {
		name string
		now  int64
		reqs []model.Request
		want error
		at   int
	}{
		{"none", 100, nil, model.ErrAllowAllSize, -1},
		{"one too many", 100, too, model.ErrAllowAllSize, -1},
		{"a bad key before a bad cost", 100, reqs("a", 0, " ", 1, "toolong", 1), model.ErrInvalidKey, 1},
		{"the first bad cost", 100, reqs("a", 1, "b", 0, "c", -1), model.ErrInvalidCost, 1},
		{"a sum above capacity, at the key's first request", 100, reqs("b", 1, "a", 6, "small", 2, "a", 5), model.ErrCostExceedsCapacity, 1},
		{"the first key above its own capacity", 100, reqs("b", 1, "small", 3, "a", 11), model.ErrCostExceedsCapacity, 1},
		{"a sum past math.MaxInt64", 100, []model.Request{{"a", math.MaxInt64}, {"a", 1}}, model.ErrCostExceedsCapacity, 0},
		{"capacity before the clock", 99, reqs("a", 1, "b", 11), model.ErrCostExceedsCapacity, 1},
		{"the clock before the key bound", 99, reqs("a", 1, "n1", 1, "n2", 1, "n3", 1), model.ErrClockRegression, 0},
		// Room for 2 new keys: n1 and n2 fit, n3 is the first past it.
		{"the first new key past the bound", 100, reqs("a", 1, "n1", 1, "n2", 1, "n1", 1, "b", 1, "n3", 1, "n4", 1), model.ErrKeyCapacity, 5},
	} {
		d, at, err := m.AllowAll(tc.now, tc.reqs)
		assert.Equal(t, tc.want, err, tc.name)
		assert.Equal(t, tc.at, at, tc.name)
		assert.Zero(t, d, tc.name)
	}
	assert.ElementsMatch(t, before.Keys(), m.Keys(), "errors change nothing")
	for _, k := range []string{"a", "b"} {
		assert.Equal(t, tokens(t, before, k), tokens(t, m, k), k)
	}
	// Nor did they observe a reading: 100 is still the latest.
	_, err := m.Allow(100, "a", 1)
	require.NoError(t, err)

	// With room for both, the same call is admitted and creates n1 and n2.
	d, at, err := m.AllowAll(100, reqs("a", 1, "n1", 1, "n2", 10, "n1", 1))
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, 2, at, "n2 spent all 10")
	assert.Equal(t, 4, m.KeyCount())
	_, _, err = m.AllowAll(100, reqs("n3", 1))
	assert.Equal(t, model.ErrKeyCapacity, err)

	// A refused call observes its reading too.
	_, _, err = m.AllowAll(200, reqs("a", 10))
	require.NoError(t, err)
	_, err = m.Allow(199, "a", 1)
	assert.Equal(t, model.ErrClockRegression, err)
}

// An AllowAll is the Allows of its keys' summed costs when every one is
// admitted, and takes nothing otherwise; a call of one request is Allow
// itself.
func TestAllowAllAgreesWithAllow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := policy.Policy{Version: 1, Capacity: 6, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second},
		Bands: mustBands(t, policy.Band{Name: "b", Capacity: 4, Refill: policy.PerSecond(1)})}
	keys := []string{"a", "b", "c", "d"}
	m := model.New(p, 0, 0)
	now := int64(0)
	admitted, refused := 0, 0
	for range 2000 {
		now += []int64{0, 0, 1, 1e8, 333_333_333, 1e9}[rng.IntN(6)]
		var rs []model.Request
		sums := map[string]int64{}
		var order []string
		for range 1 + rng.IntN(5) {
			k := keys[rng.IntN(len(keys))]
			c := 1 + rng.Int64N(2)
			rs = append(rs, model.Request{Key: k, Cost: c})
			if _, ok := sums[k]; !ok {
				order = append(order, k)
			}
			sums[k] += c
		}
		pre, ref := m.Clone(), m.Clone()
		all := true
		ds := map[string]model.Decision{}
		var refErr error
		for _, k := range order {
			d, err := ref.Allow(now, k, sums[k])
			if err != nil {
				refErr = err
				break
			}
			ds[k], all = d, all && d.Allowed
		}
		d, at, err := m.AllowAll(now, rs)
		if refErr != nil {
			assert.Equal(t, refErr, err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, all, d.Allowed)
		want := ds[rs[at].Key]
		want.Allowed = all
		require.Equal(t, want, d, "the binding key's own answer")
		if all {
			admitted++
			for _, k := range keys {
				rb, rok := ref.Bucket(k)
				mb, mok := m.Bucket(k)
				require.Equal(t, rok, mok, k)
				if rok {
					require.Equal(t, rb.Units.String(), mb.Units.String(), k)
					require.Equal(t, tokens(t, ref, k), tokens(t, m, k), k)
				}
			}
			for i, r := range rs {
				dk := ds[r.Key]
				best := ds[rs[at].Key]
				require.GreaterOrEqual(t, dk.Remaining, best.Remaining, "request %d has fewer tokens left than the binding one", i)
				if i < at {
					require.Greater(t, dk.Remaining, best.Remaining, "an earlier request ties with the binding one")
				}
			}
		} else {
			refused++
			for i, r := range rs {
				dk := ds[r.Key]
				best := ds[rs[at].Key]
				require.LessOrEqual(t, dk.RetryAfter, best.RetryAfter, "request %d waits longer than the binding one", i)
				if i < at {
					require.Less(t, dk.RetryAfter, best.RetryAfter, "an earlier request ties with the binding one")
				}
			}
			require.ElementsMatch(t, pre.Keys(), m.Keys(), "a refused call creates nothing")
			for _, k := range pre.Keys() {
				require.Equal(t, tokens(t, pre, k), tokens(t, m, k), "a refused call takes nothing from %s", k)
			}
		}
	}
	assert.Positive(t, admitted)
	assert.Positive(t, refused)
	t.Logf("%d admitted, %d refused", admitted, refused)
}

// Peek answers a request of one token and changes nothing; Refund credits
// exactly, capped at capacity, keeps the fraction, and never creates a key.
func TestPeekRefund(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}, 0, 0)
	d, err := m.Peek(0, "k")
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d, "an untracked key is full")
	assert.Zero(t, m.KeyCount(), "Peek creates nothing")
	allow(t, m, 0, "k", 10)

	d, err = m.Peek(250*ms, "k")
	require.NoError(t, err)
	assert.Equal(t, model.Decision{RetryAfter: 250 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 4750 * time.Millisecond}, d)
	assert.Equal(t, []string{"0"}, tokens(t, m, "k"), "Peek takes and stores nothing")

	d, err = m.Refund(250*ms, "k", 3)
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 3, Version: 1, Limit: 10, ResetAfter: 3250 * time.Millisecond}, d)
	assert.Equal(t, []string{"7/2"}, tokens(t, m, "k"), "the half token refilled is kept")
	d, err = m.Refund(250*ms, "k", math.MaxInt64)
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d, "capped")

	d, err = m.Refund(250*ms, "j", 1)
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 10, Version: 1, Limit: 10}, d)
	assert.Equal(t, 1, m.KeyCount(), "Refund never creates a key")

	_, err = m.Refund(0, " ", 1)
	assert.Equal(t, model.ErrInvalidKey, err)
	_, err = m.Refund(0, "k", 0)
	assert.Equal(t, model.ErrInvalidCost, err)
	_, err = m.Refund(0, "k", 1)
	assert.Equal(t, model.ErrClockRegression, err)
	_, err = m.Peek(0, "k")
	assert.Equal(t, model.ErrClockRegression, err)
	_, err = m.Peek(0, "")
	assert.Equal(t, model.ErrInvalidKey, err)

	// Peek and a Refund of an untracked key observe no reading; a Refund of
	// a tracked key does.
	_, _ = m.Peek(sec, "k")
	_, _ = m.Refund(sec, "j", 1)
	_, err = m.Allow(500*ms, "k", 1)
	require.NoError(t, err)
	_, err = m.Refund(sec, "k", 1)
	require.NoError(t, err)
	_, err = m.Allow(500*ms, "k", 1)
	assert.Equal(t, model.ErrClockRegression, err)

	// Every band is credited; the answer names the binding band.
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: mustBands(t, policy.Band{Name: "b", Capacity: 2, Refill: policy.PerSecond(1)})}
	bm := model.New(p, 0, 0)
	allow(t, bm, 0, "k", 2)
	d, err = bm.Refund(0, "k", 1)
	require.NoError(t, err)
	assert.Equal(t, model.Decision{Allowed: true, Remaining: 1, Version: 1, Limit: 2, ResetAfter: time.Second, Band: decision.NameOf("b")}, d)
	assert.Equal(t, []string{"4", "1"}, tokens(t, bm, "k"))
}

// EvictIfFull is one key's EvictFull.
func TestEvictIfFull(t *testing.T) {
	m := model.New(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}, 0, 0)
	allow(t, m, 0, "k", 1)
	allow(t, m, 0, "j", 1)
	ok, err := m.EvictIfFull(0, "k")
	require.NoError(t, err)
	assert.False(t, ok, "not full")
	ok, err = m.EvictIfFull(500*ms, "k")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []string{"j"}, m.Keys(), "only k")
	ok, err = m.EvictIfFull(500*ms, "k")
	require.NoError(t, err)
	assert.False(t, ok, "no longer tracked")
	_, err = m.EvictIfFull(0, "j")
	assert.Equal(t, model.ErrClockRegression, err)
}
