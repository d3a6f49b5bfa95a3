package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// keysOnShards returns n keys owned by n different shards of e.
func keysOnShards(t *testing.T, e *engine.Engine, n int) []string {
	t.Helper()
	seen := map[int]bool{}
	var keys []string
	for i := 0; len(keys) < n; i++ {
		require.Less(t, i, 100000, "not enough shards for %d keys", n)
		k := fmt.Sprintf("key-%d", i)
		if s := e.ShardOf(k); !seen[s] {
			seen[s] = true
			keys = append(keys, k)
		}
	}
	return keys
}

func peekKeys(t *testing.T, e *engine.Engine, keys []string) []engine.Decision {
	t.Helper()
	var out []engine.Decision
	for _, k := range keys {
		d, err := e.Peek(context.Background(), k)
		require.NoError(t, err)
		out = append(out, d)
	}
	return out
}

// TestAllowAllAllOrNothing: admitted, every key pays; refused, no key does,
// and every balance is exactly as before.
func TestAllowAllAllOrNothing(t *testing.T) {
	ctx := context.Background()
	for _, shards := range []int{1, 2, 16} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
			keys := keysOnShards(t, e, min(3, shards))
			for len(keys) < 3 {
				keys = append(keys, fmt.Sprintf("extra-%d", len(keys)))
			}
			reqs := []engine.Request{{Key: keys[0], Cost: 2}, {Key: keys[1], Cost: 5}, {Key: keys[2], Cost: 1}}
			d, at, err := e.AllowAll(ctx, reqs)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			assert.Equal(t, 1, at, "the fewest tokens left: 5")
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 5, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d)
			got := peekKeys(t, e, keys)
			assert.Equal(t, []int64{8, 5, 9}, []int64{got[0].Remaining, got[1].Remaining, got[2].Remaining})

			// keys[1] holds 5: asking 6 refuses the whole call.
			clk.Set(int64(500 * time.Millisecond))
			before := peekKeys(t, e, keys)
			reqs[1].Cost = 6
			d, at, err = e.AllowAll(ctx, reqs)
			require.NoError(t, err)
			assert.False(t, d.Allowed)
			assert.Equal(t, 1, at)
			assert.Equal(t, 500*time.Millisecond, d.RetryAfter, "5.5 tokens held, 6 asked, at 1/s")
			assert.Equal(t, before, peekKeys(t, e, keys), "a refusal takes nothing")
		})
	}
}

// TestAllowAllRepeatedKeys: requests for one key add up.
func TestAllowAllRepeatedKeys(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 4})
	d, at, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 4}, {Key: "b", Cost: 1}, {Key: "a", Cost: 4}})
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, 0, at, "a has 2 left, the first request for it binds")
	assert.Equal(t, int64(2), d.Remaining)
	d, at, err = e.AllowAll(ctx, []engine.Request{{Key: "b", Cost: 1}, {Key: "a", Cost: 1}, {Key: "a", Cost: 2}})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, 1, at)
	assert.Equal(t, time.Second, d.RetryAfter)
	_, at, err = e.AllowAll(ctx, []engine.Request{{Key: "b", Cost: 1}, {Key: "c", Cost: 6}, {Key: "c", Cost: 5}})
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "a sum above the capacity")
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	assert.Equal(t, 1, at)
	assert.Equal(t, int64(9), peekKeys(t, e, []string{"b"})[0].Remaining, "an error takes nothing")
}

