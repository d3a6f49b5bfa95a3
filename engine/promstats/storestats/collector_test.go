package storestats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/engine/promstats/internal/promtest"
	"github.com/tokenshard/tokenshard/engine/promstats/storestats"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// pol builds a policy without field names cluttering every call.
func pol(version, capacity, rate int64) policy.Policy {
	return policy.Policy{Version: version, Capacity: capacity, TokensPerSecond: rate}
}

// newStore builds a store on addr under prefix, on its own client, both
// closed when the test ends. The clock is a Manual one, as redisstore's
// tests use, so decisions do not depend on the server's time.
func newStore(t *testing.T, addr, prefix string, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	t.Cleanup(func() {
		// After the store's Close (cleanups run last first): the keys it
		// wrote, which on a developer's shared server pile up across runs
		// and slow every test that scans the keyspace.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for key := range iter.Vals(ctx) {
			rdb.Del(ctx, key)
		}
	})
	cfg.Client, cfg.Prefix, cfg.Clock = rdb, prefix, clock.NewManual(0)
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second // the race detector slows everything
	}
	s, err := redisstore.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// freshPrefix is a key prefix no other test uses.
func freshPrefix(t *testing.T) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "tstest:storestats:" + hex.EncodeToString(b[:]) + ":"
}

// scrape is promtest.Scrape.
func scrape(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	return promtest.Scrape(t, c)
}

// fromStats is what a Collector exports for a reading of Stats: each
// series a counter, named by its family and its label if it has one.
func fromStats(st redisstore.Stats) map[string]float64 {
	m := map[string]float64{
		`tokenshard_decisions_total{outcome="allowed"}`:          float64(st.Allowed),
		`tokenshard_decisions_total{outcome="denied"}`:           float64(st.Denied),
		`tokenshard_decisions_total{outcome="degraded_allowed"}`: float64(st.DegradedAllowed),
		`tokenshard_decisions_total{outcome="degraded_denied"}`:  float64(st.DegradedDenied),
		"tokenshard_peeks_total":                                 float64(st.Peeks),
		"tokenshard_refunds_total":                               float64(st.Refunds),
		`tokenshard_allowall_calls_total{outcome="admitted"}`:    float64(st.AllowAll.Admitted),
		`tokenshard_allowall_calls_total{outcome="refused"}`:     float64(st.AllowAll.Refused),
		"tokenshard_store_decisions_total":                       float64(st.Decisions),
		"tokenshard_store_retries_total":                         float64(st.Retries),
		"tokenshard_store_local_decisions_total":                 float64(st.Local),
		"tokenshard_store_leased_tokens_total":                   float64(st.LeasedTokens),
		"tokenshard_store_returned_tokens_total":                 float64(st.ReturnedTokens),
		"tokenshard_store_forfeited_tokens_total":                float64(st.ForfeitedTokens),
	}
	kinds(m, "tokenshard_errors_total", st.Errors)
	kinds(m, "tokenshard_allowall_errors_total", st.AllowAll.Errors)
	return m
}

// kinds adds family's series, one per error kind, of er to m.
func kinds(m map[string]float64, family string, er engine.Errors) {
	for kind, n := range map[string]uint64{
		"invalid_key": er.InvalidKey, "invalid_cost": er.InvalidCost, "closed": er.Closed, "context": er.Context,
		"clock_regression": er.ClockRegression, "key_capacity": er.KeyCapacity, "other": er.Other,
	} {
		m[family+`{kind="`+kind+`"}`] = float64(n)
	}
}

