package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// patience bounds every wait for something that must happen promptly: long
// enough for a loaded -race run, short enough that a hang fails the test
// instead of the whole binary.
const patience = 20 * time.Second

func takeSnapshot(t testing.TB, e *engine.Engine) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, e.Snapshot(t.Context(), &buf))
	return buf.Bytes()
}

// restored restores data and closes the engine when the test ends.
func restored(t testing.TB, cfg engine.Config, data []byte, opts engine.RestoreOptions) (*engine.Engine, engine.RestoreReport) {
	t.Helper()
	e, rep, err := engine.Restore(cfg, bytes.NewReader(data), opts)
	require.NoError(t, err)
	require.NotNil(t, e)
	t.Cleanup(func() { _ = e.Close() })
	return e, rep
}

func allow(t testing.TB, e *engine.Engine, key string, cost int64) engine.Decision {
	t.Helper()
	d, err := e.Allow(t.Context(), key, cost)
	require.NoError(t, err, "Allow(%q, %d)", key, cost)
	return d
}

// wait fails the test if ch is not closed within patience.
func wait(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(patience):
		t.Fatalf("still waiting after %v for %s", patience, what)
	}
}

// fleet drives several engines, each on its own Manual clock, and the
// math/big model with the same calls at the same instant, and requires the
// same answer from all of them.
type fleet struct {
	t    *testing.T
	es   []*engine.Engine
	clks []*clock.Manual
	m    *enginemodel.Model
	now  int64
}

func (f *fleet) at(now int64) {
	f.now = now
	for _, c := range f.clks {
		c.Set(now)
	}
}

func (f *fleet) allow(key string, cost int64) {
	want, wantErr := f.m.Allow(f.now, key, cost)
	for i, e := range f.es {
		got, err := e.Allow(f.t.Context(), key, cost)
		if got != want || !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
			f.t.Fatalf("engine %d: Allow(%q, %d) at %v = %+v, %v; the model says %+v, %v",
				i, key, cost, time.Duration(f.now), got, err, want, wantErr)
		}
	}
}

func (f *fleet) evict() {
	want, err := f.m.EvictFull(f.now)
	require.NoError(f.t, err)
	for i, e := range f.es {
		n, err := e.EvictFull(f.t.Context())
		require.NoError(f.t, err)
		require.Equal(f.t, want, n, "engine %d: EvictFull at %v", i, time.Duration(f.now))
	}
}

func (f *fleet) replace(next policy.Policy) {
	cur := f.m.Policy().Version
	require.NoError(f.t, f.m.ReplacePolicy(f.now, next, cur))
	for _, e := range f.es {
		require.NoError(f.t, e.ReplacePolicy(f.t.Context(), next, cur))
	}
}

// tokensAt is b's balance, band by band, brought forward to now under the
// limit it has in s.
func tokensAt(s rawSnap, b rawBucket, now int64) []*big.Rat {
	sh := s.shape(b)
	var out []*big.Rat
	for i, v := range s.levels(b) {
		out = append(out, refilled(tokensOf(v, sh.Band(i)), sh.Band(i), big.NewInt(max(0, now-b.Last))))
	}
	return out
}

// requireSnapshotOf decodes data and requires it to hold exactly the
// model's keys, each with the model's limit and, in every band, the model's
// balance at now.
func requireSnapshotOf(t *testing.T, data []byte, m *enginemodel.Model, now int64) rawSnap {
	t.Helper()
	s, err := decodeSnap(data)
	require.NoError(t, err)
	require.Len(t, s.Buckets, m.KeyCount())
	for _, b := range s.Buckets {
		sh, lim := s.shape(b), model.ShapeOf(m.Policy(), b.Key)
		require.True(t, sameShape(lim, sh), "key %q: its limit is %+v, the model's %+v", b.Key, sh, lim)
		require.LessOrEqual(t, b.Last, now, "key %q: last update after the snapshot", b.Key)
		mb, ok := m.Bucket(b.Key)
		require.True(t, ok, "the snapshot holds %q, the model does not", b.Key)
		require.Len(t, mb.Tokens, lim.Len())
		var want []*big.Rat
		for i, v := range mb.Tokens {
			want = append(want, refilled(v, lim.Band(i), big.NewInt(now-mb.Last)))
		}
		got := tokensAt(s, b, now)
		require.Equal(t, ratStrings(want), ratStrings(got), "key %q: balance at %v: snapshot %v, model %v", b.Key, time.Duration(now), got, want)
	}
	return s
}