// TestAllowAllErrors: the first invalid request, by the error rules, fails
// the call and changes nothing.
func TestAllowAllErrors(t *testing.T) {
	ctx := context.Background()
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 4, MaxKeys: 3})
	_, _, err := e.AllowAll(ctx, nil)
	require.ErrorIs(t, err, engine.ErrAllowAllSize)
	_, _, err = e.AllowAll(ctx, make([]engine.Request, engine.MaxAllowAll+1))
	require.ErrorIs(t, err, engine.ErrAllowAllSize)
	_, at, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 0}, {Key: " ", Cost: 1}})
	require.ErrorIs(t, err, engine.ErrInvalidKey, "keys are checked before costs")
	assert.Equal(t, 1, at)
	_, at, err = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 0}})
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	assert.Equal(t, 1, at)
	_, _, err = e.AllowAll(nilCtx, []engine.Request{{Key: "a", Cost: 1}})
	require.ErrorIs(t, err, engine.ErrNilContext)
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = e.AllowAll(done, []engine.Request{{Key: "a", Cost: 1}})
	require.ErrorIs(t, err, context.Canceled)

	// Room for 3 keys: 4 new ones fail at the first past the bound, and no
	// key is created; a cost above capacity on any shard comes first.
	four := []engine.Request{{Key: "w", Cost: 1}, {Key: "x", Cost: 1}, {Key: "y", Cost: 1}, {Key: "z", Cost: 1}}
	_, _, err = e.AllowAll(ctx, four)
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	assert.Zero(t, e.KeyCount())
	_, at, err = e.AllowAll(ctx, append(four, engine.Request{Key: "v", Cost: 11}))
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	assert.Equal(t, 4, at)
	_, _, err = e.AllowAll(ctx, four[:3])
	require.NoError(t, err)
	assert.Equal(t, 3, e.KeyCount())

	clk.Set(10)
	require.NoError(t, e.Close())
	_, _, err = e.AllowAll(ctx, four[:1])
	require.ErrorIs(t, err, engine.ErrClosed)
	var zero engine.Engine
	_, _, err = zero.AllowAll(ctx, four[:1])
	require.ErrorIs(t, err, engine.ErrNotInitialized)
}

// TestAllowAllBands: each key's answer is Allow's for its summed cost, band
// and all; the binding request names its band.
func TestAllowAllBands(t *testing.T) {
	ctx := context.Background()
	p := dailyPolicy(t, 1)
	e, _ := newEngine(t, engine.Config{Policy: p, Shards: 4})
	for range 3 {
		_, _, err := e.AllowAll(ctx, []engine.Request{{Key: "u", Cost: 5}, {Key: "t", Cost: 1}})
		require.NoError(t, err)
		_, err = e.EvictFull(ctx) // nothing is full: the daily band is not
		require.NoError(t, err)
	}
	d, at, err := e.AllowAll(ctx, []engine.Request{{Key: "t", Cost: 1}, {Key: "u", Cost: 1}})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, 1, at)
	assert.Equal(t, "", d.Band, "u's primary is empty, its daily band has 5 left")
}

// TestAllowAllNeverCostsOthers: a refused AllowAll takes nothing, so
// concurrent Allows on its keys, at one instant, get exactly what they
// would get alone.
func TestAllowAllNeverCostsOthers(t *testing.T) {
	ctx := context.Background()
	for _, shards := range []int{1, 2, 16} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 1000, 1), Shards: shards})
			_, err := e.Allow(ctx, "empty", 1000)
			require.NoError(t, err)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, _, err := e.AllowAll(ctx, []engine.Request{{Key: "hot", Cost: 7}, {Key: "empty", Cost: 1}})
					if err != nil || d.Allowed {
						t.Errorf("AllowAll: %v %+v, want a refusal", err, d)
						return
					}
				}
			}()
			for i := range 1000 {
				d, err := e.Allow(ctx, "hot", 1)
				require.NoError(t, err)
				require.True(t, d.Allowed, "Allow %d refused: the refused AllowAlls took tokens", i)
			}
			close(stop)
			wg.Wait()
		})
	}
}

