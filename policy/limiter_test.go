package policy_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// never is the RetryAfter of a cost that can never be admitted.
const never = maxInt64

// More named instants, for the window tables.
const (
	t1s      = int64(time.Second)
	t1250ms  = int64(1250 * time.Millisecond)
	t1500ms  = int64(1500 * time.Millisecond)
	t2250ms  = int64(2250 * time.Millisecond)
	t2900ms  = int64(2900 * time.Millisecond)
	t3s      = int64(3 * time.Second)
	tJustOut = t1s - 1 // the last instant of the first 1 s window
)

// acquire is one TryAcquire call in a step table and what it must answer.
type acquire struct {
	at, cost int64
	want     policy.Outcome
}

// runAcquires plays steps against l, in order, checking every answer.
func runAcquires(t *testing.T, l policy.Limiter, steps []acquire) {
	t.Helper()
	for i, s := range steps {
		got := l.TryAcquire(s.at, s.cost)
		require.Equal(t, s.want, got, "step %d: TryAcquire(at=%d, cost=%d)", i, s.at, s.cost)
	}
}

// boundaryLimiters returns three limiters of capacity 10: a
// 1 s fixed window, a token bucket refilled at 10/s and started full at 0,
// and a 1 s sliding log.
func boundaryLimiters(t *testing.T) map[string]policy.Limiter {
	t.Helper()
	fw, err := policy.NewFixedWindow(10, time.Second)
	require.NoError(t, err)
	tb, err := policy.NewTokenBucket(policy.Limit{Capacity: 10, TokensPerSecond: 10}, t0)
	require.NoError(t, err)
	sl, err := policy.NewSlidingLog(10, time.Second)
	require.NoError(t, err)
	return map[string]policy.Limiter{"FixedWindow": fw, "TokenBucket": tb, "SlidingLog": sl}
}

// TestLimitersAtWindowBoundary is the window-boundary case: 10 requests of
// cost 1 at 999,999,999 ns and 10 at 1 s. The fixed window starts a fresh
// count at 1 s and admits all 20, twice its capacity within 1 ns; the
// token bucket has refilled 1e-8 of a token by then, and the sliding log
// still sees the first 10, so each admits 10.
func TestLimitersAtWindowBoundary(t *testing.T) {
	want := map[string][2]int{"FixedWindow": {10, 10}, "TokenBucket": {10, 0}, "SlidingLog": {10, 0}}
	for name, l := range boundaryLimiters(t) {
		var got [2]int
		for i, at := range []int64{tJustOut, t1s} {
			for range 10 {
				if l.TryAcquire(at, 1).Allowed {
					got[i]++
				}
			}
		}
		assert.Equal(t, want[name], got, "%s: admitted at 999,999,999 ns and at 1 s", name)
	}
}

func TestTokenBucketSteps(t *testing.T) {
	l := policy.Limit{Capacity: 10, TokensPerSecond: 2}
	fullIn := int64(5 * time.Second) // 10 tokens at 2/s
	tb, err := policy.NewTokenBucket(l, t0)
	require.NoError(t, err)
	runAcquires(t, tb, []acquire{
		{t0, 10, allowed(0, fullIn)},
		{t0, 1, denied(0, t500ms, fullIn)},
		{t250ms, 1, denied(0, t250ms, fullIn-t250ms)},
		// Bad costs: never, and nothing taken; the half token refilled stays.
		{t250ms, 0, denied(0, never, fullIn-t250ms)},
		{t250ms, -1, denied(0, never, fullIn-t250ms)},
		{t250ms, math.MinInt64, denied(0, never, fullIn-t250ms)},
		{t250ms, 11, denied(0, never, fullIn-t250ms)},
		{t250ms, maxInt64, denied(0, never, fullIn-t250ms)},
		// The clock steps back: the answer is the one at 250 ms.
		{t1ns, 1, denied(0, t250ms, fullIn-t250ms)},
		{t500ms, 1, allowed(0, fullIn)},
		{t0, 1, denied(0, t500ms, fullIn)}, // at 500 ms again
		{int64(10 * time.Second), -3, denied(10, never, 0)},
		{int64(10 * time.Second), 10, allowed(0, fullIn)},
	})

	t.Run("made at 1 s", func(t *testing.T) {
		tb, err := policy.NewTokenBucket(l, t1s)
		require.NoError(t, err)
		runAcquires(t, tb, []acquire{
			{-1, 1, allowed(9, t500ms)}, // before the first reading: at 1 s
			{t0, 9, allowed(0, fullIn)},
			{t1500ms, 1, allowed(0, fullIn)},
		})
	})
}

