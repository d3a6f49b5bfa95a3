package engine_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Charge: a cost taken without a decision, into debt down to each band's
// floor (minus its capacity). The contract's worked examples, the errors,
// and the rules that must hold with debts: waits, eviction, Peek, Refund,
// cutovers, snapshots.

func charge(t testing.TB, e *engine.Engine, key string, tokens int64) engine.Decision {
	t.Helper()
	d, err := e.Charge(t.Context(), key, tokens)
	require.NoError(t, err, "Charge(%q, %d)", key, tokens)
	return d
}

// TestChargeWorkedExampleDebt: capacity 10, 1 per second. Allow 4 leaves 6;
// Charge 12 leaves -6; Allow 1 waits 7 s, and passes at 7 s with 0 left.
func TestChargeWorkedExampleDebt(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
		assert.Equal(t, int64(6), behavAllow(t, e, "k", 4).Remaining)
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: -6, Version: 1, Limit: 10, ResetAfter: 16 * time.Second}, charge(t, e, "k", 12))
		assert.Equal(t, engine.Decision{Remaining: -6, RetryAfter: 7 * time.Second, Version: 1, Limit: 10, ResetAfter: 16 * time.Second}, behavAllow(t, e, "k", 1))
		clk.Set(int64(7*time.Second) - 1)
		require.False(t, behavAllow(t, e, "k", 1).Allowed)
		clk.Set(int64(7 * time.Second))
		d := behavAllow(t, e, "k", 1)
		assert.True(t, d.Allowed)
		assert.Zero(t, d.Remaining)
	})
}

// TestChargeWorkedExampleFloor: a new key charged 25 at capacity 10 stops
// at the floor, -10 (5 forgiven), and then waits 11 s for one token.
func TestChargeWorkedExampleFloor(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: -10, Version: 1, Limit: 10, ResetAfter: 20 * time.Second}, charge(t, e, "new", 25))
		d := behavAllow(t, e, "new", 1)
		assert.False(t, d.Allowed)
		assert.Equal(t, 11*time.Second, d.RetryAfter)
	})
}

// TestChargeWorkedExampleBands: capacity 5 at 5 per second and 20 per day;
// a new key charged 30 leaves the primary at its floor -5 and "daily" at
// -10, which binds; one token then waits for 11 daily tokens, 47,520 s.
func TestChargeWorkedExampleBands(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: dailyPolicy(t, 1), Shards: shards})
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: -10, Version: 1, Limit: 20, ResetAfter: 30 * 4320 * time.Second, Band: "daily"}, charge(t, e, "new", 30))
		d := behavAllow(t, e, "new", 1)
		assert.False(t, d.Allowed)
		assert.Equal(t, "daily", d.Band)
		assert.Equal(t, 47_520*time.Second, d.RetryAfter)
		// The primary band is at its floor: 6 tokens at 5 per second.
		p, err := e.Peek(t.Context(), "new")
		require.NoError(t, err)
		assert.Equal(t, "daily", p.Band)
	})
}

// TestChargeErrors: Allow's errors in Allow's order, less the cost bound;
// an error changes nothing.
func TestChargeErrors(t *testing.T) {
	var zero engine.Engine
	_, err := zero.Charge(context.Background(), "k", 1)
	assert.ErrorIs(t, err, engine.ErrNotInitialized)

	clk := &errsClock{}
	clk.now.Store(errsSetup)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 1, MaxKeys: 1, Clock: clk})
	_, err = e.Charge(t.Context(), " ", 0)
	assert.ErrorIs(t, err, engine.ErrInvalidKey, "the key before the cost")
	_, err = e.Charge(t.Context(), "a", 0)
	assert.ErrorIs(t, err, engine.ErrInvalidCost)
	_, err = e.Charge(nilCtx, "a", 1)
	assert.ErrorIs(t, err, engine.ErrNilContext)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = e.Charge(ctx, "a", 1)
	assert.ErrorIs(t, err, context.Canceled)

	d, err := e.Charge(t.Context(), "a", math.MaxInt64)
	require.NoError(t, err, "a cost above the capacity is charged")
	assert.Equal(t, int64(-10), d.Remaining)
	_, err = e.Charge(t.Context(), "b", 1)
	assert.ErrorIs(t, err, engine.ErrKeyCapacity)
	clk.now.Store(errsEarlier)
	_, err = e.Charge(t.Context(), "a", 1)
	assert.ErrorIs(t, err, engine.ErrClockRegression)
	clk.now.Store(errsSetup)
	p, err := e.Peek(t.Context(), "a")
	require.NoError(t, err)
	assert.Equal(t, int64(-10), p.Remaining, "the errors changed nothing")
	assert.Equal(t, 1, e.KeyCount())

	require.NoError(t, e.Close())
	_, err = e.Charge(t.Context(), "a", 1)
	assert.ErrorIs(t, err, engine.ErrClosed)
}