// TestAllowAllNoDeadlock: many callers, random overlapping keys in random
// orders, cutovers, sweeps and snapshots racing them, then Close: every
// call returns, and goleak (TestMain) finds no goroutine left.
func TestAllowAllNoDeadlock(t *testing.T) {
	for _, shards := range []int{1, 2, 16} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ctx := context.Background()
			e, err := engine.New(engine.Config{Policy: pol(1, 100, 1000), Shards: shards, Clock: clock.NewMonotonic(), SweepEvery: time.Millisecond})
			require.NoError(t, err)
			const callers, calls = 16, 400
			var wg, admins sync.WaitGroup
			stop := make(chan struct{})
			var mu sync.Mutex
			admitted, refused, failed := 0, 0, 0
			var admittedReqs, refusedReqs uint64 // the requests of those calls: their decisions
			for g := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 1))
					for range calls {
						reqs := make([]engine.Request, 1+r.IntN(6))
						for i := range reqs {
							reqs[i] = engine.Request{Key: fmt.Sprintf("k%d", r.IntN(24)), Cost: 1 + r.Int64N(20)}
						}
						d, _, err := e.AllowAll(ctx, reqs)
						mu.Lock()
						switch {
						case err == nil && d.Allowed:
							admitted++
							admittedReqs += uint64(len(reqs))
						case err == nil:
							refused++
							refusedReqs += uint64(len(reqs))
						default:
							failed++
						}
						mu.Unlock()
					}
				}()
			}
			admins.Add(1)
			go func() { // cutovers, sweeps and snapshots racing the holds, until the callers are done
				defer admins.Done()
				for v := int64(2); ; v++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := e.ReplacePolicy(ctx, pol(v, 100+v%7, 1000), v-1); err != nil {
						t.Errorf("ReplacePolicy: %v", err)
						return
					}
					if _, err := e.EvictFull(ctx); err != nil {
						t.Errorf("EvictFull: %v", err)
						return
					}
					if err := e.Snapshot(ctx, discard{}); err != nil {
						t.Errorf("Snapshot: %v", err)
						return
					}
				}
			}()
			done := make(chan struct{})
			go func() { wg.Wait(); close(stop); admins.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second): // a bound on a hang, not a wait for success
				t.Fatal("a call did not return: deadlock")
			}
			require.NoError(t, e.Close())
			st := e.Stats()
			t.Logf("admitted %d, refused %d, errors %d; holds %d, given up %d", admitted, refused, failed, st.Total.Holds, st.Total.HoldsAborted)
			assert.Zero(t, failed)
			assert.Equal(t, callers*calls, admitted+refused)
			assert.Positive(t, admitted)
			assert.Positive(t, refused)
			// Every request of every decided call is one decision, counted
			// once whatever holds were given up and taken again.
			assert.Equal(t, admittedReqs, st.Total.Allowed)
			assert.Equal(t, refusedReqs, st.Total.Denied)
			assert.Equal(t, engine.AllowAllStats{Admitted: uint64(admitted), Refused: uint64(refused)}, st.AllowAll)
		})
	}
}

// TestAllowAllCloseRaces: Close while callers hold shards; every call
// returns, with an answer or ErrClosed.
func TestAllowAllCloseRaces(t *testing.T) {
	ctx := context.Background()
	for range 20 {
		e, err := engine.New(engine.Config{Policy: pol(1, 1000, 1000), Shards: 8, Clock: clock.NewMonotonic()})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var answered atomic.Int64
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					reqs := []engine.Request{{Key: fmt.Sprintf("a%d", (g+i)%5), Cost: 1}, {Key: fmt.Sprintf("b%d", i%7), Cost: 1}, {Key: "c", Cost: 1}}
					if _, _, err := e.AllowAll(ctx, reqs); err != nil {
						if err != engine.ErrClosed {
							t.Errorf("AllowAll: %v", err)
						}
						return
					}
					answered.Add(1)
				}
			}()
		}
		for answered.Load() < 50 { // Close once calls are under way
			runtime.Gosched()
		}
		require.NoError(t, e.Close())
		wg.Wait()
	}
}

// TestAllowAllClockRegression: a shard whose reading is older than one it
// acted on refuses the whole call, which changes nothing.
func TestAllowAllClockRegression(t *testing.T) {
	ctx := context.Background()
	clk := &errsClock{}
	clk.now.Store(1000)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2, Clock: clk})
	keys := keysOnShards(t, e, 2)
	_, err := e.Allow(ctx, keys[1], 1)
	require.NoError(t, err)
	clk.now.Store(500)
	_, at, err := e.AllowAll(ctx, []engine.Request{{Key: keys[0], Cost: 1}, {Key: keys[1], Cost: 1}})
	require.ErrorIs(t, err, engine.ErrClockRegression)
	assert.Equal(t, 0, at, "the clock's fault: the first request")
	assert.Equal(t, 1, e.KeyCount(), "keys[0] was not created")
}