// TestSnapshotRoundTrip: random engines (thousands of keys, a cutover with
// overrides, the key bound reached) are snapshotted and restored into an
// engine with another shard count; the snapshot holds the model's balances
// to the unit, and the old engine, the restored one and the model then give
// identical answers to the same requests, evictions and cutover.
func TestSnapshotRoundTrip(t *testing.T) {
	for i, shards := range shardCounts {
		into := shardCounts[(i+1)%len(shardCounts)]
		seed := uint64(i + 1)
		t.Run(fmt.Sprintf("shards=%d/into=%d/seed=%d", shards, into, seed), func(t *testing.T) {
			roundTrip(t, shards, into, seed)
		})
	}
}

func roundTrip(t *testing.T, shards, into int, seed uint64) {
	const (
		maxKeys = 1200
		ms      = int64(time.Millisecond)
	)
	rng := rand.New(rand.NewPCG(seed, uint64(shards)))
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 3, Overrides: overrides(t,
		policy.Override{Match: "vip:*", Capacity: 40, TokensPerSecond: 7},
		policy.Override{Match: "k7", Capacity: 3, TokensPerSecond: 1},
	)}
	v2 := policy.Policy{Version: 2, Capacity: 8, TokensPerSecond: 5, Overrides: overrides(t,
		policy.Override{Match: "vip:k1*", Capacity: 25, TokensPerSecond: 2},
		policy.Override{Match: "k7", Capacity: 12, TokensPerSecond: 1},
		policy.Override{Match: "*9", Capacity: 4, TokensPerSecond: 1},
		policy.Override{Match: "k*3", Capacity: 11, TokensPerSecond: 13},
	)}
	v3 := policy.Policy{Version: 3, Capacity: 6, TokensPerSecond: 2, Overrides: overrides(t,
		policy.Override{Match: "k3", Capacity: 30, TokensPerSecond: 9},
		policy.Override{Match: "*", Capacity: 9, TokensPerSecond: 4},
	)}
	var keys []string
	for i := range 1500 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for i := range 1000 {
		keys = append(keys, fmt.Sprintf("vip:k%d", i))
	}
	pick := func() string {
		if rng.IntN(2) == 0 { // a hot set, so buckets get depleted
			return keys[rng.IntN(30)*50]
		}
		return keys[rng.IntN(len(keys))]
	}
	cost := func() int64 { return 1 + rng.Int64N(12) }

	old, oldClk := newEngine(t, engine.Config{Policy: v1, Shards: shards, MaxKeys: maxKeys})
	f := &fleet{t: t, es: []*engine.Engine{old}, clks: []*clock.Manual{oldClk}, m: enginemodel.New(v1, maxKeys, 0)}
	for i := range 5000 {
		f.at(f.now + rng.Int64N(20*ms))
		if i == 2500 {
			f.replace(v2)
		}
		f.allow(pick(), cost())
	}
	require.Equal(t, maxKeys, f.m.KeyCount(), "the trace reaches the key bound")

	data := takeSnapshot(t, old)
	s := requireSnapshotOf(t, data, f.m, f.now)
	assert.Equal(t, f.now, s.Wall, "a Manual clock's wall is its reading")
	assert.Equal(t, f.now, s.Reading)
	p, err := s.policy()
	require.NoError(t, err)
	assert.Equal(t, v2.Overrides.Overrides(), p.Overrides.Overrides())
	assert.Equal(t, policy.Policy{Version: 2, Capacity: 8, TokensPerSecond: 5}, policy.Policy{Version: p.Version, Capacity: p.Capacity, TokensPerSecond: p.TokensPerSecond})

	// The restoring clock reads what the old one did: no wall time passed,
	// and the model's absolute readings stay valid for both engines.
	newClk := clock.NewManual(f.now)
	e, rep := restored(t, engine.Config{Policy: v2, Shards: into, MaxKeys: maxKeys, Clock: newClk}, data, engine.RestoreOptions{})
	assert.Equal(t, engine.RestoreReport{Restored: maxKeys, Version: 2}, rep)
	assert.Equal(t, maxKeys, e.KeyCount())
	assert.Equal(t, v2, e.Policy())

	f.es, f.clks = append(f.es, e), append(f.clks, newClk)
	for i := range 1500 {
		f.at(f.now + rng.Int64N(20*ms))
		switch i {
		case 500:
			f.evict()
		case 1000:
			f.replace(v3)
		}
		f.allow(pick(), cost())
	}
	require.Equal(t, f.m.KeyCount(), e.KeyCount())
	require.Equal(t, f.m.KeyCount(), old.KeyCount())
	// And the restored engine's own snapshot holds the same state.
	requireSnapshotOf(t, takeSnapshot(t, e), f.m, f.now)
}

