package engine_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// eventLog collects the events an engine delivers.
type eventLog struct {
	mu  sync.Mutex
	evs []engine.Event
}

func (l *eventLog) add(ev engine.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
}

func (l *eventLog) get() []engine.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]engine.Event(nil), l.evs...)
}

// TestEventsPeekAndRefundErrors: Peek and Refund are not decisions and are
// never sampled, not even when the shard answers them with an error: such
// an event would report a request (of cost 1, for a Peek) that no caller
// made, indistinguishable from an Allow that failed.
func TestEventsPeekAndRefundErrors(t *testing.T) {
	var log eventLog
	clk := newErrsClock(int64(time.Hour))
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 1, Clock: clk, EventEvery: 1, Events: log.add})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = e.Allow(ctx, "k", 1)
	require.NoError(t, err)
	clk.Set(0) // the clock steps back: the shard refuses every request
	_, err = e.Peek(ctx, "k")
	require.ErrorIs(t, err, engine.ErrClockRegression)
	_, err = e.Refund(ctx, "k", 3)
	require.ErrorIs(t, err, engine.ErrClockRegression)
	_, err = e.Allow(ctx, "k", 2)
	require.ErrorIs(t, err, engine.ErrClockRegression)
	require.NoError(t, e.Close()) // delivers what was sampled
	evs := log.get()
	require.Len(t, evs, 2, "the two Allows, not the Peek nor the Refund: %+v", evs)
	assert.Equal(t, int64(1), evs[0].Cost)
	assert.NoError(t, evs[0].Err)
	assert.Equal(t, int64(2), evs[1].Cost)
	assert.ErrorIs(t, evs[1].Err, engine.ErrClockRegression)
	st := e.Stats().Total
	assert.Equal(t, uint64(3), st.Errors.ClockRegression, "the errors are counted all the same")
}

// TestEventsWhichCalls: with EventEvery 1, the shard samples every request
// it decides, and only those: Allow (and Wait's), Charge and AllowBatch's
// requests, with the errors the shard answered them with. Peek, Refund,
// AllowAll, and errors raised before a request reaches a shard produce no
// event. Each event is what the caller got: key, cost, Decision (Version
// included), error, the key's shard and the shard's reading.
func TestEventsWhichCalls(t *testing.T) {
	var log eventLog
	clk := clock.NewManual(int64(time.Second))
	e, err := engine.New(engine.Config{Policy: pol(3, 5, 1), Shards: 1, MaxKeys: 3, Clock: clk, EventEvery: 1, Events: log.add})
	require.NoError(t, err)
	ctx := context.Background()
	var want []engine.Event
	expect := func(key string, cost int64, d engine.Decision, err error) {
		want = append(want, engine.Event{Key: key, Cost: cost, Decision: d, Err: err, Shard: 0, Reading: clk.Now()})
	}

	d, err := e.Allow(ctx, "a", 2)
	require.NoError(t, err)
	expect("a", 2, d, err)
	d, err = e.Allow(ctx, "a", 4) // denied
	require.NoError(t, err)
	require.False(t, d.Allowed)
	expect("a", 4, d, err)
	d, err = e.Allow(ctx, "a", 6) // above capacity: the shard says so
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	expect("a", 6, d, err)
	d, err = e.Charge(ctx, "b", 7)
	require.NoError(t, err)
	expect("b", 7, d, err)
	reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: " ", Cost: 1}, {Key: "a", Cost: 0}, {Key: "c", Cost: 9}, {Key: "c", Cost: 1}}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, e.AllowBatch(ctx, reqs, out))
	for _, i := range []int{0, 3, 4} { // the bad key and cost never reach the shard
		expect(reqs[i].Key, reqs[i].Cost, out[i].Decision, out[i].Err)
	}
	d, err = e.Allow(ctx, "d", 1) // a fourth key: over MaxKeys
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	expect("d", 1, d, err)

	// None of these is sampled.
	_, err = e.Peek(ctx, "a")
	require.NoError(t, err)
	_, err = e.Refund(ctx, "a", 1)
	require.NoError(t, err)
	_, _, err = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "c", Cost: 1}})
	require.NoError(t, err)
	_, err = e.Allow(ctx, "", 1)
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	_, err = e.Charge(ctx, "a", 0)
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.Allow(canceled, "a", 1)
	require.ErrorIs(t, err, context.Canceled)

	// Wait: one event per Allow it makes, the denial included.
	c, err := e.Peek(ctx, "c")
	require.NoError(t, err)
	done := make(chan struct{})
	var wd engine.Decision
	go func() {
		defer close(done)
		wd, err = e.Wait(ctx, "c", c.Remaining+1)
	}()
	for clk.Waiting() == 0 || len(log.get()) < len(want)+1 { // the Wait's first Allow, denied and delivered
		runtime.Gosched()
	}
	denied := log.get()
	require.Len(t, denied, len(want)+1, "the Wait's first Allow")
	want = append(want, denied[len(want)])
	clk.Advance(time.Second)
	<-done
	require.NoError(t, err)
	expect("c", c.Remaining+1, wd, nil)

	require.NoError(t, e.Close())
	_, err = e.Allow(ctx, "a", 1) // ErrClosed: not sampled
	require.ErrorIs(t, err, engine.ErrClosed)
	got := log.get()
	assert.Equal(t, want, got)
	assert.False(t, got[len(got)-2].Decision.Allowed, "Wait's first Allow was denied")
	for _, ev := range got {
		if ev.Err == nil {
			assert.Equal(t, int64(3), ev.Decision.Version)
		}
	}
}

