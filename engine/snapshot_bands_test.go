package engine_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// Snapshot and Restore with rates per any period and several bands per key:
// format version 2.

// peekAll returns e's Peek for every key.
func peekAll(t *testing.T, e *engine.Engine, keys []string) []engine.Decision {
	t.Helper()
	out := make([]engine.Decision, len(keys))
	for i, k := range keys {
		d, err := e.Peek(t.Context(), k)
		require.NoError(t, err, "Peek(%q)", k)
		out[i] = d
	}
	return out
}

// requirePeeksEqual requires every engine of f to Peek the same for every
// key at f.now.
func (f *fleet) requirePeeksEqual(keys []string) {
	f.t.Helper()
	want := peekAll(f.t, f.es[0], keys)
	for i, e := range f.es[1:] {
		got := peekAll(f.t, e, keys)
		for j, k := range keys {
			if got[j] != want[j] {
				f.t.Fatalf("engine %d: Peek(%q) at %v = %+v; engine 0 says %+v", i+1, k, time.Duration(f.now), got[j], want[j])
			}
		}
	}
}

// TestSnapshotRoundTripBands: engines whose policies refill at 100 per
// minute, 7 per 3 s and 1 per day, with 1 to 3 bands per key and named
// overrides with rates and bands of their own, are driven through a trace
// with a cutover that reshapes the bands, snapshotted (format 2, every band
// of every key equal to the model's, to the unit) and restored into the
// same policy with another shard count: at the same reading and 90 s later
// (the wall time between counted as refill), every key Peeks exactly as on
// the old engine at that reading, and the old engine, both restored ones
// and the model then give identical answers to the same requests,
// evictions and cutover.
func TestSnapshotRoundTripBands(t *testing.T) {
	for i, c := range []struct{ shards, into int }{{2, 16}, {16, 1}} {
		t.Run(fmt.Sprintf("shards=%d/into=%d", c.shards, c.into), func(t *testing.T) {
			roundTripBands(t, c.shards, c.into, uint64(i+1))
		})
	}
}