// TestAllowAllFailureKeepsReadings: a call that fails changes no shard's
// observed time, even on the shards it held, so a later reading between
// the old one and the failed call's is no regression.
func TestAllowAllFailureKeepsReadings(t *testing.T) {
	ctx := context.Background()
	for _, first := range []int{0, 1} { // the failing key on the later shard, then the earlier
		clk := &errsClock{}
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2, Clock: clk})
		keys := keysOnShards(t, e, 2)
		ok, bad := keys[first], keys[1-first]
		_, err := e.Allow(ctx, ok, 1)
		require.NoError(t, err)
		clk.now.Store(int64(10 * time.Second))
		_, at, err := e.AllowAll(ctx, []engine.Request{{Key: ok, Cost: 1}, {Key: bad, Cost: 11}})
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
		assert.Equal(t, 1, at)
		clk.now.Store(int64(5 * time.Second))
		_, err = e.Allow(ctx, ok, 1)
		require.NoError(t, err, "the failed AllowAll moved a shard's reading")
	}
}

// TestAllowAllStats: each call is counted once, by its outcome.
func TestAllowAllStats(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2})
	_, _, _ = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 10}, {Key: "b", Cost: 1}})
	_, _, _ = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
	_, _, _ = e.AllowAll(ctx, []engine.Request{{Key: "", Cost: 1}})
	_, _, _ = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 11}})
	st := e.Stats()
	assert.Equal(t, engine.AllowAllStats{Admitted: 1, Refused: 1, Errors: engine.Errors{InvalidKey: 1, InvalidCost: 1}}, st.AllowAll)
	assert.Zero(t, st.Caller.Sum(), "AllowAll's errors are its own")
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestAllowAllDecisions: each request of an AllowAll that returns a
// Decision is counted as a decision by its key's shard, allowed for every
// request when the call is admitted and denied for every request when it
// is refused; a call that fails counts none. Single Allows beside them
// count as ever.
func TestAllowAllDecisions(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2})
	keys := keysOnShards(t, e, 2)
	a, b := keys[0], keys[1]
	sa, sb := e.ShardOf(a), e.ShardOf(b)

	d, _, err := e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 2}, {Key: a, Cost: 3}, {Key: b, Cost: 1}})
	require.NoError(t, err)
	require.True(t, d.Allowed) // a: 5 left, b: 9
	d, _, err = e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 6}, {Key: b, Cost: 1}})
	require.NoError(t, err)
	require.False(t, d.Allowed, "a holds 5") // nothing taken: b keeps 9
	_, _, err = e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 1}, {Key: b, Cost: 11}})
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	d, err = e.Allow(ctx, b, 9)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = e.Allow(ctx, b, 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)

	require.NoError(t, e.Close()) // the commits carried out and published
	st := e.Stats()
	assert.Equal(t, uint64(2), st.Shards[sa].Allowed, "a's two requests of the admitted call")
	assert.Equal(t, uint64(1), st.Shards[sa].Denied)
	assert.Equal(t, uint64(1+1), st.Shards[sb].Allowed, "b's request of the admitted call, and an Allow")
	assert.Equal(t, uint64(1+1), st.Shards[sb].Denied, "b's request of the refused call, and an Allow")
	assert.Equal(t, uint64(4), st.Total.Allowed)
	assert.Equal(t, uint64(3), st.Total.Denied)
	assert.Zero(t, st.Total.Errors.Sum(), "AllowAll's errors are counted per call, in AllowAll")
	assert.Equal(t, engine.AllowAllStats{Admitted: 1, Refused: 1, Errors: engine.Errors{InvalidCost: 1}}, st.AllowAll)
}

// TestAllowAllRefusedAtExactRoom: a refused AllowAll whose new keys exactly
// fill the room left under MaxKeys is a refusal, not ErrKeyCapacity (room
// for every new key exists), and creates no key.
func TestAllowAllRefusedAtExactRoom(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2, MaxKeys: 2})
	d, err := e.Allow(ctx, "a", 10) // drain a; one slot left
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, at, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
	require.NoError(t, err, "one new key, one free slot: room for it")
	assert.False(t, d.Allowed)
	assert.Equal(t, 0, at)
	assert.Equal(t, 1, e.KeyCount(), "a refused call creates nothing")
}