func TestFixedWindowSteps(t *testing.T) {
	fw, err := policy.NewFixedWindow(3, time.Second)
	require.NoError(t, err)
	runAcquires(t, fw, []acquire{
		{t0, 1, allowed(2, t1s)},
		{t250ms, 2, allowed(0, t1s-t250ms)},
		{t500ms, 1, denied(0, t500ms, t500ms)},
		{tJustOut, 1, denied(0, 1, 1)},
		{t1s, 3, allowed(0, t1s)}, // a new window: 6 in 750 ms
		// Bad costs: never, and nothing counted.
		{t1500ms, 0, denied(0, never, t500ms)},
		{t1500ms, -1, denied(0, never, t500ms)},
		{t1500ms, math.MinInt64, denied(0, never, t500ms)},
		{t1500ms, 4, denied(0, never, t500ms)},
		{t1500ms, maxInt64, denied(0, never, t500ms)},
		{t2900ms, 1, allowed(2, t3s-t2900ms)},
		// The clock steps back into the full window [1 s, 2 s): the answer
		// is the one at 2.9 s.
		{t1500ms, 1, allowed(1, t3s-t2900ms)},
		{t3s, 3, allowed(0, t1s)},
		{-5, 1, denied(0, t1s, t1s)}, // at 3 s again
		// Nothing counted: ResetAfter is 0 and a bad cost still never fits.
		{int64(10*time.Second) + 1, 0, denied(3, never, 0)},
		{int64(10*time.Second) + 1, 3, allowed(0, t1s-1)},
	})

	t.Run("first reading negative", func(t *testing.T) {
		fw, err := policy.NewFixedWindow(2, time.Second)
		require.NoError(t, err)
		runAcquires(t, fw, []acquire{
			{-1, 1, allowed(1, t1s)}, // taken as 0, not as the window [-1 s, 0)
			{t0, 1, allowed(0, t1s)},
			{math.MinInt64, 1, denied(0, t1s, t1s)},
		})
	})
}

func TestSlidingLogSteps(t *testing.T) {
	sl, err := policy.NewSlidingLog(3, time.Second)
	require.NoError(t, err)
	runAcquires(t, sl, []acquire{
		{t0, 1, allowed(2, t1s)},
		{t250ms, 1, allowed(1, t1s)},
		{t250ms, 1, allowed(0, t1s)},
		// 2 must leave for cost 2 to fit: those at 0 and at 250 ms, and
		// the latter leave at 1.25 s.
		{t500ms, 2, denied(0, t1250ms-t500ms, t1250ms-t500ms)},
		// 1 must leave for cost 1: the one at 0, which leaves at 1 s.
		{t500ms, 1, denied(0, t1s-t500ms, t1250ms-t500ms)},
		{tJustOut, 1, denied(0, 1, t1250ms-tJustOut)},
		{t1s, 1, allowed(0, t1s)}, // the one at 0 has left: (0, 1 s] holds 2
		{t1250ms, 2, allowed(0, t1s)},
		// Bad costs: never, and nothing logged.
		{t1250ms, 0, denied(0, never, t1s)},
		{t1250ms, -1, denied(0, never, t1s)},
		{t1250ms, math.MinInt64, denied(0, never, t1s)},
		{t1250ms, 4, denied(0, never, t1s)},
		{t1250ms, maxInt64, denied(0, never, t1s)},
		// The clock steps back before everything logged: the answer is the
		// one at 1.25 s, when the one at 1 s leaves first, at 2 s.
		{t0, 1, denied(0, t1s-t250ms, t1s)},
		{t2250ms, 3, allowed(0, t1s)}, // everything logged up to 1.25 s has left
		{int64(5 * time.Second), 0, denied(3, never, 0)},
	})

	t.Run("first reading negative", func(t *testing.T) {
		sl, err := policy.NewSlidingLog(2, time.Second)
		require.NoError(t, err)
		runAcquires(t, sl, []acquire{
			{-1, 1, allowed(1, t1s)}, // taken as 0
			{t1s - 2, 1, allowed(0, t1s)},
			{math.MinInt64, 1, denied(0, 2, t1s)}, // taken as 1 s - 2: the entry at 0 leaves at 1 s
		})
	})
}

