package promstats_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/engine/promstats/internal/promtest"
	"github.com/tokenshard/tokenshard/policy"
)

// pol builds a policy without field names cluttering every call.
func pol(version, capacity, rate int64) policy.Policy {
	return policy.Policy{Version: version, Capacity: capacity, TokensPerSecond: rate}
}

// newEngine starts an engine on a Manual clock at 0 and closes it when the
// test ends (closing again is harmless).
func newEngine(t *testing.T, cfg engine.Config) (*engine.Engine, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(0)
	cfg.Clock = clk
	e, err := engine.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, clk
}

// newCollector makes a Collector of e with opts.
func newCollector(t *testing.T, e *engine.Engine, opts ...promstats.Option) *promstats.Collector {
	t.Helper()
	c, err := promstats.New(e, opts...)
	require.NoError(t, err)
	return c
}

// scrape is promtest.Scrape.
func scrape(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	return promtest.Scrape(t, c)
}

// sample is one series: its labels and value.
type sample struct {
	labels string // name=value pairs, comma-separated, in label order
	value  float64
}

// series returns the type and samples of the family called name.
func series(t *testing.T, mfs map[string]*dto.MetricFamily, name string) (dto.MetricType, []sample) {
	t.Helper()
	mf, ok := mfs[name]
	require.True(t, ok, "no metric %s", name)
	var out []sample
	for _, m := range mf.GetMetric() {
		var s sample
		for i, l := range m.GetLabel() {
			if i > 0 {
				s.labels += ","
			}
			s.labels += l.GetName() + "=" + l.GetValue()
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			s.value = m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			s.value = m.GetGauge().GetValue()
		default:
			t.Fatalf("%s is a %v", name, mf.GetType())
		}
		out = append(out, s)
	}
	return mf.GetType(), out
}

// want is what one metric family should hold.
type want struct {
	typ     dto.MetricType
	samples []sample
}

func counter(samples ...sample) want { return want{dto.MetricType_COUNTER, samples} }
func gauge(samples ...sample) want   { return want{dto.MetricType_GAUGE, samples} }
func one[T uint64 | int64 | int](v T) sample {
	return sample{"", float64(v)}
}

// fromStats spells out, from a reading of Stats, what an unlabelled
// Collector exports.
func fromStats(st engine.Stats, maxKeys int) map[string]want {
	t := st.Total
	er := t.Errors
	return map[string]want{
		"tokenshard_decisions_total": counter(sample{"outcome=allowed", float64(t.Allowed)}, sample{"outcome=denied", float64(t.Denied)}),
		"tokenshard_peeks_total":     counter(one(t.Peeks)),
		"tokenshard_refunds_total":   counter(one(t.Refunds)),
		"tokenshard_errors_total": counter(
			sample{"kind=clock_regression", float64(er.ClockRegression)},
			sample{"kind=closed", float64(er.Closed)},
			sample{"kind=context", float64(er.Context)},
			sample{"kind=invalid_cost", float64(er.InvalidCost)},
			sample{"kind=invalid_key", float64(er.InvalidKey)},
			sample{"kind=key_capacity", float64(er.KeyCapacity)},
			sample{"kind=other", float64(er.Other)},
		),
		"tokenshard_keys":                  gauge(one(t.Keys)),
		"tokenshard_keys_max":              gauge(one(maxKeys)),
		"tokenshard_mailbox_depth":         gauge(one(t.MailboxDepth + t.Waiting)),
		"tokenshard_mailbox_high_water":    gauge(one(t.MailboxHighWater)),
		"tokenshard_shard_cutovers_total":  counter(one(t.Cutovers)),
		"tokenshard_shard_sweeps_total":    counter(one(t.Sweeps)),
		"tokenshard_pressure_sweeps_total": counter(one(st.PressureSweeps)),
		"tokenshard_sweep_failures_total":  counter(one(st.SweepFailures)),
		"tokenshard_evictions_total":       counter(one(t.Evicted)),
		"tokenshard_events_dropped_total":  counter(one(t.EventsDropped)),
		"tokenshard_allowall_calls_total": counter(sample{"outcome=admitted", float64(st.AllowAll.Admitted)},
			sample{"outcome=refused", float64(st.AllowAll.Refused)}),
		"tokenshard_allowall_errors_total": kinds(st.AllowAll.Errors),
		"tokenshard_holds_total":           counter(one(t.Holds)),
		"tokenshard_holds_aborted_total":   counter(one(t.HoldsAborted)),
	}
}