// TestAllowAllKeyCapacityNamesFirstKeyPastRoom: at the key bound, AllowAll
// fails with ErrKeyCapacity at the first new key, in request order, past
// the room the bound has: tracked keys and repeats of a new key take no
// room of their own. Nothing changes.
func TestAllowAllKeyCapacityNamesFirstKeyPastRoom(t *testing.T) {
	ctx := context.Background()
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards, MaxKeys: 3})
			_, err := e.Allow(ctx, "old", 4)
			require.NoError(t, err)
			before := peekKeys(t, e, []string{"old"})
			// Room for 2 new keys: w and x fit, y (request 4) is past it.
			reqs := []engine.Request{{Key: "w", Cost: 1}, {Key: "old", Cost: 1}, {Key: "w", Cost: 1}, {Key: "x", Cost: 1}, {Key: "y", Cost: 1}, {Key: "z", Cost: 1}}
			d, at, err := e.AllowAll(ctx, reqs)
			require.ErrorIs(t, err, engine.ErrKeyCapacity)
			assert.Equal(t, 4, at, "y is the first new key past the room of 2")
			assert.Equal(t, engine.Decision{}, d)
			assert.Equal(t, 1, e.KeyCount(), "no key created")
			assert.Equal(t, before, peekKeys(t, e, []string{"old"}), "nothing taken")

			// With no room at all, the first new key is at fault.
			_, err = e.Allow(ctx, "a", 1)
			require.NoError(t, err)
			_, err = e.Allow(ctx, "b", 1)
			require.NoError(t, err)
			_, at, err = e.AllowAll(ctx, []engine.Request{{Key: "old", Cost: 1}, {Key: "c", Cost: 1}})
			require.ErrorIs(t, err, engine.ErrKeyCapacity)
			assert.Equal(t, 1, at)
		})
	}
}

// firstReadAhead is a Manual clock whose first reading after arm is ahead
// of it by ahead; every other reading is the Manual's own. An AllowAll over
// keys of several shards then finds its holds at different readings.
type firstReadAhead struct {
	*clock.Manual
	armed atomic.Bool
	ahead int64
}

func (c *firstReadAhead) arm(ahead time.Duration) {
	c.ahead = int64(ahead)
	c.armed.Store(true)
}

func (c *firstReadAhead) Now() int64 {
	if c.armed.CompareAndSwap(true, false) {
		return c.Manual.Now() + c.ahead
	}
	return c.Manual.Now()
}

// TestAllowAllDecidesAtLatestHoldReading: when the shards holding an
// AllowAll's keys read the clock at different instants, the call is
// decided at the latest of those readings, whichever shard took it: keys
// that hold their cost only at that reading are admitted, with the
// balances of that instant. Deciding earlier would put the call before a
// reading a shard had already taken.
func TestAllowAllDecidesAtLatestHoldReading(t *testing.T) {
	ctx := context.Background()
	for trial := range 20 {
		shards := 2 + trial%3
		clk := &firstReadAhead{Manual: clock.NewManual(0)}
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 1, 1), Shards: shards, Clock: clk})
		keys := keysOnShards(t, e, shards)
		var reqs []engine.Request
		for _, k := range keys {
			d, err := e.Allow(ctx, k, 1) // drained at 0, one token again at 1s
			require.NoError(t, err)
			require.True(t, d.Allowed)
			reqs = append(reqs, engine.Request{Key: k, Cost: 1})
		}
		clk.Set(int64(500 * time.Millisecond))
		clk.arm(500 * time.Millisecond) // one shard's hold reads 1s, the others 0.5s
		d, _, err := e.AllowAll(ctx, reqs)
		require.NoError(t, err)
		require.False(t, clk.armed.Load(), "a shard took the reading ahead")
		assert.True(t, d.Allowed, "trial %d (%d shards): at 1s, the latest reading, every key holds its token", trial, shards)
		assert.Equal(t, int64(0), d.Remaining, "trial %d", trial)
		assert.Equal(t, time.Second, d.ResetAfter, "trial %d: empty at 1s", trial)
		require.NoError(t, e.Close())
	}
}