func roundTripBands(t *testing.T, shards, into int, seed uint64) {
	const (
		maxKeys = 400
		ms      = int64(time.Millisecond)
	)
	sevenPer3s := policy.Rate{Tokens: 7, Per: 3 * time.Second}
	daily := mustBands(policy.Band{Name: "daily", Capacity: 400, Refill: policy.PerDay(1)})
	two := mustBands(
		policy.Band{Name: "sec", Capacity: 15, Refill: sevenPer3s},
		policy.Band{Name: "day", Capacity: 60, Refill: policy.PerDay(1)},
	)
	three := mustBands(
		policy.Band{Name: "burst", Capacity: 20, Refill: policy.PerSecond(50)},
		policy.Band{Name: "minute", Capacity: 60, Refill: policy.PerMinute(100)},
		policy.Band{Name: "day", Capacity: 500, Refill: policy.PerDay(1)},
	)
	v1 := policy.Policy{Version: 1, Capacity: 12, Refill: policy.PerMinute(100), Bands: two, Overrides: overrides(t,
		policy.Override{Match: "vip:*", Name: "gold", Capacity: 40, Refill: sevenPer3s, Bands: three},
		policy.Override{Match: "k7", Name: "slow", Capacity: 12, Refill: policy.PerDay(1)},
		policy.Override{Match: "*9", Capacity: 15, TokensPerSecond: 3, Bands: daily},
	)}
	// The cutover reshapes: the default loses "sec", keeps "day" and gains
	// "burst" and "minute"; "gold" becomes "platinum" with a "minute" of
	// another rate and capacity; "*9" loses its band; "k*3" is new.
	v2 := policy.Policy{Version: 2, Capacity: 14, Refill: sevenPer3s, Bands: three, Overrides: overrides(t,
		policy.Override{Match: "vip:k1*", Name: "platinum", Capacity: 25, Refill: policy.PerMinute(100), Bands: mustBands(
			policy.Band{Name: "minute", Capacity: 30, Refill: policy.PerMinute(7)},
			policy.Band{Name: "day", Capacity: 300, Refill: policy.PerDay(1)},
		)},
		policy.Override{Match: "vip:*", Name: "gold", Capacity: 40, Refill: sevenPer3s, Bands: three},
		policy.Override{Match: "k7", Name: "slow", Capacity: 12, Refill: policy.PerDay(1)},
		policy.Override{Match: "*9", Capacity: 15, TokensPerSecond: 3},
		policy.Override{Match: "k*3", Name: "new", Capacity: 13, Refill: policy.PerHour(1), Bands: daily},
	)}
	v3 := policy.Policy{Version: 3, Capacity: 12, TokensPerSecond: 2, Bands: daily, Overrides: overrides(t,
		policy.Override{Match: "vip:*", Name: "gold", Capacity: 30, Refill: policy.PerMinute(100), Bands: two},
	)}
	var keys []string
	for i := range 500 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("vip:k%d", i))
	}
	rng := rand.New(rand.NewPCG(seed, uint64(shards)))
	pick := func() string {
		if rng.IntN(2) == 0 { // a hot set, so bands get depleted
			return keys[rng.IntN(20)*40]
		}
		return keys[rng.IntN(len(keys))]
	}
	cost := func() int64 { return 1 + rng.Int64N(12) }
	step := func() int64 {
		if rng.IntN(200) == 0 { // now and then long enough for the slow bands to earn
			return int64(time.Hour) + rng.Int64N(int64(time.Hour))
		}
		return rng.Int64N(20 * ms)
	}

	old, oldClk := newEngine(t, engine.Config{Policy: v1, Shards: shards, MaxKeys: maxKeys})
	f := &fleet{t: t, es: []*engine.Engine{old}, clks: []*clock.Manual{oldClk}, m: enginemodel.New(v1, maxKeys, 0)}
	for i := range 3000 {
		f.at(f.now + step())
		if i == 1500 {
			f.replace(v2)
		}
		f.allow(pick(), cost())
	}
	require.Equal(t, maxKeys, f.m.KeyCount(), "the trace reaches the key bound")
	tracked := f.m.Keys()

	data := takeSnapshot(t, old)
	s := requireSnapshotOf(t, data, f.m, f.now)
	require.Equal(t, uint64(2), s.Format)
	banded := 0
	for _, b := range s.Buckets {
		banded += min(1, len(b.Levels)-1)
	}
	require.Greater(t, banded, maxKeys/2, "most keys have bands")

	// The restoring clock reads what the old one did: no wall time passed.
	sameClk := clock.NewManual(f.now)
	same, rep := restored(t, engine.Config{Policy: v2, Shards: into, MaxKeys: maxKeys, Clock: sameClk}, data, engine.RestoreOptions{})
	assert.Equal(t, engine.RestoreReport{Restored: maxKeys, Version: 2}, rep)
	assert.Equal(t, v2, same.Policy())
	f.es, f.clks = append(f.es, same), append(f.clks, sameClk)
	f.requirePeeksEqual(tracked)

	// 90 s and 7 ns of wall time later: the restored engine owes the keys
	// that refill, exactly as the old one, which never stopped, holds it.
	const later = 90*time.Second + 7
	laterClk := clock.NewManual(f.now + int64(later))
	after, rep := restored(t, engine.Config{Policy: v2, Shards: into, MaxKeys: maxKeys, Clock: laterClk}, data, engine.RestoreOptions{})
	assert.Equal(t, engine.RestoreReport{Restored: maxKeys, Elapsed: later, Version: 2}, rep)
	f.at(f.now + int64(later))
	f.es, f.clks = append(f.es, after), append(f.clks, laterClk)
	f.requirePeeksEqual(tracked)

	for i := range 1500 {
		f.at(f.now + step())
		switch i {
		case 500:
			f.evict()
		case 1000:
			f.replace(v3)
		}
		f.allow(pick(), cost())
	}
	f.requirePeeksEqual(f.m.Keys())
	for _, e := range f.es {
		require.Equal(t, f.m.KeyCount(), e.KeyCount())
	}
	// And a restored engine's own snapshot holds the same state.
	requireSnapshotOf(t, takeSnapshot(t, after), f.m, f.now)
}

// Policies for TestRestoreCutoverBands: a restore from cutOld into cutNew.
var (
	cutOld = policy.Policy{Version: 1, Capacity: 10, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second},
		Bands: mustBands(
			policy.Band{Name: "burst", Capacity: 12, Refill: policy.PerSecond(5)},
			policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)},
			policy.Band{Name: "gone", Capacity: 10, Refill: policy.PerMinute(1)},
		),
		Overrides: mustOverrides(policy.Override{Match: "vip:*", Name: "gold", Capacity: 50, Refill: policy.PerMinute(100),
			Bands: mustBands(policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)})}),
	}
	cutNew = policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1,
		Bands: mustBands(
			policy.Band{Name: "daily", Capacity: 15, Refill: policy.PerHour(1)},
			policy.Band{Name: "fresh", Capacity: 4, Refill: policy.PerMinute(2)},
		),
		Overrides: mustOverrides(policy.Override{Match: "vip:*", Name: "platinum", Capacity: 60, TokensPerSecond: 10,
			Bands: mustBands(policy.Band{Name: "daily", Capacity: 200, Refill: policy.PerDay(100)})}),
	}
)