// kinds is an errors-by-kind counter family of er.
func kinds(er engine.Errors) want {
	return counter(
		sample{"kind=clock_regression", float64(er.ClockRegression)},
		sample{"kind=closed", float64(er.Closed)},
		sample{"kind=context", float64(er.Context)},
		sample{"kind=invalid_cost", float64(er.InvalidCost)},
		sample{"kind=invalid_key", float64(er.InvalidKey)},
		sample{"kind=key_capacity", float64(er.KeyCapacity)},
		sample{"kind=other", float64(er.Other)},
	)
}

// check compares the scraped families with wants, family by family, and
// finds no family it did not expect.
func check(t *testing.T, mfs map[string]*dto.MetricFamily, wants map[string]want) {
	t.Helper()
	for name, w := range wants {
		typ, got := series(t, mfs, name)
		assert.Equal(t, w.typ, typ, name)
		assert.Equal(t, w.samples, got, name)
	}
	for name := range mfs {
		_, ok := wants[name]
		assert.True(t, ok, "unexpected metric %s", name)
	}
}

// TestCollectKnownSequence: after a known sequence of calls, each metric
// is what the sequence made it and what Stats says. The engine is closed
// before the scrape, so its counts are final and exact.
func TestCollectKnownSequence(t *testing.T) {
	const maxKeys = 2
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 2, 1), Shards: 2, MaxKeys: maxKeys})
	c := newCollector(t, e)
	ctx := context.Background()
	allow := func(ctx context.Context, key string, cost int64, allowed bool, wantErr error) {
		t.Helper()
		d, err := e.Allow(ctx, key, cost)
		require.ErrorIs(t, err, wantErr, "%s cost %d", key, cost)
		require.Equal(t, allowed, d.Allowed, "%s cost %d", key, cost)
	}
	allow(ctx, "a", 1, true, nil)
	allow(ctx, "a", 1, true, nil)
	allow(ctx, "a", 1, false, nil) // empty: denied
	allow(ctx, "b", 2, true, nil)  // the second key of MaxKeys 2
	allow(ctx, "c", 1, false, engine.ErrKeyCapacity)
	allow(ctx, "a", 0, false, engine.ErrInvalidCost) // refused by the caller
	allow(ctx, " ", 1, false, engine.ErrInvalidKey)  // refused by the caller
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	allow(canceled, "a", 1, false, context.Canceled)
	allow(canceled, "b", 1, false, context.Canceled) // two: closed and context counts differ
	_, err := e.Peek(ctx, "a")
	require.NoError(t, err)
	_, err = e.Refund(ctx, "b", 1)
	require.NoError(t, err)
	require.NoError(t, e.ReplacePolicy(ctx, pol(2, 2, 1), 1)) // one cutover, two shards took part
	clk.Advance(2 * time.Second)                              // a and b refill
	n, err := e.EvictFull(ctx)                                // one sweep per shard
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = e.EvictFull(ctx) // a second sweep per shard, which finds nothing full:
	require.NoError(t, err)   // sweeps, evictions and cutovers all differ
	require.Equal(t, 0, n)
	allow(ctx, "c", 1, true, nil) // a slot is free again
	require.NoError(t, e.Close())
	allow(ctx, "c", 1, false, engine.ErrClosed)

	st := e.Stats()
	mfs := scrape(t, c)
	check(t, mfs, fromStats(st, maxKeys))

	// The same reading, spelled from the sequence rather than from Stats.
	_, highWater := series(t, mfs, "tokenshard_mailbox_high_water")
	require.Len(t, highWater, 1)
	assert.GreaterOrEqual(t, highWater[0].value, 1.0, "a shard found a request waiting")
	check(t, mfs, map[string]want{
		"tokenshard_decisions_total": counter(sample{"outcome=allowed", 4}, sample{"outcome=denied", 1}),
		"tokenshard_peeks_total":     counter(one(1)),
		"tokenshard_refunds_total":   counter(one(1)),
		"tokenshard_errors_total": counter(
			sample{"kind=clock_regression", 0}, sample{"kind=closed", 1}, sample{"kind=context", 2},
			sample{"kind=invalid_cost", 1}, sample{"kind=invalid_key", 1}, sample{"kind=key_capacity", 1},
			sample{"kind=other", 0},
		),
		"tokenshard_keys":                  gauge(one(1)),
		"tokenshard_keys_max":              gauge(one(maxKeys)),
		"tokenshard_mailbox_depth":         gauge(one(0)),
		"tokenshard_mailbox_high_water":    gauge(highWater...),
		"tokenshard_shard_cutovers_total":  counter(one(2)),
		"tokenshard_shard_sweeps_total":    counter(one(4)),
		"tokenshard_pressure_sweeps_total": counter(one(0)),
		"tokenshard_sweep_failures_total":  counter(one(0)),
		"tokenshard_evictions_total":       counter(one(2)),
		"tokenshard_events_dropped_total":  counter(one(0)),
		"tokenshard_allowall_calls_total":  counter(sample{"outcome=admitted", 0}, sample{"outcome=refused", 0}),
		"tokenshard_allowall_errors_total": kinds(engine.Errors{}),
		"tokenshard_holds_total":           counter(one(0)),
		"tokenshard_holds_aborted_total":   counter(one(0)),
	})
	// Every call was counted once: 5 decided, 1 peek, 1 refund, 6 errors.
	assert.Equal(t, uint64(13), st.Total.Allowed+st.Total.Denied+st.Total.Peeks+st.Total.Refunds+st.Total.Errors.Sum())
}

