package engine_test

// Tests of claims of the package doc and the methods' docs that no other
// test checked: the cutover's real-time order for every kind of call, the
// coordinator a Snapshot holds, AllowAll's error indexes and counting,
// the Shards default, what New allocates, how Events is called, and
// ReclaimAfter after Close.

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// voCall is one call's place in the logical time line and the versions it
// saw: lo and hi are the same but for a batch, whose parts may be decided
// under different versions during a cutover.
type voCall struct {
	op                 string
	start, end, lo, hi int64
}

// TestVersionOrderEveryOperation extends TestVersionOrderIsRealTime from
// Allow to every call that answers with a Decision: Peek, Refund, Charge,
// AllowBatch and AllowAll, mixed, on 16 shards, while 40 cutovers run. No
// call sees an older version than one a call that returned before it
// started saw, and every call that starts after ReplacePolicy returns sees
// its version.
func TestVersionOrderEveryOperation(t *testing.T) {
	const workers, cutovers, keys = 6, 40, 200
	seed := ccSeed(t)
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 1000, 1000), Shards: 16})
	ctx := context.Background()
	var seq atomic.Int64
	done := make(chan struct{})
	ticks := make(chan struct{}, workers)
	outs := make([][]voCall, workers)
	problems := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			key := func() string { return fmt.Sprintf("key-%d", rng.IntN(keys)) }
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if i%8 == 0 {
					select {
					case ticks <- struct{}{}:
					default:
					}
				}
				var (
					c   voCall
					d   engine.Decision
					err error
				)
				c.start = seq.Add(1)
				switch rng.IntN(6) {
				case 0:
					c.op = "Allow"
					d, err = e.Allow(ctx, key(), 1)
				case 1:
					c.op = "Peek"
					d, err = e.Peek(ctx, key())
				case 2:
					c.op = "Refund"
					d, err = e.Refund(ctx, key(), 1)
				case 3:
					c.op = "Charge"
					d, err = e.Charge(ctx, key(), 1)
				case 4:
					c.op = "AllowAll"
					d, _, err = e.AllowAll(ctx, []engine.Request{{Key: key(), Cost: 1}, {Key: key(), Cost: 1}, {Key: key(), Cost: 1}})
				case 5:
					c.op = "AllowBatch"
					reqs := []engine.Request{{Key: key(), Cost: 1}, {Key: key(), Cost: 1}, {Key: key(), Cost: 1}}
					var out [3]engine.Result
					err = e.AllowBatch(ctx, reqs, out[:])
					c.lo, c.hi = math.MaxInt64, 0
					for _, r := range out {
						err = cmpOr(err, r.Err)
						c.lo, c.hi = min(c.lo, r.Decision.Version), max(c.hi, r.Decision.Version)
					}
				}
				c.end = seq.Add(1)
				if err != nil {
					problems[w] = append(problems[w], fmt.Sprintf("%s: %v", c.op, err))
					return
				}
				if c.op != "AllowBatch" {
					c.lo, c.hi = d.Version, d.Version
				}
				outs[w] = append(outs[w], c)
			}
		})
	}
	rng := rand.New(rand.NewPCG(seed, 1<<32))
	var reps []voCall
	for v := int64(2); v <= cutovers+1; v++ {
		for range 4 {
			<-ticks
		}
		clk.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
		s := seq.Add(1)
		// A capacity of at least 3: an AllowAll's three requests may name
		// one key, and their summed cost above its capacity is an error.
		err := e.ReplacePolicy(ctx, pol(v, 3+rng.Int64N(998), 1+rng.Int64N(1000)), v-1)
		end := seq.Add(1)
		if err != nil {
			close(done)
			wg.Wait()
			t.Fatalf("seed %d: ReplacePolicy to version %d: %v", seed, v, err)
		}
		reps = append(reps, voCall{op: "ReplacePolicy", start: s, end: end, lo: v, hi: v})
	}
	close(done)
	ccWait(t, &wg, "workers")
	var calls []voCall
	for w := range workers {
		for _, p := range problems[w] {
			t.Errorf("seed %d: %s", seed, p)
		}
		calls = append(calls, outs[w]...)
	}
	ops := map[string]bool{}
	seen := map[int64]bool{}
	for _, c := range calls {
		ops[c.op] = true
		seen[c.hi] = true
	}
	require.Len(t, ops, 6, "seed %d: every kind of call ran", seed)
	require.Greater(t, len(seen), cutovers/2, "seed %d: the calls did not overlap the cutovers", seed)

	byStart := slices.Clone(calls)
	slices.SortFunc(byStart, func(a, b voCall) int { return int(a.start - b.start) })
	byEnd := slices.Clone(calls)
	slices.SortFunc(byEnd, func(a, b voCall) int { return int(a.end - b.end) })
	j := 0
	var newest voCall // the call with the newest version among those that returned
	for _, b := range byStart {
		for ; j < len(byEnd) && byEnd[j].end < b.start; j++ {
			if byEnd[j].hi > newest.hi {
				newest = byEnd[j]
			}
		}
		require.GreaterOrEqual(t, b.lo, newest.hi, "seed %d: %+v returned before %+v started", seed, newest, b)
	}
	for _, r := range reps {
		for _, c := range calls {
			if c.start > r.end {
				require.GreaterOrEqual(t, c.lo, r.lo, "seed %d: %+v started after ReplacePolicy %+v returned", seed, c, r)
			}
		}
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// TestSnapshotHoldsTheCoordinator: while a Snapshot runs (here, blocked on
// its writer with keys still to copy), no cutover and no sweep runs:
// ReplacePolicy and EvictFull wait, the policy stays, and full buckets stay
// tracked; once the Snapshot returns, both go ahead.
func TestSnapshotHoldsTheCoordinator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		keys := longKeys(manyKeys)
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 2})
		ctx := context.Background()
		fill(t, e, keys, 1)
		clk.Advance(time.Second) // every bucket full again: a sweep would evict them all
		w := newBlockingWriter(nil)
		snapped := make(chan error, 1)
		go func() { snapped <- e.Snapshot(ctx, w) }()
		<-w.blocked
		replaced := make(chan error, 1)
		go func() { replaced <- e.ReplacePolicy(ctx, pol(2, 10, 2), 1) }()
		type evicted struct {
			n   int
			err error
		}
		swept := make(chan evicted, 1)
		go func() { n, err := e.EvictFull(ctx); swept <- evicted{n, err} }()
		synctest.Wait()
		assert.Zero(t, len(replaced), "ReplacePolicy returned during a Snapshot")
		assert.Zero(t, len(swept), "EvictFull returned during a Snapshot")
		assert.Equal(t, int64(1), e.Policy().Version)
		assert.Equal(t, len(keys), e.KeyCount())

		close(w.release)
		require.NoError(t, <-snapped)
		s, err := decodeSnap(w.buf.Bytes())
		require.NoError(t, err)
		assert.Equal(t, uint64(1), s.Version, "the snapshot's policy")
		assert.Len(t, s.Buckets, len(keys))
		require.NoError(t, <-replaced)
		r := <-swept
		require.NoError(t, r.err)
		assert.Equal(t, len(keys), r.n)
		assert.Equal(t, int64(2), e.Policy().Version)
	})
}