func mustOverrides(os ...policy.Override) *policy.OverrideSet {
	set, err := policy.NewOverrideSet(os...)
	if err != nil {
		panic(err)
	}
	return set
}

// TestRestoreCutoverBands: restored into another policy, each key's bands
// are carried by the cutover rule, band by band: matched by name (the
// primary with the primary, whatever its name), refilled under the old
// shape, moved to the new unit rounding down where the period changes,
// clamped to the new capacity and never topped up; a band new in the policy
// starts full, a band it no longer has is dropped. The balances are read
// back from the restored engine's own snapshot, to the unit, and its answers
// are the model's and those of the old engine cut over at the same instant.
func TestRestoreCutoverBands(t *testing.T) {
	const at = 3*time.Second + 1 // the restore: 1 ns after the snapshot
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			old, clk := newEngine(t, engine.Config{Policy: cutOld, Shards: shards})
			m := enginemodel.New(cutOld, 0, 0)
			for _, r := range []struct {
				key  string
				cost int64
			}{{"r", 10}, {"vip:x", 30}, {"full", 1}} {
				want, err := m.Allow(0, r.key, r.cost)
				require.NoError(t, err)
				require.Equal(t, want, allow(t, old, r.key, r.cost))
			}
			clk.Set(int64(3 * time.Second))
			data := takeSnapshot(t, old) // wall and reading 3 s

			e, rep := restored(t, engine.Config{Policy: cutNew, Shards: shards, Clock: clock.NewManual(int64(at))}, data, engine.RestoreOptions{})
			assert.Equal(t, engine.RestoreReport{Restored: 3, Elapsed: 1, Version: 1}, rep)
			s, err := decodeSnap(takeSnapshot(t, e))
			require.NoError(t, err)
			got := map[string][]rawLevel{}
			for _, b := range s.Buckets {
				require.Equal(t, int64(at), b.Last, "key %q is brought up to the restore", b.Key)
				got[b.Key] = b.Levels
			}
			assert.Equal(t, map[string][]rawLevel{
				// Primary, 7 per 3 s to 1 per second: 3 s + 1 ns earn 7
				// tokens and 7 units of 1/3e9, which become 7 tokens and
				// 2 units of 1/1e9 (2.33 rounded down). "daily", 20 per
				// day to 1 per hour: 10 tokens and 6e10+20 units of
				// 1/86400e9 become 10 tokens and 2.5e9 units of 1/3600e9
				// (2500000000.83 rounded down). "fresh" is new: full.
				// "burst" and "gone" (0.05 of a token) are dropped.
				"r": {{7, 2}, {10, 2_500_000_000}, {4, 0}},
				// Primary, 100 per minute to 10 per second: 25 tokens and
				// 100 units of 1/6e10 become 25 tokens and 1 unit of 1/1e9
				// (1.67 rounded down). "daily" keeps its period (it only
				// doubles its capacity, so nobody is topped up): 70 tokens
				// and 3e11+100 units. The primary takes the primary's
				// balance though the override renamed it.
				"vip:x": {{25, 1}, {70, 300_000_000_100}},
				// Full under the old primary (9 + 7 capped at 10), "daily"
				// clamped from 19 and a fraction to the new 15.
				"full": {{10, 0}, {15, 0}, {4, 0}},
			}, got)

			// The old engine cut over at the same instant, and the model.
			clk.Set(int64(at))
			require.NoError(t, old.ReplacePolicy(t.Context(), cutNew, 1))
			require.NoError(t, m.ReplacePolicy(int64(at), cutNew, 1))
			for _, c := range []struct {
				key  string
				cost int64
				want engine.Decision
			}{
				// "gone", dropped, would deny; "fresh" binds: fewest left.
				{"r", 1, engine.Decision{Allowed: true, Remaining: 3, Version: 2, Limit: 4, ResetAfter: 30 * time.Second, Band: "fresh"}},
				// 36e9 - 1 units short at 10 per second.
				{"vip:x", 1, engine.Decision{Allowed: true, Remaining: 24, Version: 2, Limit: 60, ResetAfter: 3600 * time.Millisecond, Band: "platinum"}},
				{"full", 4, engine.Decision{Allowed: true, Remaining: 0, Version: 2, Limit: 4, ResetAfter: 2 * time.Minute, Band: "fresh"}},
				// Denied by "fresh", now empty, the others holding plenty.
				{"full", 1, engine.Decision{RetryAfter: 30 * time.Second, Version: 2, Limit: 4, ResetAfter: 2 * time.Minute, Band: "fresh"}},
			} {
				want, err := m.Allow(int64(at), c.key, c.cost)
				require.NoError(t, err)
				require.Equal(t, c.want, want, "the model agrees with the hand computation for Allow(%q, %d)", c.key, c.cost)
				assert.Equal(t, c.want, allow(t, e, c.key, c.cost), "restored: Allow(%q, %d)", c.key, c.cost)
				assert.Equal(t, c.want, allow(t, old, c.key, c.cost), "cut over: Allow(%q, %d)", c.key, c.cost)
			}
		})
	}
}