// TestLimitersAtExtremes runs the three at the ends of int64: the largest
// capacities, costs, windows and readings, and running totals that wrap.
func TestLimitersAtExtremes(t *testing.T) {
	t.Run("FixedWindow/window=max", func(t *testing.T) {
		fw, err := policy.NewFixedWindow(maxInt64, maxInt64)
		require.NoError(t, err)
		runAcquires(t, fw, []acquire{
			{tMax - 1, maxInt64, allowed(0, 1)},  // the window [0, max)
			{tMax - 1, 1, denied(0, 1, 1)},       //
			{tMax, 1, allowed(maxInt64-1, tMax)}, // [max, 2*max), never over
			{tMax, maxInt64 - 1, allowed(0, tMax)},
			{tMax, 1, denied(0, tMax, tMax)},
		})
	})
	t.Run("FixedWindow/last window partial", func(t *testing.T) {
		const window = 3
		start := tMax - tMax%window // the last window starts here, past max at its end
		fw, err := policy.NewFixedWindow(1, window)
		require.NoError(t, err)
		runAcquires(t, fw, []acquire{
			{start - 1, 1, allowed(0, 1)},
			{tMax, 1, allowed(0, window-(tMax-start))},
			{tMax, 1, denied(0, window-(tMax-start), window-(tMax-start))},
		})
	})
	t.Run("SlidingLog/window=max", func(t *testing.T) {
		sl, err := policy.NewSlidingLog(maxInt64, maxInt64)
		require.NoError(t, err)
		runAcquires(t, sl, []acquire{
			{t0, maxInt64, allowed(0, tMax)},
			{tMax - 1, 1, denied(0, 1, 1)},
			{tMax, maxInt64 - 1, allowed(1, tMax)}, // the admission at 0 left at max
			{tMax, 2, denied(1, tMax, tMax)},       // leaves at 2*max: never reached
			{tMax, 1, allowed(0, tMax)},
		})
	})
	t.Run("SlidingLog/totals wrap", func(t *testing.T) {
		sl, err := policy.NewSlidingLog(maxInt64, 2)
		require.NoError(t, err)
		var steps []acquire
		for k := range int64(8) { // 8 * max admitted: the running totals wrap 4 times
			steps = append(steps,
				acquire{3 * k, maxInt64 - 1, allowed(1, 2)}, // what 3k-3 and 3k-2 admitted has left
				acquire{3*k + 1, 2, denied(1, 1, 1)},
				acquire{3*k + 1, 1, allowed(0, 2)},
			)
		}
		runAcquires(t, sl, steps)
	})
	t.Run("TokenBucket/max", func(t *testing.T) {
		tb, err := policy.NewTokenBucket(policy.Limit{Capacity: maxInt64, TokensPerSecond: 1}, tMax-1)
		require.NoError(t, err)
		runAcquires(t, tb, []acquire{
			{tMax, maxInt64, allowed(0, maxInt64)}, // max*1e9 ns to refill saturates
			{tMax, 1, denied(0, int64(time.Second), maxInt64)},
			{t0, 1, denied(0, int64(time.Second), maxInt64)},
		})
	})
}