// TestAllowAllErrorOrderAndIndex: the errors AllowAll finds before any
// shard name no request (-1) but the bad key or cost; a bad key or cost
// comes before ErrClosed, and ErrClosed before a nil or done context.
func TestAllowAllErrorOrderAndIndex(t *testing.T) {
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 4})
	one := []engine.Request{{Key: "a", Cost: 1}}
	type want struct {
		err error
		at  int
	}
	check := func(name string, c context.Context, reqs []engine.Request, w want) {
		t.Helper()
		d, at, err := e.AllowAll(c, reqs)
		require.ErrorIs(t, err, w.err, name)
		assert.Equal(t, w.at, at, name)
		assert.Zero(t, d, name)
	}
	check("no requests", ctx, nil, want{engine.ErrAllowAllSize, -1})
	check("too many", ctx, make([]engine.Request, engine.MaxAllowAll+1), want{engine.ErrAllowAllSize, -1})
	check("nil context", nilCtx, one, want{engine.ErrNilContext, -1})
	check("done context", canceled, one, want{context.Canceled, -1})
	require.NoError(t, e.Close())
	check("closed, no requests", ctx, nil, want{engine.ErrAllowAllSize, -1})
	check("closed, bad key", ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: " ", Cost: 1}}, want{engine.ErrInvalidKey, 1})
	check("closed, bad cost", ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 0}}, want{engine.ErrInvalidCost, 1})
	check("closed", ctx, one, want{engine.ErrClosed, -1})
	check("closed, nil context", nilCtx, one, want{engine.ErrClosed, -1})
	check("closed, done context", canceled, one, want{engine.ErrClosed, -1})
	assert.Zero(t, e.KeyCount())
}