// check compares the scraped series with want: every one a counter, with
// help, and no other series.
func check(t *testing.T, mfs map[string]*dto.MetricFamily, want map[string]float64) {
	t.Helper()
	got := make(map[string]float64, len(mfs))
	for name, mf := range mfs {
		require.Equal(t, dto.MetricType_COUNTER, mf.GetType(), name)
		assert.NotEmpty(t, mf.GetHelp(), name)
		for _, m := range mf.GetMetric() {
			series := name
			for _, l := range m.GetLabel() {
				series += "{" + l.GetName() + `="` + l.GetValue() + `"}`
			}
			got[series] = m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, want, got)
}

// TestCollectRealStore: after decisions, a retry and failures on a real
// Redis, each metric is what Stats says and what the sequence made it.
//
// Store a decides; store b, on the same prefix, replaces the policy, so a's
// next call finds its version stale and repeats its script call (at
// least one retry); then the private server is killed, and a's next calls are
// answered by the fail-closed rule (one failure per request).
func TestCollectRealStore(t *testing.T) {
	srv := redistest.Start(t) // private: this test kills it
	p := freshPrefix(t)
	a := newStore(t, srv.Addr(), p, redisstore.Config{Policy: pol(1, 2, 1), Timeout: time.Second})
	b := newStore(t, srv.Addr(), p, redisstore.Config{Policy: pol(1, 2, 1)})
	c, err := storestats.New(a)
	require.NoError(t, err)
	ctx := context.Background()

	check(t, scrape(t, c), fromStats(redisstore.Stats{})) // all 0 from the start

	for i, allowed := range []bool{true, true, false} {
		d, err := a.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, allowed, d.Allowed, "call %d", i)
	}
	require.NoError(t, b.ReplacePolicy(ctx, pol(2, 5, 1), 1))
	d, err := a.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version, "a saw b's cutover")
	require.False(t, d.Allowed, "k keeps its empty bucket: no time passes")
	// At least one repeat for the stale version; how many more (k's bucket
	// also needs version 1's history) is the store's business.
	mid := a.Stats()
	require.Equal(t, uint64(4), mid.Decisions)
	require.Zero(t, mid.Failures)
	require.GreaterOrEqual(t, mid.Retries, uint64(1))
	check(t, scrape(t, c), fromStats(mid))

	srv.Kill()
	for range 2 {
		d, err := a.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, d.Allowed, "fail closed: %+v", d)
	}
	st := a.Stats()
	require.Equal(t, redisstore.Stats{Allowed: 2, Denied: 2, Decisions: 4, Failures: 2, DegradedDenied: 2, Retries: mid.Retries}, st)
	mfs := scrape(t, c) // Redis is down: the scrape does not need it
	check(t, mfs, fromStats(st))
	want := fromStats(redisstore.Stats{})
	want[`tokenshard_decisions_total{outcome="allowed"}`] = 2
	want[`tokenshard_decisions_total{outcome="denied"}`] = 2
	want[`tokenshard_decisions_total{outcome="degraded_denied"}`] = 2
	want["tokenshard_store_decisions_total"] = 4
	want["tokenshard_store_retries_total"] = float64(mid.Retries)
	check(t, mfs, want)
	t.Logf("scraped after the outage: %+v", st)
}

// TestLint: promlint finds nothing to report, and Collect sends the twelve
// families Describe announces, in 28 series.
func TestLint(t *testing.T) {
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: pol(1, 2, 1)})
	c, err := storestats.New(s)
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)

	ch := make(chan *prometheus.Desc, 12)
	c.Describe(ch)
	close(ch)
	assert.Len(t, ch, 12)
	assert.Equal(t, 4+1+1+7+2+7+1+1+4, testutil.CollectAndCount(c))
}

// TestNewNil: a nil store is promstats.ErrInvalidOption.
func TestNewNil(t *testing.T) {
	c, err := storestats.New(nil)
	require.ErrorIs(t, err, promstats.ErrInvalidOption)
	require.Nil(t, c)
}