// TestRestoreVersion1: a crafted version 1 snapshot (one band per second,
// every bucket's limit written out) still restores, with exactly the
// balances a version 1 restore gave: into its own policy, and into one of
// another period with a band, which starts full.
func TestRestoreVersion1(t *testing.T) {
	const ms = time.Millisecond
	s := rawSnap{Format: 1, Version: 4, Capacity: 10, Rate: 2,
		Overrides: []rawOverride{{Match: "vip:*", Capacity: 20, Rate: 4}},
		Wall:      int64(5 * time.Second), Reading: int64(5 * time.Second),
		Buckets: []rawBucket{
			{Key: "a", Tokens: 3, Units: 250_000_000, Last: int64(4 * time.Second), Capacity: 10, Rate: 2},
			{Key: "vip:b", Last: int64(5 * time.Second), Capacity: 20, Rate: 4},
			// Written under a limit the policy no longer gives: clamped.
			{Key: "c", Tokens: 25, Last: int64(5 * time.Second), Capacity: 30, Rate: 1},
		}}
	data := s.encode()
	decoded, err := decodeSnap(data)
	require.NoError(t, err)
	require.Equal(t, uint64(1), decoded.Format)
	own, err := s.policy()
	require.NoError(t, err)
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			// One second after the snapshot.
			e, rep := restored(t, engine.Config{Policy: own, Shards: shards, Clock: clock.NewManual(int64(6 * time.Second))}, data, engine.RestoreOptions{})
			assert.Equal(t, engine.RestoreReport{Restored: 3, Elapsed: time.Second, Version: 4}, rep)
			// a: 3.25 + 2 s at 2 per second; vip:b: 1 s at 4; c: 26, clamped to 10.
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 6, Version: 4, Limit: 10, ResetAfter: 1875 * ms}, allow(t, e, "a", 1))
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 3, Version: 4, Limit: 20, ResetAfter: 4250 * ms}, allow(t, e, "vip:b", 1))
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 4, Limit: 10, ResetAfter: 500 * ms}, allow(t, e, "c", 1))

			// Into 120 per minute with a band: a's 7.25 tokens become 7
			// tokens and 1.5e10 units of 1/6e10, exactly; the band is new.
			next := policy.Policy{Version: 5, Capacity: 10, Refill: policy.PerMinute(120), Bands: mustBands(policy.Band{Name: "hourly", Capacity: 8, Refill: policy.PerHour(8)})}
			e, _ = restored(t, engine.Config{Policy: next, Shards: shards, Clock: clock.NewManual(int64(6 * time.Second))}, data, engine.RestoreOptions{})
			got, err := decodeSnap(takeSnapshot(t, e))
			require.NoError(t, err)
			levels := map[string][]rawLevel{}
			for _, b := range got.Buckets {
				levels[b.Key] = b.Levels
			}
			assert.Equal(t, map[string][]rawLevel{
				"a":     {{7, 15_000_000_000}, {8, 0}},
				"vip:b": {{4, 0}, {8, 0}},
				"c":     {{10, 0}, {8, 0}},
			}, levels)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 6, Version: 5, Limit: 10, ResetAfter: 1875 * ms}, allow(t, e, "a", 1))
			// c: 7 left of 10 and 5 of "hourly", which binds: 3 tokens at 8 per hour.
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 5, Version: 5, Limit: 8, ResetAfter: 1350 * time.Second, Band: "hourly"}, allow(t, e, "c", 3))
		})
	}
}