// TestRestoreNoFreeTokens: a restore refills exactly by the time that
// passed: from each bucket's last update to the snapshot, plus the wall time
// from the snapshot to the restore, and none if the wall went back.
func TestRestoreNoFreeTokens(t *testing.T) {
	const ms = time.Millisecond
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			p := pol(1, 10, 2)
			old, clk := newEngine(t, engine.Config{Policy: p, Shards: shards})
			clk.Set(int64(time.Second))
			allow(t, old, "touched", 10) // depleted at 1 s, untouched since
			clk.Set(int64(2750 * ms))
			allow(t, old, "half", 10) // half a token by 3 s
			clk.Set(int64(3 * time.Second))
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, allow(t, old, "drained", 10))
			before := allow(t, old, "drained", 1)
			require.Equal(t, engine.Decision{RetryAfter: 500 * ms, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, before)
			data := takeSnapshot(t, old) // wall and reading 3 s

			type want struct {
				key  string
				cost int64
				d    engine.Decision
			}
			deny := func(remaining int64, retry, reset time.Duration) engine.Decision {
				return engine.Decision{Remaining: remaining, RetryAfter: retry, Version: 1, Limit: 10, ResetAfter: reset}
			}
			for _, c := range []struct {
				name    string
				at      time.Duration // the restoring clock's reading, and so its wall
				elapsed time.Duration
				wants   []want
			}{
				{"no time", 3 * time.Second, 0, []want{
					{"drained", 1, before}, // still depleted, the same estimate
					{"half", 1, deny(0, 250*ms, 4750*ms)},
					{"touched", 5, deny(4, 500*ms, 3*time.Second)}, // 1 s to 3 s: 4 tokens
				}},
				{"1.25 s later", 4250 * ms, 1250 * ms, []want{
					{"drained", 3, deny(2, 250*ms, 3750*ms)}, // 2.5 tokens
					{"half", 4, deny(3, 500*ms, 3500*ms)},    // 0.5 + 2.5
					{"touched", 7, deny(6, 250*ms, 1750*ms)}, // 2 s + 1.25 s: 6.5 tokens
				}},
				{"2 s later", 5 * time.Second, 2 * time.Second, []want{
					{"touched", 9, deny(8, 500*ms, time.Second)}, // 4 s of refill
					{"drained", 5, deny(4, 500*ms, 3*time.Second)},
					{"half", 5, deny(4, 250*ms, 2750*ms)},
				}},
				{"wall went back", time.Second, 0, []want{
					{"drained", 1, before},
					{"half", 1, deny(0, 250*ms, 4750*ms)},
					{"touched", 5, deny(4, 500*ms, 3*time.Second)}, // its 2 s before the snapshot still count
				}},
				{"an hour later", 3*time.Second + time.Hour, time.Hour, []want{
					{"drained", 1, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: 500 * ms}},
					{"touched", 10, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}},
				}},
			} {
				t.Run(c.name, func(t *testing.T) {
					newClk := clock.NewManual(int64(c.at))
					e, rep := restored(t, engine.Config{Policy: p, Shards: shards, Clock: newClk}, data, engine.RestoreOptions{})
					assert.Equal(t, engine.RestoreReport{Restored: 3, Elapsed: c.elapsed, Version: 1}, rep)
					for _, w := range c.wants {
						assert.Equal(t, w.d, allow(t, e, w.key, w.cost), "%s: Allow(%q, %d)", c.name, w.key, w.cost)
					}
					// From here on the restored bucket refills on the new clock.
					if c.elapsed == 0 {
						newClk.Advance(500 * ms)
						assert.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, allow(t, e, "drained", 1))
					}
				})
			}
		})
	}
}