// backwardClock reads an hour for its first after readings, then 0: every
// later reading is a regression.
type backwardClock struct {
	n     atomic.Int64
	after int64
}

func (c *backwardClock) Now() int64 {
	if c.n.Add(1) > c.after {
		return 0
	}
	return int64(time.Hour)
}

// TestCollectClockRegressionAndSweepFailures: the families and kinds the
// known sequence leaves at 0 each count what they name: a decision against
// a clock that went back is a clock_regression error, not another kind,
// and the background sweeps it fails are sweep failures, not pressure
// sweeps (which only the real clock runs).
func TestCollectClockRegressionAndSweepFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &backwardClock{after: 1}
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Clock: clk, Shards: 1, SweepEvery: time.Second})
		require.NoError(t, err)
		defer e.Close()
		c := newCollector(t, e)
		ctx := context.Background()
		_, err = e.Allow(ctx, "k", 1) // reading 1: an hour in
		require.NoError(t, err)
		_, err = e.Allow(ctx, "k", 1) // reading 2: back to 0
		require.ErrorIs(t, err, engine.ErrClockRegression)
		for range 3 { // three ticks of the sweeper, each reading 0
			<-time.After(time.Second) // fake time in the bubble
			synctest.Wait()
		}

		wants := fromStats(e.Stats(), e.MaxKeys())
		wants["tokenshard_errors_total"] = kinds(engine.Errors{ClockRegression: 1})
		wants["tokenshard_sweep_failures_total"] = counter(one(3))
		wants["tokenshard_pressure_sweeps_total"] = counter(one(0))
		check(t, scrape(t, c), wants)
	})
}

// TestCollectShardLabels: with WithShardLabels, keys, depth and high water
// come once per shard, each as Stats says, and sum to the engine's; the
// other metrics are unchanged.
func TestCollectShardLabels(t *testing.T) {
	const shards = 4
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: shards})
	ctx := context.Background()
	for i := range 40 {
		_, err := e.Allow(ctx, fmt.Sprintf("k%d", i%20), 1)
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	st := e.Stats()
	mfs := scrape(t, newCollector(t, e, promstats.WithShardLabels()))

	wants := fromStats(st, engine.DefaultMaxKeys)
	perShard := func(v func(engine.ShardStats) int64) []sample {
		var out []sample
		for i, s := range st.Shards {
			out = append(out, sample{"shard=" + strconv.Itoa(i), float64(v(s))})
		}
		return out
	}
	wants["tokenshard_keys"] = gauge(perShard(func(s engine.ShardStats) int64 { return s.Keys })...)
	wants["tokenshard_mailbox_depth"] = gauge(perShard(func(s engine.ShardStats) int64 { return s.MailboxDepth + s.Waiting })...)
	wants["tokenshard_mailbox_high_water"] = gauge(perShard(func(s engine.ShardStats) int64 { return s.MailboxHighWater })...)
	check(t, mfs, wants)

	_, keys := series(t, mfs, "tokenshard_keys")
	require.Len(t, keys, shards)
	sum := 0.0
	for _, s := range keys {
		sum += s.value
	}
	assert.Equal(t, 20.0, sum)
}