// TestBesideEngineCollector: a store's Collector and an engine's
// (promstats) export the shared families under the same descriptors, so a
// pedantic registry refuses the second as a duplicate, and takes both
// under a label that tells them apart: one family each, a series per
// backend, the store's own families beside them.
func TestBesideEngineCollector(t *testing.T) {
	e, err := engine.New(engine.Config{Policy: pol(1, 2, 1), Clock: clock.NewManual(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	ec, err := promstats.New(e)
	require.NoError(t, err)
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: pol(1, 2, 1)})
	sc, err := storestats.New(s)
	require.NoError(t, err)

	plain := prometheus.NewPedanticRegistry()
	require.NoError(t, plain.Register(ec))
	require.Error(t, plain.Register(sc), "the same names, undistinguished")

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, prometheus.WrapRegistererWith(prometheus.Labels{"backend": "engine"}, reg).Register(ec))
	require.NoError(t, prometheus.WrapRegistererWith(prometheus.Labels{"backend": "redis"}, reg).Register(sc))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	backends := map[string]map[string]bool{} // family: its backends
	for _, mf := range mfs {
		backends[mf.GetName()] = map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" {
					backends[mf.GetName()][l.GetValue()] = true
				}
			}
		}
	}
	both := map[string]bool{"engine": true, "redis": true}
	for _, name := range []string{"tokenshard_decisions_total", "tokenshard_peeks_total", "tokenshard_refunds_total",
		"tokenshard_errors_total", "tokenshard_allowall_calls_total", "tokenshard_allowall_errors_total"} {
		assert.Equal(t, both, backends[name], name)
	}
	for _, name := range []string{"tokenshard_store_decisions_total", "tokenshard_store_retries_total"} {
		assert.Equal(t, map[string]bool{"redis": true}, backends[name], name)
	}
}