// TestRestoreNoFreeTokensForKeysServedDuringSnapshot: a key the shard
// serves while a slow writer holds the snapshot, and copies afterwards, is
// copied as it is after that request. Restored at the wall time of that
// request, it must be exactly as depleted as it was then: no wall time
// passed since its last update, whatever passed since the snapshot began.
func TestRestoreNoFreeTokensForKeysServedDuringSnapshot(t *testing.T) {
	const drainAt = 10 * time.Second
	p := pol(1, 10, 2)
	old, clk := newEngine(t, engine.Config{Policy: p, Shards: 1})
	keys := longKeys(manyKeys)
	fill(t, old, keys, 1) // 9 tokens each at 0
	w := newBlockingWriter(nil)
	errc := make(chan error, 1)
	go func() { errc <- old.Snapshot(context.Background(), w) }()
	wait(t, w.blocked, "the snapshot to reach the writer")

	clk.Set(int64(drainAt))
	for i, d := range fill(t, old, keys, 10) { // full again at 10 s, drained
		require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d, "key %d", i)
	}
	close(w.release)
	require.NoError(t, <-errc)

	s, err := decodeSnap(w.buf.Bytes())
	require.NoError(t, err)
	require.Len(t, s.Buckets, len(keys))
	require.Equal(t, int64(0), s.Reading)
	e, _ := restored(t, engine.Config{Policy: p, Shards: 1, Clock: clock.NewManual(int64(drainAt))}, w.buf.Bytes(), engine.RestoreOptions{})
	late := 0
	for _, b := range s.Buckets {
		d := allow(t, e, b.Key, 1)
		if b.Last == 0 { // copied before the drain: 9 tokens at 0, full by 10 s
			require.Equal(t, uint64(9), s.levels(b)[0].Tokens)
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: 500 * time.Millisecond}, d)
			continue
		}
		late++
		require.Equal(t, int64(drainAt), b.Last, "key %s", b.Key[:8])
		require.Equal(t, uint64(0), s.levels(b)[0].Tokens, "key %s", b.Key[:8])
		require.Equal(t, engine.Decision{RetryAfter: 500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d,
			"key %s was drained at %v and restored at %v: no time passed, no token is owed", b.Key[:8], drainAt, drainAt)
	}
	require.Positive(t, late, "some keys were copied after the drain")
}

// manyKeys is enough keys for one shard's table to span several segments,
// so several snapshot chunks: with two chunks in flight per shard, a writer
// that blocks leaves some keys not yet copied.
const manyKeys = 8000

// longKeys returns n distinct keys of 100 bytes, so a snapshot of them
// overflows the snapshot's write buffer, and reaches the writer, while the
// shards still have keys to copy.
func longKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%06d", i) + strings.Repeat("x", 94)
	}
	return keys
}

// fill decides Allow(key, cost) for every key, in batches, and returns the
// decisions.
func fill(t testing.TB, e *engine.Engine, keys []string, cost int64) []engine.Decision {
	t.Helper()
	reqs := make([]engine.Request, len(keys))
	for i, k := range keys {
		reqs[i] = engine.Request{Key: k, Cost: cost}
	}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, e.AllowBatch(t.Context(), reqs, out))
	ds := make([]engine.Decision, len(out))
	for i, r := range out {
		require.NoError(t, r.Err, "key %d", i)
		ds[i] = r.Decision
	}
	return ds
}

// blockingWriter blocks its first Write until release is closed, then
// returns err, or records what it is given.
type blockingWriter struct {
	once    sync.Once
	blocked chan struct{} // closed when the first Write starts
	release chan struct{}
	err     error
	buf     bytes.Buffer
}

func newBlockingWriter(err error) *blockingWriter {
	return &blockingWriter{blocked: make(chan struct{}), release: make(chan struct{}), err: err}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.once.Do(func() {
		close(w.blocked)
		<-w.release
	})
	if w.err != nil {
		return 0, w.err
	}
	return w.buf.Write(p)
}

