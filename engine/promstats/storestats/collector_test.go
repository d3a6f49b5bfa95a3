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
	return map[string]float64{
		"tokenshard_store_decisions_total":                   float64(st.Decisions),
		"tokenshard_store_failures_total":                    float64(st.Failures),
		`tokenshard_store_degraded_total{outcome="allowed"}`: float64(st.DegradedAllowed),
		`tokenshard_store_degraded_total{outcome="denied"}`:  float64(st.DegradedDenied),
		"tokenshard_store_retries_total":                     float64(st.Retries),
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
	require.Equal(t, redisstore.Stats{Decisions: 4, Failures: 2, DegradedDenied: 2, Retries: mid.Retries}, st)
	mfs := scrape(t, c) // Redis is down: the scrape does not need it
	check(t, mfs, fromStats(st))
	check(t, mfs, map[string]float64{
		"tokenshard_store_decisions_total":                   4,
		"tokenshard_store_failures_total":                    2,
		`tokenshard_store_degraded_total{outcome="allowed"}`: 0,
		`tokenshard_store_degraded_total{outcome="denied"}`:  2,
		"tokenshard_store_retries_total":                     float64(mid.Retries),
	})
	t.Logf("scraped after the outage: %+v", st)
}

// TestLint: promlint finds nothing to report, and Collect sends the four
// families Describe announces, in five series.
func TestLint(t *testing.T) {
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: pol(1, 2, 1)})
	c, err := storestats.New(s)
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)

	ch := make(chan *prometheus.Desc, 8)
	c.Describe(ch)
	close(ch)
	assert.Len(t, ch, 4)
	assert.Equal(t, 5, testutil.CollectAndCount(c))
}

// TestNewNil: a nil store is promstats.ErrInvalidOption.
func TestNewNil(t *testing.T) {
	c, err := storestats.New(nil)
	require.ErrorIs(t, err, promstats.ErrInvalidOption)
	require.Nil(t, c)
}

// TestBesideEngineCollector: a store's Collector and an engine's
// (promstats) share a pedantic registry without a clash of names.
func TestBesideEngineCollector(t *testing.T) {
	e, err := engine.New(engine.Config{Policy: pol(1, 2, 1), Clock: clock.NewManual(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	ec, err := promstats.New(e)
	require.NoError(t, err)
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: pol(1, 2, 1)})
	sc, err := storestats.New(s)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(ec))
	require.NoError(t, reg.Register(sc))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := make(map[string]bool, len(mfs))
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, name := range []string{"tokenshard_store_decisions_total", "tokenshard_store_failures_total",
		"tokenshard_store_degraded_total", "tokenshard_store_retries_total"} {
		assert.True(t, names[name], name)
	}
	assert.True(t, names["tokenshard_decisions_total"])
}

// TestCollectDegradedOpen: a fail-open store started with no server
// listening admits by its failure rule, and the scrape counts those
// answers as degraded allowed (and failures), none as decided by Redis.
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
	check(t, scrape(t, c), map[string]float64{
		"tokenshard_store_decisions_total":                   0,
		"tokenshard_store_failures_total":                    3,
		`tokenshard_store_degraded_total{outcome="allowed"}`: 3,
		`tokenshard_store_degraded_total{outcome="denied"}`:  0,
		"tokenshard_store_retries_total":                     0,
	})
}