func TestLimiterConstructors(t *testing.T) {
	fields := []string{"capacity", "tokens per second", "window", "now"}
	requireNames := func(t *testing.T, err error, field string, msgAndArgs ...any) {
		t.Helper()
		require.ErrorIs(t, err, policy.ErrInvalid, msgAndArgs...)
		require.Contains(t, err.Error(), field, msgAndArgs...)
		for _, other := range fields {
			if other != field {
				require.NotContains(t, err.Error(), other, msgAndArgs...)
			}
		}
	}
	bad := []int64{0, -1, math.MinInt64}

	for _, v := range bad {
		tb, err := policy.NewTokenBucket(policy.Limit{Capacity: v, TokensPerSecond: 1}, t0)
		require.Nil(t, tb)
		requireNames(t, err, "capacity", "NewTokenBucket capacity %d", v)
		tb, err = policy.NewTokenBucket(policy.Limit{Capacity: 1, TokensPerSecond: v}, t0)
		require.Nil(t, tb)
		requireNames(t, err, "tokens per second", "NewTokenBucket rate %d", v)
		if v < 0 {
			tb, err = policy.NewTokenBucket(policy.Limit{Capacity: 1, TokensPerSecond: 1}, v)
			require.Nil(t, tb)
			requireNames(t, err, "now", "NewTokenBucket now %d", v)
		}

		for name, newLimiter := range map[string]func(int64, time.Duration) (policy.Limiter, error){
			"NewFixedWindow": func(c int64, w time.Duration) (policy.Limiter, error) { return policy.NewFixedWindow(c, w) },
			"NewSlidingLog":  func(c int64, w time.Duration) (policy.Limiter, error) { return policy.NewSlidingLog(c, w) },
		} {
			_, err := newLimiter(v, time.Second)
			requireNames(t, err, "capacity", "%s capacity %d", name, v)
			_, err = newLimiter(1, time.Duration(v))
			requireNames(t, err, "window", "%s window %d", name, v)
			_, err = newLimiter(v, time.Duration(v)) // both bad: capacity is named
			requireNames(t, err, "capacity", "%s capacity and window %d", name, v)
		}
	}

	// The smallest and largest legal arguments.
	for _, l := range []policy.Limit{{Capacity: 1, TokensPerSecond: 1}, {Capacity: maxInt64, TokensPerSecond: maxInt64}} {
		for _, now := range []int64{t0, tMax} {
			_, err := policy.NewTokenBucket(l, now)
			require.NoError(t, err, "%+v at %d", l, now)
		}
	}
	for _, c := range []int64{1, maxInt64} {
		for _, w := range []time.Duration{1, maxInt64} {
			_, err := policy.NewFixedWindow(c, w)
			require.NoError(t, err)
			_, err = policy.NewSlidingLog(c, w)
			require.NoError(t, err)
		}
	}
}

// TestLimiterZeroValues: a zero limiter has capacity 0, so it admits
// nothing, and it does not panic either.
func TestLimiterZeroValues(t *testing.T) {
	for name, l := range map[string]policy.Limiter{
		"TokenBucket": &policy.TokenBucket{},
		"FixedWindow": &policy.FixedWindow{},
		"SlidingLog":  &policy.SlidingLog{},
	} {
		for _, at := range []int64{math.MinInt64, -1, t0, t1s, tMax, t0} {
			for _, cost := range []int64{math.MinInt64, 0, 1, maxInt64} {
				require.Equal(t, denied(0, never, 0), l.TryAcquire(at, cost), "%s at %d cost %d", name, at, cost)
			}
		}
	}
}

// TestLimiterAllocs: TokenBucket and FixedWindow never allocate; a
// SlidingLog whose log has stopped growing does not either.
func TestLimiterAllocs(t *testing.T) {
	tb, err := policy.NewTokenBucket(policy.Limit{Capacity: 10, TokensPerSecond: 1000}, t0)
	require.NoError(t, err)
	fw, err := policy.NewFixedWindow(10, time.Millisecond)
	require.NoError(t, err)
	sl, err := policy.NewSlidingLog(10, 100) // 100 ns
	require.NoError(t, err)
	for name, l := range map[string]policy.Limiter{"TokenBucket": tb, "FixedWindow": fw, "SlidingLog": sl} {
		var now int64
		run := func() {
			now += 10 // admitted and denied in turn
			l.TryAcquire(now, 1)
			l.TryAcquire(now, 2)
			l.TryAcquire(now, 0)
		}
		for range 1000 { // let the SlidingLog's array reach its size
			run()
		}
		assert.Zero(t, testing.AllocsPerRun(1000, run), name)
	}
}

// TestSlidingLogReleasesMemory: after a burst has left the window, the log
// no longer holds the array the burst needed.
func TestSlidingLogReleasesMemory(t *testing.T) {
	heap := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	const burst = 1 << 17 // 2 MiB of 16-byte entries
	sl, err := policy.NewSlidingLog(burst, time.Second)
	require.NoError(t, err)
	base := heap()
	for at := range int64(burst) {
		require.True(t, sl.TryAcquire(at, 1).Allowed)
	}
	require.Greater(t, heap()-base, int64(burst*16), "the burst's log is on the heap")

	require.Equal(t, allowed(burst-1, t1s), sl.TryAcquire(t1s+burst, 1), "the burst has left")
	require.Less(t, heap()-base, int64(64<<10), "and so has its array")
	runtime.KeepAlive(sl)
}