// TestRestoreVersion2Crafted: the crafted version 2 snapshot restores into
// its own policy with the balances the format comment says, brought
// forward by the time since each bucket's last update.
func TestRestoreVersion2Crafted(t *testing.T) {
	s := okSnapV2()
	p, err := s.policy()
	require.NoError(t, err)
	e, rep := restored(t, engine.Config{Policy: p, Shards: 2, Clock: clock.NewManual(int64(7 * time.Second))}, s.encode(), engine.RestoreOptions{})
	assert.Equal(t, engine.RestoreReport{Restored: 2, Elapsed: 2 * time.Second, Version: 3}, rep)
	got, err := decodeSnap(takeSnapshot(t, e))
	require.NoError(t, err)
	levels := map[string][]rawLevel{}
	for _, b := range got.Buckets {
		levels[b.Key] = b.Levels
	}
	assert.Equal(t, map[string][]rawLevel{
		// 3 s owed. Primary at 100 per minute: 3e11 units, 5 tokens, more.
		// "burst" stays full. "daily" at 20 per day: 6e10 units more.
		"a": {{8, 7}, {5, 0}, {19, 60_000_000_123}},
		// 2 s owed. 7 per 3 s: 1.4e10 units more, on 3e9-1: 5 tokens and
		// 2e9-1 units (a unit count above 1e9, legal under a 3 s period).
		"vip:b": {{5, 1_999_999_999}, {100, 0}},
	}, levels)
	// "burst" binds: 4 left, a second to refill.
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 4, Version: 3, Limit: 5, ResetAfter: time.Second, Band: "burst"}, allow(t, e, "a", 1))
	// The primary, named by its override, binds: 4 tokens and 2e9-1 units
	// left, 76e9+1 units short of 30 tokens at 7 units per ns.
	want := engine.Decision{Allowed: true, Remaining: 4, Version: 3, Limit: 30, ResetAfter: 10_857_142_858, Band: "gold"}
	require.Equal(t, want, decisionFor(restoredTokens(s, s.Buckets[1], p, int64(7*time.Second)), p.ShapeAt(1), 3, 1), "the test's own formulas agree")
	assert.Equal(t, want, allow(t, e, "vip:b", 1))
}