// TestEventsPerShard: each shard samples one in every EventEvery of its own
// decisions, and an event names the shard of its key.
func TestEventsPerShard(t *testing.T) {
	var log eventLog
	e, err := engine.New(engine.Config{Policy: pol(1, 1000, 1), Shards: 4, Clock: clock.NewManual(0), EventEvery: 3, Events: log.add})
	require.NoError(t, err)
	keys := keysOnShards(t, e, 4)
	ctx := context.Background()
	for i, k := range keys {
		for range 3*(i+1) + 2 { // shard of keys[i]: 3(i+1) + 2 decisions, i+1 sampled
			_, err := e.Allow(ctx, k, 1)
			require.NoError(t, err)
		}
	}
	require.NoError(t, e.Close())
	per := map[string]int{}
	for _, ev := range log.get() {
		assert.Equal(t, e.ShardOf(ev.Key), ev.Shard)
		per[ev.Key]++
	}
	for i, k := range keys {
		assert.Equal(t, i+1, per[k], "key %s", k)
	}
	assert.Zero(t, e.Stats().Total.EventsDropped)
}

// TestEventsCloseDelivers: Close returns only once Events has been called
// with what was buffered, up to EventBuffer events; the rest was dropped and
// counted, and Stats after Close says so exactly.
func TestEventsCloseDelivers(t *testing.T) {
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			var log eventLog
			first := make(chan struct{})
			release := make(chan struct{})
			var once sync.Once
			e, err := engine.New(engine.Config{
				Policy: pol(1, 1000, 1), Shards: shards, Clock: clock.NewManual(0), EventEvery: 1, EventBuffer: 5,
				Events: func(ev engine.Event) {
					once.Do(func() { close(first); <-release })
					log.add(ev)
				},
			})
			require.NoError(t, err)
			ctx := context.Background()
			_, err = e.Allow(ctx, "k0", 1)
			require.NoError(t, err)
			<-first // the deliverer holds the first event; the buffer is empty
			for i := range 40 {
				_, err := e.Allow(ctx, fmt.Sprintf("k%d", i%7), 1)
				require.NoError(t, err)
			}
			closed := make(chan struct{})
			go func() { _ = e.Close(); close(closed) }()
			select {
			case <-closed:
				t.Fatal("Close returned while Events was still running")
			default:
			}
			close(release)
			<-closed
			assert.Len(t, log.get(), 1+5)
			st := e.Stats()
			assert.Equal(t, uint64(40-5), st.Total.EventsDropped)
			assert.Equal(t, uint64(41), st.Total.Allowed)
		})
	}
}

// TestEventsCallingTheEngine: Events may call the engine (all but Close),
// even while Close runs: those calls answer, ErrClosed once it has begun.
func TestEventsCallingTheEngine(t *testing.T) {
	var e *engine.Engine
	var mu sync.Mutex
	var errs []error
	e, err := engine.New(engine.Config{
		Policy: pol(1, 1000, 1), Shards: 2, Clock: clock.NewManual(0), EventEvery: 2,
		Events: func(ev engine.Event) {
			_, err := e.Allow(context.Background(), "audit:"+ev.Key, 1) // sampled too, one in two
			_ = e.Stats()
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 200 {
		_, err := e.Allow(ctx, fmt.Sprintf("k%d", i%5), 1)
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, errs)
	for _, err := range errs {
		if err != nil {
			assert.ErrorIs(t, err, engine.ErrClosed)
		}
	}
}

// TestEventsConfigBounds: EventEvery and EventBuffer out of range are
// ErrInvalidConfig, with or without Events; EventEvery has no upper bound.
func TestEventsConfigBounds(t *testing.T) {
	f := func(engine.Event) {}
	for _, cfg := range []engine.Config{
		{EventEvery: -1}, {EventEvery: math.MinInt}, {EventEvery: -1, Events: f},
		{EventBuffer: -1}, {EventBuffer: math.MinInt}, {EventBuffer: 1<<24 + 1, Events: f},
	} {
		cfg.Policy, cfg.Clock = pol(1, 5, 1), clock.NewManual(0)
		e, err := engine.New(cfg)
		assert.ErrorIs(t, err, engine.ErrInvalidConfig, "EventEvery %d, EventBuffer %d", cfg.EventEvery, cfg.EventBuffer)
		assert.Nil(t, e)
	}
	var log eventLog
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Clock: clock.NewManual(0), Shards: 1, EventEvery: math.MaxInt, EventBuffer: 1, Events: log.add})
	require.NoError(t, err)
	for range 10 {
		_, err := e.Allow(context.Background(), "k", 1)
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	assert.Empty(t, log.get())
}

// TestStatsZeroEngine: a zero or nil Engine counts nothing, before and after Close.
func TestStatsZeroEngine(t *testing.T) {
	var e engine.Engine
	_, err := e.Allow(context.Background(), "k", 1)
	require.ErrorIs(t, err, engine.ErrNotInitialized)
	assert.Equal(t, engine.Stats{}, e.Stats())
	var nilEngine *engine.Engine
	assert.Equal(t, engine.Stats{}, nilEngine.Stats())
	assert.NoError(t, nilEngine.Close())
	assert.Equal(t, engine.Stats{}, nilEngine.Stats(), "after Close too")
}

// TestStatsBatchShortOut: an AllowBatch whose out is too short decides
// nothing and counts nothing, as Stats says.
func TestStatsBatchShortOut(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: 2})
	err := e.AllowBatch(context.Background(), []engine.Request{{Key: "a", Cost: 1}, {Key: "", Cost: 1}}, make([]engine.Result, 1))
	require.ErrorIs(t, err, engine.ErrInvalidConfig)
	st := e.Stats()
	assert.Zero(t, st.Total.Allowed+st.Total.Denied+st.Total.Errors.Sum())
}