// TestTokenBucketMatchesDecide plays random sequences, with bad costs and a
// clock that steps back, against a Bucket driven by Decide directly, as
// TokenBucket's documentation describes.
func TestTokenBucketMatchesDecide(t *testing.T) {
	r, seed := fixedRand(t)
	for i := range 2_000 {
		l := randomLimit(r)
		start := interesting(r, 0, maxInt64)
		tb, err := policy.NewTokenBucket(l, start)
		require.NoError(t, err)
		b, last := policy.NewBucket(l, start), start
		for j := range 50 {
			var now int64
			switch r.IntN(4) {
			case 0: // anywhere, so often back
				now = interesting(r, 0, maxInt64)
			case 1:
				now = satAdd(last, interesting(r, 0, maxInt64-last))
			default: // up to 3 s on
				now = satAdd(last, interesting(r, 0, 3*t1s))
			}
			cost := randomCost(r, l.Capacity)
			last = max(last, now)
			var want policy.Outcome
			if cost < 1 || cost > l.Capacity {
				b.Refill(l, last)
				want = policy.Outcome{Remaining: b.Tokens, RetryAfter: never, ResetAfter: b.ResetAfter(l)}
			} else {
				want = b.Decide(l, last, cost)
			}
			require.Equal(t, want, tb.TryAcquire(now, cost),
				"seed %d sequence %d step %d: limit %+v start %d, TryAcquire(%d, %d)", seed, i, j, l, start, now, cost)
		}
	}
}

// TestFixedWindowMatchesModel and TestSlidingLogMatchesModel play random
// sequences against the brute-force historyModel.
func TestFixedWindowMatchesModel(t *testing.T) { skipUnderRace(t); testWindowedMatchesModel(t, true) }
func TestSlidingLogMatchesModel(t *testing.T)  { skipUnderRace(t); testWindowedMatchesModel(t, false) }

func testWindowedMatchesModel(t *testing.T, fixed bool) {
	r, seed := fixedRand(t)
	var allowedN, waitN, neverN int
	for i := range 3_000 {
		capacity := []int64{1, 2, 3, 10, r.Int64N(50) + 1, r.Int64N(500) + 1, maxInt64 - 1, maxInt64}[r.IntN(8)]
		window := []int64{1, 2, 3, 10, int64(time.Second), r.Int64N(1_000) + 1, maxInt64}[r.IntN(7)]
		var l policy.Limiter
		var err error
		if fixed {
			l, err = policy.NewFixedWindow(capacity, time.Duration(window))
		} else {
			l, err = policy.NewSlidingLog(capacity, time.Duration(window))
		}
		require.NoError(t, err)
		m := &historyModel{fixed: fixed, capacity: capacity, window: window}
		var calls []string
		// One sequence in 25 is long and dense in time, so a SlidingLog
		// holds many entries, and grows and shrinks its log.
		steps, dense := 60, i%25 == 0
		if dense {
			steps = 400
		}
		for range steps {
			now, cost := nextReading(r, m.last, window, dense), randomCost(r, capacity)
			calls = append(calls, fmt.Sprintf("(%d, %d)", now, cost))
			want := m.tryAcquire(t, now, cost)
			require.Equal(t, want, l.TryAcquire(now, cost),
				"seed %d sequence %d: capacity %d window %d, calls %v", seed, i, capacity, window, calls)
			switch {
			case want.Allowed:
				allowedN++
			case want.RetryAfter == never:
				neverN++
			default:
				waitN++
			}
		}
	}
	// The sequences are worth running: each kind of answer is common.
	t.Logf("%d allowed, %d denied for a while, %d denied for ever", allowedN, waitN, neverN)
	require.Greater(t, min(allowedN, waitN, neverN), 20_000)
}

// historyModel is the brute-force model of a FixedWindow (fixed) or a
// SlidingLog: it keeps every admission ever made and sums over them afresh
// for every question. Instants are uint64 in its sums, so that those after
// math.MaxInt64 (when admissions late in time leave) can be asked about.
type historyModel struct {
	fixed            bool
	capacity, window int64
	last             int64
	history          []admission
}

type admission struct{ at, cost int64 }