// TestRestoreRejectsV2: crafted version 2 snapshots wrong in one way only,
// sealed with a right checksum, are ErrInvalidSnapshot with a message that
// names the problem; the test decoder rejects each too, and accepts the
// crafted base.
func TestRestoreRejectsV2(t *testing.T) {
	const day = uint64(24 * time.Hour)
	with := func(f func(s *rawSnap)) []byte {
		s := okSnapV2()
		f(&s)
		return s.encode()
	}
	level := func(bucket, band int, v rawLevel) []byte {
		return with(func(s *rawSnap) { s.Buckets[bucket].Levels[band] = v })
	}
	band := func(f func(b *rawBand)) []byte {
		return with(func(s *rawSnap) { f(&s.Bands[0]) })
	}
	eight := func() []rawBand {
		var bands []rawBand
		for i := range policy.MaxBands + 1 {
			bands = append(bands, rawBand{fmt.Sprintf("b%d", i), 5, rawRate{1, uint64(time.Second)}})
		}
		return bands
	}
	for _, c := range []struct {
		name string
		data []byte
		want string
		also error
	}{
		{"limit index out of range", with(func(s *rawSnap) { s.Buckets[0].Limit = 2 }), "limit 2, the policy has 2", nil},
		{"limit index far out of range", with(func(s *rawSnap) { s.Buckets[1].Limit = 1 << 40 }), "the policy has 2", nil},
		{"primary units of a whole token", level(0, 0, rawLevel{3, uint64(time.Minute)}), "fewer than a token", nil},
		{"band units of a whole token", level(0, 2, rawLevel{3, day}), "fewer than a token", nil},
		{"units of a second under a 1 s band", level(0, 1, rawLevel{4, uint64(time.Second)}), "fewer than a token", nil},
		{"override units of a whole token", level(1, 0, rawLevel{0, uint64(3 * time.Second)}), "fewer than a token", nil},
		{"tokens above a band's capacity", level(0, 1, rawLevel{6, 0}), "above its capacity 5", nil},
		{"units above a band's capacity", level(0, 1, rawLevel{5, 1}), "above its capacity 5", nil},
		{"tokens above the primary's capacity", level(0, 0, rawLevel{11, 0}), "above its capacity 10", nil},
		{"tokens above an override band's capacity", level(1, 1, rawLevel{101, 0}), "above its capacity 100", nil},
		// Whole tokens are two's complement: 1<<63 is math.MinInt64, a debt
		// far below any floor.
		{"tokens of 1<<63", level(0, 2, rawLevel{1 << 63, 0}), "below its floor, minus its capacity 20", nil},
		{"a debt below the primary's floor", level(0, 0, rawLevel{1<<64 - 11, 0}), "balance -11 tokens is below its floor, minus its capacity 10", nil},
		{"band capacity 0", band(func(b *rawBand) { b.Capacity = 0 }), "band 0", policy.ErrInvalid},
		{"band refill tokens 0", band(func(b *rawBand) { b.Refill.Tokens = 0 }), "band 0", policy.ErrInvalid},
		{"band refill period 0", band(func(b *rawBand) { b.Refill.Per = 0 }), "band 0", policy.ErrInvalid},
		{"band empty name", band(func(b *rawBand) { b.Name = "" }), "empty name", policy.ErrInvalid},
		{"band name not printable", band(func(b *rawBand) { b.Name = "da\nily" }), "printable ASCII", policy.ErrInvalid},
		{"band name too long", band(func(b *rawBand) { b.Name = strings.Repeat("n", policy.MaxNameBytes+1) }), "at most 64", nil},
		{"band capacity above int64", band(func(b *rawBand) { b.Capacity = 1 << 63 }), "band 0 capacity", nil},
		{"override band refill period 0", with(func(s *rawSnap) { s.Overrides[0].Bands[0].Refill.Per = 0 }), "band 0", policy.ErrInvalid},
		{"too many bands", with(func(s *rawSnap) { s.Bands = eight() }), "8 bands, at most 7", nil},
		{"too many override bands", with(func(s *rawSnap) { s.Overrides[0].Bands = eight() }), "8 bands, at most 7", nil},
		{"duplicate band name", with(func(s *rawSnap) { s.Bands[1].Name = "burst" }), `band 1 ("burst"): name is band 0's`, policy.ErrInvalid},
		{"band named as its override", with(func(s *rawSnap) { s.Overrides[0].Name = "daily" }), "also one of its bands'", policy.ErrInvalid},
		{"override name not printable", with(func(s *rawSnap) { s.Overrides[0].Name = "g\x00ld" }), "printable ASCII", policy.ErrInvalid},
		{"override name too long", with(func(s *rawSnap) { s.Overrides[0].Name = strings.Repeat("g", policy.MaxNameBytes+1) }), "at most 64", nil},
		{"a name for two limits", with(func(s *rawSnap) {
			s.Overrides = append(s.Overrides, rawOverride{Match: "x", Name: "gold", Capacity: 31, Refill: rawRate{7, uint64(3 * time.Second)}})
		}), "whose limit differs", policy.ErrInvalid},
		{"no refill rate", with(func(s *rawSnap) { s.Refill = rawRate{} }), "policy", policy.ErrInvalid},
		{"refill period 0", with(func(s *rawSnap) { s.Refill.Per = 0 }), "policy", policy.ErrInvalid},
		{"refill period above int64", with(func(s *rawSnap) { s.Refill.Per = 1 << 63 }), "policy refill period", nil},
		{"override without a rate", with(func(s *rawSnap) { s.Overrides[0].Refill = rawRate{} }), "policy", policy.ErrInvalid},
		{"negative last update", with(func(s *rawSnap) { s.Buckets[0].Last = -1 }), "negative", nil},
		{"duplicate key", with(func(s *rawSnap) { s.Buckets = append(s.Buckets, s.Buckets[0]) }), `duplicate key "a"`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, derr := decodeSnap(c.data)
			require.Error(t, derr, "the test decoder rejects it too")
			err := restoreErr(t, c.data, engine.Config{})
			require.ErrorIs(t, err, engine.ErrInvalidSnapshot)
			assert.ErrorContains(t, err, c.want)
			if c.also != nil {
				assert.ErrorIs(t, err, c.also)
			}
		})
	}
	_, err := decodeSnap(okSnapV2().encode())
	require.NoError(t, err)
	require.NoError(t, restoreOK(t, okSnapV2().encode()))
}