// TestStatsExactPerKind: after each call returns, Stats counts it in its
// own field, kind by kind, with no idle shard and no Close: Peek, Refund,
// each error kind from the caller's side and from the shard's, and an
// AllowBatch's requests.
func TestStatsExactPerKind(t *testing.T) {
	clk := newErrsClock(int64(time.Hour))
	e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 3, MaxKeys: 2, Clock: clk, Events: func(engine.Event) {}, EventEvery: 1, EventBuffer: 1})
	require.NoError(t, err)
	defer e.Close()
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	var want engine.ShardStats
	check := func(what string) {
		t.Helper()
		st := e.Stats().Total
		got := engine.ShardStats{Allowed: st.Allowed, Denied: st.Denied, Errors: st.Errors, Peeks: st.Peeks, Refunds: st.Refunds}
		require.Equal(t, want, got, what)
	}
	_, _ = e.Allow(ctx, "a", 1)
	want.Allowed++
	check("allow")
	_, _ = e.Allow(ctx, "a", 5)
	want.Denied++
	check("denied")
	_, _ = e.Peek(ctx, "a")
	want.Peeks++
	check("peek")
	_, _ = e.Refund(ctx, "a", 1)
	want.Refunds++
	check("refund")
	_, _ = e.Refund(ctx, "zz", 1) // not tracked: answered all the same
	want.Refunds++
	check("refund of an untracked key")
	_, _ = e.Charge(ctx, "a", 9)
	want.Allowed++
	check("charge")
	_, _ = e.Allow(ctx, "a", 6)
	want.Errors.InvalidCost++
	check("cost above capacity")
	_, _ = e.Refund(ctx, "a", 0)
	want.Errors.InvalidCost++
	check("refund of 0")
	_, _ = e.Peek(ctx, " ")
	want.Errors.InvalidKey++
	check("peek of a blank key")
	_, _ = e.Peek(canceled, "a")
	want.Errors.Context++
	check("peek, context done")
	var nilCtx context.Context     // a variable, not a literal nil: the misuse tested, which vet would flag
	_, _ = e.Allow(nilCtx, "a", 1) // a nil context is counted as Other
	want.Errors.Other++
	check("nil context")
	_, _ = e.Allow(ctx, "b", 1)
	_, _ = e.Allow(ctx, "c", 1)
	_, _ = e.Allow(ctx, "d", 1)
	want.Allowed++ // a and b fit, c and d do not
	want.Errors.KeyCapacity += 2
	check("key capacity")
	out := make([]engine.Result, 4)
	require.NoError(t, e.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "", Cost: 1}, {Key: "a", Cost: -1}, {Key: "a", Cost: 7}}, out))
	want.Errors.InvalidKey++
	want.Errors.InvalidCost += 2
	if out[0].Decision.Allowed {
		want.Allowed++
	} else {
		want.Denied++
	}
	check("batch")
	clk.Set(0)
	_, _ = e.Peek(ctx, "a")
	_, _ = e.Refund(ctx, "a", 1)
	_, _ = e.Allow(ctx, "a", 1)
	want.Errors.ClockRegression += 3
	check("clock regression")
	require.NoError(t, e.Close())
	_, _ = e.Refund(ctx, "a", 1)
	want.Errors.Closed++
	check("refund after Close")
}