// TestLint: promlint finds nothing to report, with and without shard labels.
func TestLint(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: 2})
	for _, opts := range [][]promstats.Option{nil, {promstats.WithShardLabels()}} {
		problems, err := testutil.CollectAndLint(newCollector(t, e, opts...))
		require.NoError(t, err)
		assert.Empty(t, problems)
	}
}

// TestDescribe: Describe sends one descriptor per exported family, and
// Collect sends 32 series without shard labels (two outcomes and seven
// error kinds, for decisions and for AllowAll calls, and fourteen single
// values), and 3 per shard in place of 3 with them.
func TestDescribe(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: 3})
	for _, tc := range []struct {
		opts   []promstats.Option
		series int
	}{{nil, 32}, {[]promstats.Option{promstats.WithShardLabels()}, 32 - 3 + 3*3}} {
		c := newCollector(t, e, tc.opts...)
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		assert.Len(t, ch, 18)
		assert.Equal(t, tc.series, testutil.CollectAndCount(c))
	}
}

// TestNewInvalid: a nil engine or a nil option is ErrInvalidOption; a zero
// Engine is collected as all zeros.
func TestNewInvalid(t *testing.T) {
	_, err := promstats.New(nil)
	require.ErrorIs(t, err, promstats.ErrInvalidOption)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1)})
	_, err = promstats.New(e, promstats.WithShardLabels(), nil)
	require.ErrorIs(t, err, promstats.ErrInvalidOption)

	mfs := scrape(t, newCollector(t, new(engine.Engine)))
	check(t, mfs, fromStats(engine.Stats{}, 0))
}

// TestCollectDuringTraffic: scrapes run while callers are admitted, on two
// registries at once, and the final scrape counts every decision; -race
// finds no unsynchronised access.
func TestCollectDuringTraffic(t *testing.T) {
	const workers, calls = 4, 200
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1<<40, 1), Shards: 4})
	c := newCollector(t, e, promstats.WithShardLabels())
	regs := [2]*prometheus.Registry{prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()}
	for _, r := range regs {
		require.NoError(t, r.Register(c))
	}
	errs := make(chan error, workers+len(regs))
	stop := make(chan struct{})
	var admit, gather sync.WaitGroup
	for w := range workers {
		admit.Go(func() {
			for i := range calls {
				if _, err := e.Allow(context.Background(), fmt.Sprintf("w%d-%d", w, i%10), 1); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for _, r := range regs {
		gather.Go(func() {
			for {
				if _, err := r.Gather(); err != nil {
					errs <- err
					return
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	admit.Wait()
	close(stop)
	gather.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.NoError(t, e.Close())
	mfs := scrape(t, c)
	_, got := series(t, mfs, "tokenshard_decisions_total")
	assert.Equal(t, []sample{{"outcome=allowed", workers * calls}, {"outcome=denied", 0}}, got)
}

// TestCollectAllowAll: AllowAll calls are counted by outcome and error
// kind, and the holds the shards took beside them.
func TestCollectAllowAll(t *testing.T) {
	e, err := engine.New(engine.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Shards: 1, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	defer e.Close()
	ctx := context.Background()
	_, _, err = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 10}, {Key: "b", Cost: 1}})
	require.NoError(t, err)
	_, _, err = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}})
	require.NoError(t, err)
	_, _, err = e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 0}})
	require.ErrorIs(t, err, engine.ErrInvalidCost)
	// The shards publish their counts when they next park: once traffic
	// stops the reading is exact, so wait for it.
	require.Eventually(t, func() bool { return e.Stats().Total.Holds == 2 }, 5*time.Second, time.Millisecond)
	c, err := promstats.New(e)
	require.NoError(t, err)
	mfs := promtest.Scrape(t, c)
	_, calls := series(t, mfs, "tokenshard_allowall_calls_total")
	assert.Equal(t, []sample{{"outcome=admitted", 1}, {"outcome=refused", 1}}, calls)
	_, errs := series(t, mfs, "tokenshard_allowall_errors_total")
	assert.Contains(t, errs, sample{"kind=invalid_cost", 1})
	_, h := series(t, mfs, "tokenshard_holds_total")
	assert.Equal(t, []sample{one(2)}, h, "one shard held for each decided call")
}