// counts reports whether an admission at a counts against a request at
// instant at: in the same aligned window, or in (at-window, at].
func (m *historyModel) counts(a int64, at uint64) bool {
	if m.fixed {
		return uint64(a)/uint64(m.window) == at/uint64(m.window)
	}
	return uint64(a) <= at && at < uint64(a)+uint64(m.window)
}

// used is the cost counted against a request at instant at.
func (m *historyModel) used(at uint64) uint64 {
	var sum uint64
	for _, a := range m.history {
		if m.counts(a.at, at) {
			sum += uint64(a.cost)
		}
	}
	return sum
}

// until returns the ns from now to the first instant after now at which
// used satisfies ok: the start of the next window, or one of the instants
// at which the admissions counted at now leave. It fails the test if there
// is none.
func (m *historyModel) until(t *testing.T, now int64, ok func(used uint64) bool) int64 {
	var changes []uint64
	if m.fixed {
		changes = append(changes, (uint64(now)/uint64(m.window)+1)*uint64(m.window))
	} else {
		for _, a := range m.history {
			if m.counts(a.at, uint64(now)) {
				changes = append(changes, uint64(a.at)+uint64(m.window))
			}
		}
	}
	for _, at := range changes {
		if ok(m.used(at)) {
			require.True(t, at-1 == uint64(now) || !ok(m.used(at-1)), "model: an earlier instant than %d would do", at)
			return int64(at - uint64(now))
		}
	}
	require.Fail(t, "model: no instant after %d would do", now)
	return 0
}

func (m *historyModel) tryAcquire(t *testing.T, now, cost int64) policy.Outcome {
	now = max(now, m.last)
	m.last = now
	fits := func(used uint64) bool { return used+uint64(cost) <= uint64(m.capacity) }
	var o policy.Outcome
	switch {
	case cost < 1 || cost > m.capacity:
		o.RetryAfter = never
	case fits(m.used(uint64(now))):
		o.Allowed = true
		m.history = append(m.history, admission{now, cost})
	default:
		o.RetryAfter = m.until(t, now, fits)
	}
	used := m.used(uint64(now))
	o.Remaining = m.capacity - int64(used)
	if used > 0 {
		o.ResetAfter = m.until(t, now, func(used uint64) bool { return used == 0 })
	}
	return o
}

// fixedRand returns a generator seeded from -seed or, by default, from a
// fixed seed, so the model comparisons run the same sequences every time.
func fixedRand(t *testing.T) (*rand.Rand, uint64) {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = 20260105
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with -seed=%d", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed
}

// nextReading returns the reading after last for a limiter with the given
// window: mostly a step forward that matters to the window (none, 1 ns, a
// window give or take 1 ns, up to two windows), sometimes a step back or a
// negative reading; never past math.MaxInt64. Dense readings are mostly
// small steps, dozens to a window.
func nextReading(r *rand.Rand, last, window int64, dense bool) int64 {
	if dense && r.IntN(20) != 0 {
		return satAdd(last, r.Int64N(max(window/32, 2)))
	}
	switch r.IntN(12) {
	case 0:
		return r.Int64N(max(last, 1)) - r.Int64N(2) // back, to -1 at the lowest
	case 1:
		return last
	case 2:
		return satAdd(last, 1)
	case 3:
		return satAdd(last, window-1)
	case 4:
		return satAdd(last, window)
	case 5:
		return satAdd(last, satAdd(window, 1))
	case 6, 7:
		return satAdd(last, r.Int64N(min(window, 20)+1))
	case 8, 9:
		return satAdd(last, r.Int64N(window/8+1))
	default:
		return satAdd(last, r.Int64N(min(window, maxInt64/2)*2+1))
	}
}

// randomCost returns a cost for a limiter of the given capacity: mostly a
// small one, sometimes all or almost all of it, sometimes one that can
// never be admitted.
func randomCost(r *rand.Rand, capacity int64) int64 {
	switch r.IntN(12) {
	case 0:
		return capacity
	case 1:
		return max(1, capacity-1)
	case 2:
		return []int64{0, -1, math.MinInt64, satAdd(capacity, 1), maxInt64}[r.IntN(5)]
	default:
		return r.Int64N(min(capacity, 4)) + 1
	}
}

// satAdd returns a+b for a, b >= 0, saturated at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if b > maxInt64-a {
		return maxInt64
	}
	return a + b
}