// TestAllowAllShardErrorsCountedPerCall: an AllowAll that fails with an
// error its keys' shards find (ErrClockRegression) or with ErrKeyCapacity
// counts one error of its kind in Stats.AllowAll and nothing in the shards'
// counts: no decision and no error there.
func TestAllowAllShardErrorsCountedPerCall(t *testing.T) {
	ctx := context.Background()
	clk := newErrsClock(int64(time.Hour))
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 2, MaxKeys: 2, Clock: clk})
	keys := keysOnShards(t, e, 2)
	for _, k := range keys {
		_, err := e.Allow(ctx, k, 1)
		require.NoError(t, err)
	}
	before := e.Stats().Total

	_, at, err := e.AllowAll(ctx, []engine.Request{{Key: keys[0], Cost: 1}, {Key: "new", Cost: 1}})
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	assert.Equal(t, 1, at)
	clk.Set(0)
	_, at, err = e.AllowAll(ctx, []engine.Request{{Key: keys[0], Cost: 1}, {Key: keys[1], Cost: 1}})
	require.ErrorIs(t, err, engine.ErrClockRegression)
	assert.Equal(t, 0, at)

	require.NoError(t, e.Close()) // the shards' final counts published
	st := e.Stats()
	assert.Equal(t, engine.AllowAllStats{Errors: engine.Errors{KeyCapacity: 1, ClockRegression: 1}}, st.AllowAll)
	assert.Equal(t, before.Allowed, st.Total.Allowed)
	assert.Equal(t, before.Denied, st.Total.Denied)
	assert.Zero(t, st.Total.Errors.Sum(), "the calls' errors are counted per call, in AllowAll")
}

// TestShardsDefaultIsGOMAXPROCS: Config.Shards 0 means GOMAXPROCS, read
// when New runs.
func TestShardsDefaultIsGOMAXPROCS(t *testing.T) {
	prev := runtime.GOMAXPROCS(5)
	defer runtime.GOMAXPROCS(prev)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1)})
	assert.Len(t, e.Stats().Shards, 5)
}

// TestNewAllocatesByShardsAndEventBuffer: New allocates in proportion to
// the shard count and to EventBuffer, not to MaxKeys: an engine bounded at
// math.MaxInt keys costs what one bounded at 1 does, while EventBuffer's
// events are allocated whole, at least 112 bytes each (84 on 32-bit
// platforms).
func TestNewAllocatesByShardsAndEventBuffer(t *testing.T) {
	allocated := func(cfg engine.Config) uint64 {
		t.Helper()
		cfg.Policy, cfg.Shards, cfg.Clock = pol(1, 10, 1), 2, clock.NewManual(0)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e, err := engine.New(cfg)
		runtime.ReadMemStats(&after)
		require.NoError(t, err)
		require.NoError(t, e.Close())
		return after.TotalAlloc - before.TotalAlloc
	}
	// Other goroutines (the race detector's among them) may allocate during
	// a measurement, which only adds to it: the least of a few is the
	// engine's own. A single one ran up to 2 KiB high, and the comparison
	// with EventBuffer's then failed by a few hundred bytes.
	small := allocated(engine.Config{MaxKeys: 1})
	for range 4 {
		small = min(small, allocated(engine.Config{MaxKeys: 1}))
	}
	huge := allocated(engine.Config{MaxKeys: math.MaxInt})
	assert.Less(t, huge, small+64<<10, "MaxKeys math.MaxInt: %d bytes, MaxKeys 1: %d", huge, small)
	const events = 1 << 16
	perEvent := uint64(112) // Config.EventBuffer's figures
	if strconv.IntSize == 32 {
		perEvent = 84
	}
	buffered := allocated(engine.Config{MaxKeys: 1, Events: func(engine.Event) {}, EventBuffer: events})
	assert.GreaterOrEqual(t, buffered, small+perEvent*events, "EventBuffer %d: %d bytes, none: %d", events, buffered, small)
}