// TestDebtRules: a key in debt is not evicted until repaid and full; Peek
// reports the debt; Refund repays it, capped at the capacity; a cutover
// keeps it, clamped to a shallower floor, and a change of period rounds it
// toward more debt.
func TestDebtRules(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
		charge(t, e, "k", 14)
		n, err := e.EvictFull(t.Context())
		require.NoError(t, err)
		assert.Zero(t, n, "a bucket in debt is not full")
		clk.Set(int64(time.Second / 2))
		p, err := e.Peek(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, engine.Decision{Remaining: -4, RetryAfter: 4500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 13500 * time.Millisecond}, p)
		r, err := e.Refund(t.Context(), "k", 2)
		require.NoError(t, err)
		assert.Equal(t, int64(-2), r.Remaining, "-3.5 + 2")

		// 1 token per 7 ns: -1.5 + 0 s of refill is -10.5/7, floored to
		// -11/7 tokens: more debt, never less.
		require.NoError(t, e.ReplacePolicy(t.Context(), policy.Policy{Version: 2, Capacity: 10, Refill: policy.Rate{Tokens: 1, Per: 7}}, 1))
		p, err = e.Peek(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, int64(-2), p.Remaining)
		assert.Equal(t, 11*time.Nanosecond+10*7*time.Nanosecond, p.ResetAfter, "11 units of debt and 70 to fill")

		charge(t, e, "k", 100)
		require.NoError(t, e.ReplacePolicy(t.Context(), pol(3, 3, 1), 2))
		p, err = e.Peek(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, int64(-3), p.Remaining, "clamped to the new floor")
		assert.Equal(t, 6*time.Second, p.ResetAfter)
		r, err = e.Refund(t.Context(), "k", math.MaxInt64)
		require.NoError(t, err)
		assert.Equal(t, int64(3), r.Remaining, "capped at the capacity")
		n, err = e.EvictFull(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, n, "repaid and full: evicted")
	})
}

// TestChargeWidest: at capacity math.MaxInt64 a charge takes a band to
// minus that capacity, and the waits and the refill stay exact.
func TestChargeWidest(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		p := policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: math.MaxInt64,
			Bands: bands(t, policy.Band{Name: "slow", Capacity: math.MaxInt64, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}})}
		e, clk := newEngine(t, engine.Config{Policy: p, Shards: shards})
		charge(t, e, "k", math.MaxInt64)
		d := charge(t, e, "k", math.MaxInt64)
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: -math.MaxInt64, Version: 1, Limit: math.MaxInt64, ResetAfter: 2 * time.Second, Band: ""}, d, "both at the floor: the primary binds")
		clk.Set(int64(time.Second))
		d, err := e.Peek(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, "slow", d.Band)
		assert.Equal(t, time.Duration(math.MaxInt64), d.RetryAfter, "saturated")
		assert.Equal(t, int64(-math.MaxInt64), d.Remaining)
	})
}