// TestRestorePolicyChange: restored under another policy, each bucket is
// refilled under the limit it had for the time that passed, then clamped to
// the capacity its key resolves to now, as at a cutover; answers carry the
// new version. These are the numbers of TestOverridesCutover, with the cutover
// happening across a restore 1.5 s after the snapshot, and the model agrees.
func TestRestorePolicyChange(t *testing.T) {
	const ms = time.Millisecond
	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2, Overrides: overrides(t,
				policy.Override{Match: "vip:*", Capacity: 50, TokensPerSecond: 5},
				policy.Override{Match: "metered", Capacity: 20, TokensPerSecond: 4},
			)}
			v2 := policy.Policy{Version: 7, Capacity: 10, TokensPerSecond: 2, Overrides: overrides(t,
				policy.Override{Match: "promoted", Capacity: 100, TokensPerSecond: 50},
				policy.Override{Match: "metered", Capacity: 20, TokensPerSecond: 1},
			)}
			old, _ := newEngine(t, engine.Config{Policy: v1, Shards: shards})
			m := enginemodel.New(v1, 0, 0)
			for _, r := range []struct {
				key  string
				cost int64
			}{{"promoted", 10}, {"vip:demoted", 50}, {"metered", 20}, {"vip:full", 1}} {
				allow(t, old, r.key, r.cost)
				_, err := m.Allow(0, r.key, r.cost)
				require.NoError(t, err)
			}
			data := takeSnapshot(t, old)

			newClk := clock.NewManual(int64(1500 * ms))
			e, rep := restored(t, engine.Config{Policy: v2, Shards: shards, Clock: newClk}, data, engine.RestoreOptions{})
			assert.Equal(t, engine.RestoreReport{Restored: 4, Elapsed: 1500 * ms, Version: 1}, rep)
			assert.Equal(t, v2, e.Policy())
			require.NoError(t, m.ReplacePolicy(int64(1500*ms), v2, 1))

			newClk.Set(int64(1600 * ms))
			for _, c := range []struct {
				key  string
				cost int64
				want engine.Decision
			}{
				// 3 tokens earned at 2/s, not topped up to 100; then 50/s.
				{"promoted", 1, engine.Decision{Allowed: true, Remaining: 7, Version: 7, Limit: 100, ResetAfter: 1860 * ms}},
				// 7.5 earned at 5/s fits under 10; then 2/s.
				{"vip:demoted", 1, engine.Decision{Allowed: true, Remaining: 6, Version: 7, Limit: 10, ResetAfter: 1650 * ms}},
				// 6 earned at 4/s; then 1/s.
				{"metered", 7, engine.Decision{Allowed: false, Remaining: 6, RetryAfter: 900 * ms, Version: 7, Limit: 20, ResetAfter: 13900 * ms}},
				// Full at 50, clamped to 10.
				{"vip:full", 1, engine.Decision{Allowed: true, Remaining: 9, Version: 7, Limit: 10, ResetAfter: 500 * ms}},
			} {
				want, err := m.Allow(int64(1600*ms), c.key, c.cost)
				require.NoError(t, err)
				require.Equal(t, c.want, want, "the model agrees with the hand computation for %q", c.key)
				assert.Equal(t, c.want, allow(t, e, c.key, c.cost), "Allow(%q, %d)", c.key, c.cost)
			}
		})
	}
}