// TestCollectDegradedOpen: a fail-open store started with no server
// listening admits by its failure rule, and the scrape counts those
// answers as decisions degraded_allowed, none as decided by Redis.
func TestCollectDegradedOpen(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill() // nothing listens on its port
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: rdb, Prefix: freshPrefix(t), Policy: pol(1, 2, 1), FailOpen: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	c, err := storestats.New(s)
	require.NoError(t, err)
	for range 3 {
		d, err := s.Allow(context.Background(), "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed && d.Degraded, "%+v", d)
	}
	want := fromStats(redisstore.Stats{})
	want[`tokenshard_decisions_total{outcome="degraded_allowed"}`] = 3
	check(t, scrape(t, c), want)
}

// TestSameCountsAsEngine: one known sequence mixing Allow and AllowAll, run
// on a real store and on an engine, each scraped through promhttp (and
// checked by promtool, if installed): the decision counters equal the
// sequence exactly, each request of an AllowAll counted with its call's
// outcome, and every family the two Collectors share holds the same series
// on both backends.
func TestSameCountsAsEngine(t *testing.T) {
	p := pol(1, 10, 1)
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: p})
	e, err := engine.New(engine.Config{Policy: p, Shards: 2, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	sc, err := storestats.New(s)
	require.NoError(t, err)
	ec, err := promstats.New(e)
	require.NoError(t, err)

	ctx := context.Background()
	for _, a := range []engine.Admitter{s, e} {
		allow := func(key string, cost int64, allowed bool) {
			t.Helper()
			d, err := a.Allow(ctx, key, cost)
			require.NoError(t, err)
			require.Equal(t, allowed, d.Allowed, "%T: %s cost %d", a, key, cost)
		}
		allowAll := func(allowed bool, reqs ...engine.Request) {
			t.Helper()
			d, _, err := a.AllowAll(ctx, reqs)
			require.NoError(t, err)
			require.Equal(t, allowed, d.Allowed, "%T: %v", a, reqs)
		}
		allow("user", 3, true)                                                                                                          // user: 7
		allowAll(true, engine.Request{Key: "user", Cost: 2}, engine.Request{Key: "route", Cost: 4}, engine.Request{Key: "ip", Cost: 1}) // user: 5, route: 6, ip: 9
		allowAll(false, engine.Request{Key: "user", Cost: 1}, engine.Request{Key: "route", Cost: 7})                                    // route is short
		allow("route", 6, true)                                                                                                         // route: 0
		allow("route", 1, false)
		allowAll(false, engine.Request{Key: "ip", Cost: 1}, engine.Request{Key: "route", Cost: 1}, engine.Request{Key: "ip", Cost: 1})
		_, _, err := a.AllowAll(ctx, []engine.Request{{Key: "user", Cost: 1}, {Key: "", Cost: 1}})
		require.ErrorIs(t, err, engine.ErrInvalidKey)
		_, err = a.Allow(ctx, "user", 0)
		require.ErrorIs(t, err, engine.ErrInvalidCost)
		// One peek and two refunds: counts that differ, so neither family
		// can be read from the other's counter unnoticed.
		_, err = a.(interface {
			Peek(context.Context, string) (engine.Decision, error)
		}).Peek(ctx, "user")
		require.NoError(t, err)
		for range 2 {
			_, err = a.Refund(ctx, "route", 1)
			require.NoError(t, err)
		}
	}
	require.NoError(t, e.Close()) // the engine's counts final: every commit carried out

	text := promtest.ScrapeText(t, sc)
	promtest.Promtool(t, text)
	store := promtest.Parse(t, text)
	want := fromStats(redisstore.Stats{})
	want[`tokenshard_decisions_total{outcome="allowed"}`] = 1 + 3 + 1
	want[`tokenshard_decisions_total{outcome="denied"}`] = 2 + 1 + 3
	want[`tokenshard_allowall_calls_total{outcome="admitted"}`] = 1
	want[`tokenshard_allowall_calls_total{outcome="refused"}`] = 2
	want[`tokenshard_allowall_errors_total{kind="invalid_key"}`] = 1
	want[`tokenshard_errors_total{kind="invalid_cost"}`] = 1
	want["tokenshard_peeks_total"] = 1
	want["tokenshard_refunds_total"] = 2
	want["tokenshard_store_decisions_total"] = 3 + 3 + 2 + 3
	// A script call is repeated when it met a newer policy or a bucket's
	// history, which depends on timing, not on this sequence: the series
	// must say what Stats says.
	want["tokenshard_store_retries_total"] = float64(s.Stats().Retries)
	check(t, store, want)

	engineText := promtest.ScrapeText(t, ec)
	promtest.Promtool(t, engineText)
	eng := promtest.Parse(t, engineText)
	for _, name := range []string{"tokenshard_decisions_total", "tokenshard_peeks_total", "tokenshard_refunds_total",
		"tokenshard_errors_total", "tokenshard_allowall_calls_total", "tokenshard_allowall_errors_total"} {
		require.Contains(t, eng, name)
		assert.Equal(t, store[name].GetHelp(), eng[name].GetHelp(), name)
		assert.Equal(t, store[name].GetType(), eng[name].GetType(), name)
		got := map[string]float64{}
		for _, m := range store[name].GetMetric() {
			got[m.String()] = m.GetCounter().GetValue()
		}
		for _, m := range eng[name].GetMetric() {
			if v, ok := got[m.String()]; ok {
				assert.Equal(t, v, m.GetCounter().GetValue(), "%s %s", name, m)
				delete(got, m.String())
				continue
			}
			t.Errorf("%s: the engine's series %s is not the store's", name, m)
		}
		for m, v := range got { // the store's only: its failure rule's outcomes, unused here
			assert.Zero(t, v, "%s: the store's series %s", name, m)
		}
	}
}

// TestCollectLeases: a leased store's lease counters are exported as Stats
// says, and what they count happened: requests decided in the process,
// tokens leased, and on Close the unspent ones given back.
func TestCollectLeases(t *testing.T) {
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: pol(1, 1000, 1), Leases: &redisstore.Leases{}})
	c, err := storestats.New(s)
	require.NoError(t, err)
	ctx := context.Background()
	for range 200 {
		d, err := s.Allow(ctx, "hot", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, s.Close()) // gives the lease back
	st := s.Stats()
	require.Positive(t, st.Local, "some requests decided from a lease")
	require.Positive(t, st.LeasedTokens)
	require.Positive(t, st.ReturnedTokens, "the unspent lease given back at Close")
	check(t, scrape(t, c), fromStats(st))
}