// TestCollectDecisionsWithAllowAll: a known sequence mixing Allow and
// AllowAll, scraped through promhttp (and checked by promtool, if
// installed): every request of an AllowAll that
// returned a Decision is a decision, allowed for each when admitted, denied
// for each when refused, beside the singles, and the call itself is counted
// once in allowall_calls_total; a failed AllowAll counts no decision.
func TestCollectDecisionsWithAllowAll(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 2})
	c := newCollector(t, e)
	ctx := context.Background()
	allow := func(key string, cost int64, allowed bool) {
		t.Helper()
		d, err := e.Allow(ctx, key, cost)
		require.NoError(t, err)
		require.Equal(t, allowed, d.Allowed, "%s cost %d", key, cost)
	}
	allowAll := func(allowed bool, reqs ...engine.Request) {
		t.Helper()
		d, _, err := e.AllowAll(ctx, reqs)
		require.NoError(t, err)
		require.Equal(t, allowed, d.Allowed, "%v", reqs)
	}
	allow("user", 3, true)                                                                                                          // user: 7
	allowAll(true, engine.Request{Key: "user", Cost: 2}, engine.Request{Key: "route", Cost: 4}, engine.Request{Key: "ip", Cost: 1}) // user: 5, route: 6, ip: 9
	allowAll(false, engine.Request{Key: "user", Cost: 1}, engine.Request{Key: "route", Cost: 7})                                    // route is short
	allow("route", 6, true)                                                                                                         // route: 0
	allow("route", 1, false)
	allowAll(false, engine.Request{Key: "ip", Cost: 1}, engine.Request{Key: "route", Cost: 1}, engine.Request{Key: "ip", Cost: 1})
	_, _, err := e.AllowAll(ctx, []engine.Request{{Key: "user", Cost: 1}, {Key: "", Cost: 1}})
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	require.NoError(t, e.Close()) // the counts final: every commit carried out

	text := promtest.ScrapeText(t, c)
	promtest.Promtool(t, text)
	mfs := promtest.Parse(t, text)
	check(t, mfs, fromStats(e.Stats(), e.MaxKeys()))
	_, got := series(t, mfs, "tokenshard_decisions_total")
	assert.Equal(t, []sample{{"outcome=allowed", 1 + 3 + 1}, {"outcome=denied", 2 + 1 + 3}}, got)
	_, got = series(t, mfs, "tokenshard_allowall_calls_total")
	assert.Equal(t, []sample{{"outcome=admitted", 1}, {"outcome=refused", 2}}, got)
	_, got = series(t, mfs, "tokenshard_allowall_errors_total")
	assert.Contains(t, got, sample{"kind=invalid_key", 1})
	_, got = series(t, mfs, "tokenshard_errors_total")
	for _, s := range got {
		assert.Zero(t, s.value, "an AllowAll's error is its call's, in allowall_errors_total: %s", s.labels)
	}
}

// TestTwoEnginesOneRegistry: as the package doc says, a second engine's
// Collector registered bare beside a first is refused, and the error names
// the first one's (so reusing it would export the first engine's counts for
// both); each under a label of its own, both register and are scraped apart.
func TestTwoEnginesOneRegistry(t *testing.T) {
	e1, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1)})
	e2, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1)})
	c1, c2 := newCollector(t, e1), newCollector(t, e2)
	bare := prometheus.NewPedanticRegistry()
	require.NoError(t, bare.Register(c1))
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, bare.Register(c2), &are)
	require.Same(t, c1, are.ExistingCollector)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, prometheus.WrapRegistererWith(prometheus.Labels{"limiter": "one"}, reg).Register(c1))
	require.NoError(t, prometheus.WrapRegistererWith(prometheus.Labels{"limiter": "two"}, reg).Register(c2))
	_, err := e2.Allow(t.Context(), "k", 1)
	require.NoError(t, err)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "tokenshard_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "limiter" {
					got[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	require.Equal(t, map[string]float64{"one": 0, "two": 1}, got)
}