// TestRestoreMaxKeys: a snapshot of more keys than MaxKeys is refused, or,
// with DropFullest, fitted by dropping the buckets that lack the fewest
// tokens (judged after the refill the restore grants); the report says
// how many were dropped, how many of those were not full, and how many
// tokens the emptiest of those lacked.
func TestRestoreMaxKeys(t *testing.T) {
	const ms = time.Millisecond
	set := overrides(t, policy.Override{Match: "big", Capacity: 100, TokensPerSecond: 1})
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: set}
	old, clk := newEngine(t, engine.Config{Policy: p, Shards: 2})
	for _, r := range []struct {
		key  string
		cost int64
	}{{"k0", 10}, {"k1", 8}, {"k2", 5}, {"k3", 2}, {"k4", 1}, {"big", 10}} {
		allow(t, old, r.key, r.cost)
	}
	clk.Set(int64(500 * ms))
	allow(t, old, "k5", 1)
	clk.Set(int64(time.Second))
	// At 1 s, by tokens lacking: k4 none (full), k5 0.5, k3 1, k2 4, k1 7,
	// big 9 (91 of 100) and k0 9.
	data := takeSnapshot(t, old)

	for _, shards := range shardCounts {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			cfg := engine.Config{Policy: p, Shards: shards, MaxKeys: 3, Clock: clock.NewManual(int64(time.Second))}
			e, rep, err := engine.Restore(cfg, bytes.NewReader(data), engine.RestoreOptions{})
			require.ErrorIs(t, err, engine.ErrKeyCapacity)
			assert.ErrorContains(t, err, "7 keys")
			assert.ErrorContains(t, err, "MaxKeys is 3")
			assert.Nil(t, e)
			assert.Equal(t, engine.RestoreReport{}, rep)

			for _, c := range []struct {
				maxKeys  int
				at       time.Duration
				want     engine.RestoreReport
				survive  []string
				dropped  []string
				decision map[string]engine.Decision // Allow(key, 1) on survivors
			}{
				{3, time.Second, engine.RestoreReport{Restored: 3, Dropped: 4, DroppedPartial: 3, MaxDeficit: 4},
					[]string{"k0", "k1", "big"}, []string{"k2", "k3", "k4", "k5"},
					map[string]engine.Decision{
						"k0":  {Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 10 * time.Second},
						"k1":  {Allowed: true, Remaining: 2, Version: 1, Limit: 10, ResetAfter: 8 * time.Second},
						"big": {Allowed: true, Remaining: 90, Version: 1, Limit: 100, ResetAfter: 10 * time.Second},
					}},
				{5, time.Second, engine.RestoreReport{Restored: 5, Dropped: 2, DroppedPartial: 1, MaxDeficit: 1},
					[]string{"k0", "k1", "k2", "k3", "big"}, []string{"k4", "k5"},
					map[string]engine.Decision{"big": {Allowed: true, Remaining: 90, Version: 1, Limit: 100, ResetAfter: 10 * time.Second}}},
				{6, time.Second, engine.RestoreReport{Restored: 6, Dropped: 1},
					[]string{"k0", "k1", "k2", "k3", "k5", "big"}, []string{"k4"},
					map[string]engine.Decision{"k5": {Allowed: true, Remaining: 8, Version: 1, Limit: 10, ResetAfter: 1500 * ms}}},
				// Half a second later k5 is full too: two full buckets go.
				{5, 1500 * ms, engine.RestoreReport{Restored: 5, Elapsed: 500 * ms, Dropped: 2},
					[]string{"k0", "k1", "k2", "k3", "big"}, []string{"k4", "k5"},
					map[string]engine.Decision{"k3": {Allowed: true, Remaining: 8, Version: 1, Limit: 10, ResetAfter: 1500 * ms}}},
				{7, time.Second, engine.RestoreReport{Restored: 7},
					[]string{"k0", "k1", "k2", "k3", "k4", "k5", "big"}, nil, nil},
			} {
				cfg := engine.Config{Policy: p, Shards: shards, MaxKeys: c.maxKeys, Clock: clock.NewManual(int64(c.at))}
				e, rep := restored(t, cfg, data, engine.RestoreOptions{DropFullest: true})
				c.want.Version = 1 // the snapshot's policy
				require.Equal(t, c.want, rep, "MaxKeys %d at %v", c.maxKeys, c.at)
				require.Equal(t, 7-len(c.dropped), e.KeyCount())
				for k, want := range c.decision {
					assert.Equal(t, want, allow(t, e, k, 1), "MaxKeys %d: Allow(%q, 1)", c.maxKeys, k)
				}
				if len(c.dropped) > 0 {
					// At the bound, a dropped key is a new key: refused.
					for _, k := range c.dropped {
						_, err := e.Allow(t.Context(), k, 1)
						assert.ErrorIs(t, err, engine.ErrKeyCapacity, "MaxKeys %d: %q was dropped", c.maxKeys, k)
					}
				}
				for _, k := range c.survive {
					_, err := e.Allow(t.Context(), k, 1)
					assert.NoError(t, err, "MaxKeys %d: %q survives", c.maxKeys, k)
				}
			}
		})
	}
}