// TestEventsOneAtATime: Events is called from one goroutine, one event at
// a time, however many shards sample at once.
func TestEventsOneAtATime(t *testing.T) {
	var inside, most, calls atomic.Int64
	f := func(engine.Event) {
		n := inside.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		runtime.Gosched() // give another call the chance to overlap this one
		calls.Add(1)
		inside.Add(-1)
	}
	e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), Shards: 8, Clock: clock.NewManual(0), Events: f, EventEvery: 1})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				_, _ = e.Allow(context.Background(), fmt.Sprintf("g%d-%d", g, i%50), 1)
			}
		})
	}
	wg.Wait()
	require.NoError(t, e.Close())
	st := e.Stats()
	require.Equal(t, uint64(8*2000), uint64(calls.Load())+st.Total.EventsDropped, "every decision sampled: delivered or dropped")
	assert.NotZero(t, calls.Load())
	assert.Equal(t, int64(1), most.Load(), "calls of Events overlapped")
}

// TestReclaimAfterAfterClose: ReclaimAfter answers after Close, with the
// schedule it had when the engine closed.
func TestReclaimAfterAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), MaxKeys: 2, Shards: 2, Clock: clk, SweepEvery: time.Hour})
		require.NoError(t, err)
		ctx := context.Background()
		for _, k := range []string{"a", "b"} {
			_, err := e.Allow(ctx, k, 5) // full again at 5 s
			require.NoError(t, err)
		}
		_, err = e.Allow(ctx, "c", 1)
		require.ErrorIs(t, err, engine.ErrKeyCapacity)
		synctest.Wait() // the pressure sweep it started has run
		clk.Set(int64(time.Second))
		d, ok := e.ReclaimAfter()
		require.True(t, ok)
		require.Equal(t, 4*time.Second, d)
		require.NoError(t, e.Close())
		d, ok = e.ReclaimAfter()
		assert.True(t, ok)
		assert.Equal(t, 4*time.Second, d, "the last schedule, from now")
		clk.Set(int64(3 * time.Second))
		d, _ = e.ReclaimAfter()
		assert.Equal(t, 2*time.Second, d)
	})
}

// TestBatchWithNoPartReportsCallerState: an AllowBatch none of whose
// requests needs a shard (none, or each with a bad key) still returns the
// caller's or the engine's state, as the doc says, while each bad request
// keeps its own error.
func TestBatchWithNoPartReportsCallerState(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2})
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	out := make([]engine.Result, 1)
	require.ErrorIs(t, e.AllowBatch(canceled, []engine.Request{{Key: "", Cost: 1}}, out), context.Canceled)
	require.ErrorIs(t, out[0].Err, engine.ErrInvalidKey)
	require.ErrorIs(t, e.AllowBatch(nilCtx, nil, nil), engine.ErrNilContext)
	require.NoError(t, e.AllowBatch(t.Context(), nil, nil))
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.AllowBatch(t.Context(), nil, nil), engine.ErrClosed)
}

// TestShardsDocStatesMailboxAndMemory: Config.Shards's doc gives the
// mailbox's bound, the one default of New a user cannot set, and the memory
// New allocates per shard; both figures are the code's.
func TestShardsDocStatesMailboxAndMemory(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, parser.ParseComments)
	require.NoError(t, err)
	var doc string
	ast.Inspect(f, func(n ast.Node) bool {
		if fl, ok := n.(*ast.Field); ok && len(fl.Names) == 1 && fl.Names[0].Name == "Shards" {
			doc = strings.Join(strings.Fields(fl.Doc.Text()), " ")
		}
		return doc == ""
	})
	assert.Contains(t, doc, fmt.Sprintf("holds up to %d single requests and, apart from them, %d batch parts", engine.MailboxSize, engine.MailboxSize))

	allocated := func(shards int) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e, err := engine.New(engine.Config{Policy: pol(1, 10, 1), Shards: shards, Clock: clock.NewManual(0)})
		runtime.ReadMemStats(&after)
		require.NoError(t, err)
		require.NoError(t, e.Close())
		return after.TotalAlloc - before.TotalAlloc
	}
	perShard := (allocated(65) - allocated(1)) / 64
	assert.Contains(t, doc, "New allocates about 22 KiB per shard on 64-bit platforms (1.4 GiB at 65536) and 12 KiB on 32-bit ones")
	want := 22 << 10
	if strconv.IntSize == 32 {
		want = 12 << 10
	}
	assert.InDelta(t, want, perShard, 4<<10, "bytes New allocates per shard")
}