// TestSnapshotKeepsDebts: a snapshot keeps every band's debt, exactly, and
// Restore brings it back, refilled by the time that passed; a debt deeper
// than the new policy's floor is clamped to it.
func TestSnapshotKeepsDebts(t *testing.T) {
	clk := clock.NewManual(int64(time.Hour))
	perMinute := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(60), Bands: bands(t, daily(20))}
	for _, p := range []policy.Policy{pol(1, 10, 1), dailyPolicy(t, 1), perMinute} {
		e, _ := newEngine(t, engine.Config{Policy: p, Shards: 2, Clock: clk})
		charge(t, e, "a", 3)
		charge(t, e, "b", 14)
		charge(t, e, "c", 1000)
		want := map[string]engine.Decision{}
		for _, k := range []string{"a", "b", "c"} {
			d, err := e.Peek(t.Context(), k)
			require.NoError(t, err)
			want[k] = d
		}
		data := takeSnapshot(t, e)
		require.NoError(t, e.Close())

		r, rep := restored(t, engine.Config{Policy: p, Shards: 3, Clock: clk}, data, engine.RestoreOptions{})
		assert.Equal(t, 3, rep.Restored)
		for k, w := range want {
			d, err := r.Peek(t.Context(), k)
			require.NoError(t, err)
			assert.Equal(t, w, d, "key %q under %+v", k, p)
		}
		n, err := r.EvictFull(t.Context())
		require.NoError(t, err)
		assert.Zero(t, n)

		// Restored into capacity 4: -10 is clamped to -4, -4 kept.
		small := pol(2, 4, 1)
		s, _ := restored(t, engine.Config{Policy: small, Shards: 1, Clock: clk}, data, engine.RestoreOptions{})
		d, err := s.Peek(t.Context(), "c")
		require.NoError(t, err)
		assert.Equal(t, int64(-4), d.Remaining)
		d, err = s.Peek(t.Context(), "b")
		require.NoError(t, err)
		assert.Equal(t, int64(-4), d.Remaining)

		// DropFullest drops the keys in debt last, and says how far the
		// dropped ones were from full.
		_, rep = restored(t, engine.Config{Policy: p, Shards: 1, Clock: clk, MaxKeys: 1}, data, engine.RestoreOptions{DropFullest: true})
		assert.Equal(t, 2, rep.Dropped)
		assert.Equal(t, int64(14), rep.MaxDeficit, "b lacks 14 tokens of a band's capacity")
	}
}

// TestChargeStats: a charge counts as an admitted decision, an error of a
// charge as that error.
func TestChargeStats(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2})
	charge(t, e, "a", 3)
	charge(t, e, "b", 30)
	_, err := e.Charge(t.Context(), "a", 0)
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	require.NoError(t, e.Close()) // the shards publish their counts as they stop
	st := e.Stats()
	assert.Equal(t, uint64(2), st.Total.Allowed)
	assert.Zero(t, st.Total.Denied)
	assert.Equal(t, uint64(1), st.Caller.InvalidCost)
}

// TestChargeAfterElapsedTimeBandsAndLongPeriods: a Charge on a key kept in
// the level store (bands, or a period too long for a compact bucket) after
// time has passed refills it once: the next decision does not refill the
// same interval again.
func TestChargeAfterElapsedTimeBandsAndLongPeriods(t *testing.T) {
	ctx := context.Background()
	daily, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 1000, Refill: policy.PerDay(1000)})
	require.NoError(t, err)
	for name, p := range map[string]policy.Policy{
		"bands":     {Version: 1, Capacity: 10, TokensPerSecond: 2, Bands: daily},
		"perMinute": {Version: 1, Capacity: 10, Refill: policy.Rate{Tokens: 120, Per: time.Minute}},
	} {
		t.Run(name, func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: p, Shards: 1})
			d, err := e.Allow(ctx, "k", 10)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			clk.Set(int64(time.Second)) // 2 tokens refilled in the primary band
			d, err = e.Charge(ctx, "k", 1)
			require.NoError(t, err)
			assert.Equal(t, int64(1), d.Remaining)
			d, err = e.Peek(ctx, "k") // same instant: nothing more to refill
			require.NoError(t, err)
			assert.Equal(t, int64(1), d.Remaining)
			d, err = e.Allow(ctx, "k", 2)
			require.NoError(t, err)
			assert.False(t, d.Allowed, "1 token left, 2 asked")
		})
	}
}