// TestRestoreKeyOfMaxKeyBytes: a key of exactly MaxKeyBytes is valid, so a
// snapshot holding one restores, depleted balance and all; refusing it would
// make a snapshot the engine wrote unreadable by the same configuration.
func TestRestoreKeyOfMaxKeyBytes(t *testing.T) {
	cfg := engine.Config{Policy: pol(1, 10, 2), Shards: 2, MaxKeyBytes: 8}
	old, clk := newEngine(t, cfg)
	key := strings.Repeat("k", cfg.MaxKeyBytes)
	allow(t, old, key, 10)
	data := takeSnapshot(t, old)

	cfg.Clock = clk // the same reading and wall: nothing owed
	e, rep := restored(t, cfg, data, engine.RestoreOptions{})
	assert.Equal(t, 1, rep.Restored)
	d, err := e.Peek(t.Context(), key)
	require.NoError(t, err)
	assert.Equal(t, engine.Decision{RetryAfter: 500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d, "still empty")
}

// TestRestoreDropsKeysAboveMaxKeyBytes: a snapshot taken under a larger
// MaxKeyBytes restores under a smaller one. Its longer keys are dropped and
// counted apart: the engine refuses every request that names one, so no
// answer depends on their buckets. They do not count against MaxKeys, and
// every other key keeps its balance. Before, the whole snapshot was
// ErrInvalidSnapshot, which leaves an operator no restart but an empty one.
func TestRestoreDropsKeysAboveMaxKeyBytes(t *testing.T) {
	old, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 2, MaxKeyBytes: 300})
	long := []string{strings.Repeat("x", 300), strings.Repeat("y", 257)}
	for _, k := range long {
		allow(t, old, k, 10)
	}
	allow(t, old, "drained", 10)
	allow(t, old, "some", 4)
	data := takeSnapshot(t, old)

	cfg := engine.Config{Policy: pol(1, 10, 2), Shards: 2, MaxKeys: 2, Clock: clk} // MaxKeyBytes 256
	e, rep := restored(t, cfg, data, engine.RestoreOptions{})
	assert.Equal(t, 2, rep.Restored)
	assert.Equal(t, 2, rep.LongKeys)
	assert.Zero(t, rep.Dropped)
	assert.Equal(t, 2, e.KeyCount())
	d, err := e.Peek(t.Context(), "drained")
	require.NoError(t, err)
	assert.Equal(t, engine.Decision{RetryAfter: 500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d, "still empty")
	d, err = e.Peek(t.Context(), "some")
	require.NoError(t, err)
	assert.Equal(t, int64(6), d.Remaining)
	for _, k := range long {
		_, err := e.Allow(t.Context(), k, 1)
		assert.ErrorIs(t, err, engine.ErrInvalidKey)
	}

	// Past the bound the long keys still do not count: two kept keys and
	// MaxKeys 1 is ErrKeyCapacity for two keys, or, with DropFullest, the
	// fuller one dropped.
	cfg.MaxKeys = 1
	_, _, err = engine.Restore(cfg, bytes.NewReader(data), engine.RestoreOptions{})
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	assert.ErrorContains(t, err, "holds 2 keys")
	e, rep = restored(t, cfg, data, engine.RestoreOptions{DropFullest: true})
	assert.Equal(t, engine.RestoreReport{Restored: 1, LongKeys: 2, Dropped: 1, DroppedPartial: 1, MaxDeficit: 4, Version: 1}, rep)
	d, err = e.Peek(t.Context(), "drained")
	require.NoError(t, err)
	assert.Equal(t, int64(0), d.Remaining, "the emptier key kept")
}

// TestRestoreWallFarBack: a snapshot whose wall time is so far before the
// restoring wall that the difference overflows int64 nanoseconds owes the
// most refill there is, not a negative one.
func TestRestoreWallFarBack(t *testing.T) {
	s := okSnap()
	s.Wall = math.MinInt64
	s.Buckets[0].Tokens, s.Buckets[0].Units = 0, 0
	e, rep := restored(t, engine.Config{Policy: pol(1, 10, 2), Shards: 1, Clock: clock.NewManual(int64(time.Hour))}, s.encode(), engine.RestoreOptions{})
	assert.Equal(t, time.Duration(math.MaxInt64), rep.Elapsed)
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: 500 * time.Millisecond}, allow(t, e, "a", 1))
}

// TestRestoreReportsSnapshotVersion: a snapshot taken after a cutover and
// restored under the older configuration says so: its report carries the
// version the old engine was last given, above the one the new engine
// answers with.
func TestRestoreReportsSnapshotVersion(t *testing.T) {
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	old, _ := newEngine(t, engine.Config{Policy: v1})
	require.NoError(t, old.ReplacePolicy(context.Background(), policy.Policy{Version: 3, Capacity: 3, TokensPerSecond: 2}, 1))
	allow(t, old, "k", 1)
	e, rep := restored(t, engine.Config{Policy: v1, Clock: clock.NewManual(0)}, takeSnapshot(t, old), engine.RestoreOptions{})
	assert.Equal(t, int64(3), rep.Version)
	assert.Equal(t, int64(1), e.Policy().Version)
	d, err := e.Peek(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, int64(2), d.Remaining, "restored under v1 from v3's balance, no top-up")
}
